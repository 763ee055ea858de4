#!/usr/bin/env bash
# Everything hmoe checks on the H200 in one go: build (unless a carried build/ runs here), every GPU
# test, `hmoe check` over the presets, SASS checks, a short benchmark; a compact table last.
# Usage: scripts/device-check.sh [--full-bench]   (full logs go to $OUT when set)
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
out=${OUT:-/tmp/hmoe-device-check}
mkdir -p "$out"
full_bench=0
[ "${1:-}" = "--full-bench" ] && full_bench=1
summary=()
note() { summary+=("$1"); }

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv,noheader | tee "$out/gpu.txt"

# ---- Build: reuse a carried build/ when its binaries start here, else build with all cores.
bin=build
if ! "$bin/hmoe" --help >/dev/null 2>&1; then
  bin=build-device
  start=$(date +%s)
  cmake -S . -B "$bin" -G Ninja -DCMAKE_BUILD_TYPE=Release >"$out/build.log" 2>&1 &&
    cmake --build "$bin" -j "$(nproc)" >>"$out/build.log" 2>&1 || { tail -40 "$out/build.log"; echo "BUILD FAILED"; exit 1; }
  note "build      | built on device in $(( $(date +%s) - start )) s"
else
  note "build      | carried build/ runs here"
fi

# ---- GPU tests (CTest files hold this machine's paths only when built here: run the binary).
timeout 420 "$bin/hmoe_gpu_tests" --gtest_color=no >"$out/gpu_tests.log" 2>&1
rc=$?
note "gpu tests  | $(grep -E '^\[  PASSED  \]|^\[  FAILED  \]|^\[  SKIPPED \] [0-9]' "$out/gpu_tests.log" | tr '\n' ' ') (exit $rc)"
grep -E '^\[  FAILED  \]' "$out/gpu_tests.log" | head -20

# ---- hmoe check: every preset at the acceptance token counts, plus skewed and extreme routing.
check_log="$out/check.log"
: >"$check_log"
for preset in qwen3-30b-a3b deepseek-v3-tp8 olmoe-1b-7b qwen3-235b-a22b-tp4 mixtral-8x7b; do
  timeout 120 "$bin/hmoe" check --model "$preset" --tokens 1,7,64,1000,8192 >>"$check_log" 2>&1
  timeout 60 "$bin/hmoe" check --model "$preset" --tokens 7,1000 --routing extreme >>"$check_log" 2>&1
  timeout 60 "$bin/hmoe" check --model "$preset" --tokens 64 --routing zipf --entry topk >>"$check_log" 2>&1
done
passes=$(grep -c PASS "$check_log"); fails=$(grep -c FAIL "$check_log")
worst=$(grep -oE 'rel[_ ]err[a-z]*[ =:]+[0-9.eE+-]+' "$check_log" | grep -oE '[0-9.]+[eE][+-]?[0-9]+|[0-9]+\.[0-9]+$' | sort -g | tail -1)
note "hmoe check | $passes PASS, $fails FAIL, worst rel error ${worst:-?}"
grep FAIL "$check_log" | head -10

# ---- SASS: wgmma present, no local-memory traffic in the GEMM kernels.
if command -v cuobjdump >/dev/null; then
  cuobjdump --dump-sass "$bin/hmoe" >"$out/sass.txt" 2>/dev/null
  note "sass       | HGMMA $(grep -c HGMMA "$out/sass.txt"), UTMALDG $(grep -c UTMALDG "$out/sass.txt"), LDL/STL $(grep -cE '\b(LDL|STL)\b' "$out/sass.txt")"
fi

# ---- Benchmark.
if [ $full_bench = 1 ]; then tokens=1,2,4,8,16,32,64,128,256,512,1024,2048,4096,8192,16384; else tokens=1,16,256,4096; fi
timeout 180 "$bin/hmoe" bench --model qwen3-30b-a3b --tokens "$tokens" >"$out/bench.log" 2>&1
note "bench      | see table above (exit $?)"

echo
cat "$out/bench.log"
echo
echo "==== device-check summary ($(date -u +%FT%TZ)) ===="
printf '%s\n' "${summary[@]}"
