#!/usr/bin/env bash
# Installs the pinned third-party headers hmoe builds against into .deps/ (ignored by git).
# CUTLASS/CuTe come from the PyPI wheel nvidia-cutlass==4.2.0.0; only its include/ tree is kept.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
version=4.2.0.0
sha256=f9599ada45c7bcb6bf53f7d3f0a7d154183e53451c01bfa59eecd37dd4a693f6
dest="$root/.deps/cutlass-$version"
if [ -f "$dest/include/cute/tensor.hpp" ]; then
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "setup: fetching nvidia-cutlass==$version headers from PyPI"
python3 -m pip download --quiet --no-deps --only-binary=:all: "nvidia-cutlass==$version" -d "$tmp"
wheel=$(ls "$tmp"/nvidia_cutlass-"$version"-*.whl)
echo "$sha256  $wheel" | sha256sum --check --quiet
python3 - "$wheel" "$tmp/x" <<'PY'
import sys, zipfile
prefix = "cutlass_library/source/include/"
with zipfile.ZipFile(sys.argv[1]) as wheel:
    members = [m for m in wheel.namelist() if m.startswith(prefix)]
    wheel.extractall(sys.argv[2], members)
PY
mkdir -p "$root/.deps"
rm -rf "$dest"
mv "$tmp/x/cutlass_library/source" "$dest"
echo "setup: CUTLASS $version headers in $dest/include"
