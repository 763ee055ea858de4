#!/usr/bin/env bash
# The Python package on the H200 (no network): builds hmoe._ext with the image's scikit-build-core
# and nanobind into build-py/, runs tests/python, builds the `hmoe` CLI in the same build tree (the
# kernel objects are shared), and compares hmoe.torch with `hmoe bench`; a compact table last.
# Needs .deps/ (CUTLASS headers; carry it, or run scripts/setup-deps.sh where there is network).
# Usage: scripts/python-h200.sh [--tokens 1,64,4096]   (full logs go to $OUT when set)
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
out=${OUT:-/tmp/hmoe-python-h200}
mkdir -p "$out"
tokens=1,64,4096
[ "${1:-}" = "--tokens" ] && tokens=$2
python=${PYTHON:-python3}
summary=()
note() { summary+=("$1"); }

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
"$python" -c 'import sys, torch, nanobind, scikit_build_core as s; print("python", sys.version.split()[0], "torch", torch.__version__, "nanobind", nanobind.__version__, "scikit-build-core", s.__version__)'
if [ ! -f .deps/cutlass-4.2.0.0/include/cute/tensor.hpp ]; then
  echo "python-h200: .deps/cutlass-4.2.0.0 is missing and this machine has no network: carry .deps"
  exit 1
fi

# ---- Build: the wheel's contents go to build-py/site (on PYTHONPATH below; the image's site-packages
# stay untouched), the CMake tree to build-py/ so a second run and the CLI reuse its objects.
start=$(date +%s)
export CMAKE_BUILD_PARALLEL_LEVEL=$(nproc)
rm -rf build-py/site
"$python" -m pip install --no-build-isolation --no-deps --target build-py/site -Cbuild-dir=build-py . \
  >"$out/pip.log" 2>&1 || { tail -40 "$out/pip.log"; echo "PIP INSTALL FAILED"; exit 1; }
note "build      | pip install (extension + library) in $(( $(date +%s) - start )) s"
export PYTHONPATH="$root/build-py/site${PYTHONPATH:+:$PYTHONPATH}"
"$python" -c 'import hmoe, hmoe.torch; print("import hmoe", hmoe.__version__, "ok;", len(hmoe.compiled_kernels()), "kernels")'

# ---- Tests
timeout 420 "$python" -m pytest tests/python -q -rs -p no:cacheprovider >"$out/pytest.log" 2>&1
rc=$?
note "pytest     | $(tail -1 "$out/pytest.log") (exit $rc)"
grep -E "^(FAILED|ERROR)" "$out/pytest.log" | head -20
grep -E "rel error" "$out/pytest.log" | head -3

# ---- The C++ benchmark (same build tree) and the Python layer's overhead
# A carried build/hmoe when it starts here, else the CLI from the same build tree.
hmoe_cli=build/hmoe
if ! "$hmoe_cli" --help >/dev/null 2>&1; then
  start=$(date +%s)
  cmake --build build-py --target hmoe >"$out/cli-build.log" 2>&1 || { tail -20 "$out/cli-build.log"; echo "CLI BUILD FAILED"; }
  hmoe_cli=$(find build-py -name hmoe -type f -perm -u+x | head -1)
  note "cli        | ${hmoe_cli:-hmoe} built in $(( $(date +%s) - start )) s"
fi
timeout 120 "$hmoe_cli" bench --model qwen3-30b-a3b --tokens "$tokens" >"$out/hmoe_bench.log" 2>&1
note "hmoe bench | exit $? (log in $out/hmoe_bench.log)"
timeout 240 "$python" tests/python/bench_overhead.py --tokens "$tokens" --hmoe-bench "$out/hmoe_bench.log" \
  >"$out/bench_overhead.log" 2>&1
note "overhead   | exit $?"

echo
cat "$out/hmoe_bench.log"
echo
cat "$out/bench_overhead.log"
echo
# The device tool returns at most 8 files: every log in one archive.
tar -czf "$out/python-logs.tgz" -C "$out" --exclude python-logs.tgz . 2>/dev/null
echo "==== python-h200 summary ($(date -u +%FT%TZ)) ===="
printf '%s\n' "${summary[@]}"
