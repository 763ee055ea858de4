#!/usr/bin/env bash
# Installs the pinned third-party files hmoe builds and tests with into .deps/ (ignored by git), from PyPI:
# - CUTLASS/CuTe headers, from the wheel nvidia-cutlass==4.2.0.0 (only its include/ tree is kept);
# - cuobjdump, from the wheel nvidia-cuda-cuobjdump==13.5.37, for the CPU test that reads the compiled kernels
#   out of the binary (KernelList.BinaryHoldsEveryVariantAsSassAndNoPtx) where the CUDA toolkit has none. It is a
#   test tool: if it cannot be fetched, setup says so and goes on, and that test skips, naming the reason.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

# fetch PACKAGE VERSION SHA256 DIR: downloads the pinned wheel into DIR and checks it; prints its path.
# (Each step returns on failure itself: `set -e` does not act inside a function called from an `if`.)
fetch() {
  python3 -m pip download --quiet --no-deps --only-binary=:all: "$1==$2" -d "$4" >&2 || return 1
  local wheel
  wheel=$(ls "$4"/"${1//-/_}"-"$2"-*.whl) || return 1
  echo "$3  $wheel" | sha256sum --check --quiet >&2 || return 1
  echo "$wheel"
}

cutlass_version=4.2.0.0
cutlass_sha256=f9599ada45c7bcb6bf53f7d3f0a7d154183e53451c01bfa59eecd37dd4a693f6
cutlass_dest="$root/.deps/cutlass-$cutlass_version"
if [ ! -f "$cutlass_dest/include/cute/tensor.hpp" ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  echo "setup: fetching nvidia-cutlass==$cutlass_version headers from PyPI"
  wheel=$(fetch nvidia-cutlass "$cutlass_version" "$cutlass_sha256" "$tmp")
  python3 - "$wheel" "$tmp/x" <<'PY'
import sys, zipfile
prefix = "cutlass_library/source/include/"
with zipfile.ZipFile(sys.argv[1]) as wheel:
    members = [m for m in wheel.namelist() if m.startswith(prefix)]
    wheel.extractall(sys.argv[2], members)
PY
  mkdir -p "$root/.deps"
  rm -rf "$cutlass_dest"
  mv "$tmp/x/cutlass_library/source" "$cutlass_dest"
  echo "setup: CUTLASS $cutlass_version headers in $cutlass_dest/include"
fi

# The toolkit's own cuobjdump, where it has one, is what CMake finds first.
cuobjdump_version=13.5.37
cuobjdump_sha256=38780fee50863252a0b8926357faa91615ca1c8346490563f33a06100cd73f58
cuobjdump_dest="$root/.deps/cuobjdump-$cuobjdump_version/bin"
if [ ! -x "$cuobjdump_dest/cuobjdump" ]; then
  tmp2=$(mktemp -d)
  echo "setup: fetching nvidia-cuda-cuobjdump==$cuobjdump_version from PyPI (a test tool)"
  if wheel=$(fetch nvidia-cuda-cuobjdump "$cuobjdump_version" "$cuobjdump_sha256" "$tmp2") &&
     python3 - "$wheel" "$tmp2/cuobjdump" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as wheel:
    data = wheel.read("nvidia/cu13/bin/cuobjdump")
with open(sys.argv[2], "wb") as out:
    out.write(data)
PY
  then
    mkdir -p "$cuobjdump_dest"
    chmod 755 "$tmp2/cuobjdump"
    mv "$tmp2/cuobjdump" "$cuobjdump_dest/cuobjdump"
    echo "setup: cuobjdump $cuobjdump_version in $cuobjdump_dest"
  else
    echo "setup: WARNING: could not fetch nvidia-cuda-cuobjdump==$cuobjdump_version; the test that lists the" \
         "binary's kernels will skip" >&2
  fi
  rm -rf "$tmp2"
fi
