#!/usr/bin/env bash
# Tunes presets (bf16 by default, FP8 schemes on request) on this GPU into tuned/, then reports what tuning gained (tuned vs
# analytic rule vs best single variant, geometric mean over the sweep), cold start and first-call
# latency, and host overhead; a compact table last. About 15-25 s a table on an H200 (docs/PERF.md,
# thirteenth session), after the build.
# Usage: scripts/tune-h200.sh   (with $OUT set, on any exit: $OUT/tuned.tgz holds the tables, finished
# and interrupted (*.partial, to resume from), $OUT/tune-logs.tgz every log (and each table's timed points,
# tune-PRESET-DTYPE.points.json), $OUT/summary.txt the table.
# Only three files: the device tool returns at most 8 from $OUT, and table names hold '=' and ',',
# which it does not return one by one.)
# Environment: HMOE_TUNE_PRESETS (default: the five presets), HMOE_TUNE_DTYPES (default "bf16"; any of
# bf16 fp8-tensor fp8-channel fp8-block), HMOE_TUNE_TABLES (instead of those two: "preset:dtype ...",
# tuned in that order), HMOE_TUNE_ONLY=1 (tables and the tuned-vs-analytic recheck only: no cold
# start, first-call or host-overhead steps), HMOE_TUNE_SKIP_TESTS=1 (no dispatcher GPU tests first),
# HMOE_TUNE_BUDGET_S (seconds for the whole script: each tune's timeout is cut to what is left, a
# table that would start with less than 60 s left is skipped and said so; an interrupted tune leaves
# its .partial in tuned.tgz, and a rerun with that file in tuned/ resumes it).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
dest=${OUT:-/tmp/hmoe-tune-h200}
out=$(mktemp -d /tmp/hmoe-tune-h200-logs.XXXXXX)
mkdir -p "$dest"
presets=${HMOE_TUNE_PRESETS:-"qwen3-30b-a3b deepseek-v3-tp8 olmoe-1b-7b qwen3-235b-a22b-tp4 mixtral-8x7b"}
dtypes=${HMOE_TUNE_DTYPES:-bf16}
summary=()
note() { summary+=("$1"); }
start_all=$(date +%s)
started=$start_all
budget=${HMOE_TUNE_BUDGET_S:-100000}
left() { echo $(( budget - ($(date +%s) - started) )); }
# True, and said in the summary, when a step (about a minute or more) no longer fits the budget.
out_of_time() { [ "$(left)" -ge 60 ] && return 1; note "$1: skipped, $(left) s of the ${budget} s budget left"; }
tables=${HMOE_TUNE_TABLES:-}
if [ -z "$tables" ]; then
  for dtype in $dtypes; do for preset in $presets; do tables="$tables $preset:$dtype"; done; done
fi
finish() {
  tar -czf "$dest/tuned.tgz" $(ls tuned/*.json tuned/*.partial 2>/dev/null) 2>/dev/null
  tar -czf "$dest/tune-logs.tgz" -C "$out" . 2>/dev/null
  echo
  echo "==== tune-h200 summary ($(date -u +%FT%TZ), $(( $(date +%s) - start_all )) s after the build) ====" | tee "$dest/summary.txt"
  printf '%s\n' "${summary[@]}" | tee -a "$dest/summary.txt"
}
trap finish EXIT

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$out/gpu.txt"

# ---- Build: reuse a carried build/ when its binaries start here, else build with all cores.
bin=build
if ! "$bin/hmoe" --help >/dev/null 2>&1; then
  bin=build-device
  start=$(date +%s)
  cmake -S . -B "$bin" -G Ninja -DCMAKE_BUILD_TYPE=Release >"$out/build.log" 2>&1 &&
    cmake --build "$bin" -j "$(nproc)" >>"$out/build.log" 2>&1 || { tail -40 "$out/build.log"; echo "BUILD FAILED"; exit 1; }
  note "build        | built on device in $(( $(date +%s) - start )) s"
  start_all=$(date +%s)
fi
hmoe="$bin/hmoe"

# ---- Dispatcher GPU tests: empty tuned dir -> analytic rule, a tuned table is used, every pair correct.
: >"$out/dispatch_tests.log"
if [ "${HMOE_TUNE_SKIP_TESTS:-0}" = 1 ]; then
  note "gpu tests    | skipped (HMOE_TUNE_SKIP_TESTS=1)"
else
  timeout 180 "$bin/hmoe_gpu_tests" --gtest_filter='DispatchGpu.*' --gtest_color=no >"$out/dispatch_tests.log" 2>&1
  rc=$?
  note "gpu tests    | DispatchGpu.*: $(grep -E '^\[  PASSED  \]|^\[  FAILED  \]' "$out/dispatch_tests.log" | tr '\n' ' ')(exit $rc)"
fi

# ---- Tune every table into tuned/ (resumable: rerunning picks up *.partial files).
for table in $tables; do
  preset=${table%%:*}; dtype=${table#*:}
  out_of_time "tune         | $preset $dtype" && continue
  limit=$(( $(left) - 10 )); [ "$limit" -gt 600 ] && limit=600
  start=$(date +%s)
  log="$out/tune-$preset-$dtype"
  timeout "$limit" "$hmoe" tune --model "$preset" --dtype "$dtype" --out tuned --points "$log.points.json" \
    >"$log.log" 2>"$log.err"
  rc=$?
  line=$(grep '^summary:' "$log.log" | sed 's/^summary: //')
  [ $rc = 124 ] && line="STOPPED by its ${limit} s timeout (tuned/*.partial keeps its points)"
  note "tune         | $preset $dtype: ${line:-FAILED (exit $rc, see $(basename "$log").err)} [$(( $(date +%s) - start )) s]"
  # The buckets whose close call went to a final (hmoe tune's "T=... final:" lines, docs/DISPATCH.md).
  while read -r final; do note "  final      | $preset $dtype $final"; done < <(grep '^T=[0-9]* final:' "$log.log")
done
note "tables       | $(ls tuned/*.json 2>/dev/null | wc -l) in tuned/ (all of them go back in \$OUT/tuned.tgz)"

# ---- Independent check, fresh measurements: tuned table vs analytic rule (empty HMOE_TUNED_DIR).
# (the dtypes tuned for qwen3-30b-a3b; ~20 s each)
recheck_dtypes=$(for table in $tables; do [ "${table%%:*}" = qwen3-30b-a3b ] && echo "${table#*:}"; done)
empty=$(mktemp -d)
for dtype in $recheck_dtypes; do
  preset=qwen3-30b-a3b
  out_of_time "bench recheck| $preset $dtype" && continue
  "$hmoe" bench --model "$preset" --dtype "$dtype" --explain >"$out/explain-$preset-$dtype.log" 2>&1
  timeout 60 "$hmoe" bench --model "$preset" --dtype "$dtype" --tokens 1,16,256,4096 >"$out/bench-tuned-$preset-$dtype.log" 2>&1
  HMOE_TUNED_DIR=$empty timeout 60 "$hmoe" bench --model "$preset" --dtype "$dtype" --tokens 1,16,256,4096 \
    >"$out/bench-analytic-$preset-$dtype.log" 2>&1
  ratio=$(paste <(grep -E '^ +[0-9]+ ' "$out/bench-analytic-$preset-$dtype.log" | awk '{print $1, $2}') \
                <(grep -E '^ +[0-9]+ ' "$out/bench-tuned-$preset-$dtype.log" | awk '{print $2}') |
          awk '{printf "T=%s %.2fx ", $1, $2/$3; s += log($2/$3); n++} END {if (n) printf "| geomean %.3fx", exp(s/n)}')
  note "bench recheck| $preset $dtype analytic/tuned: ${ratio:-n/a}"
done
rmdir "$empty"
if [ "${HMOE_TUNE_ONLY:-0}" = 1 ]; then tables_timed=""; else tables_timed=$tables; fi

# ---- Cold start and first-call latency, one fresh process per tuned table.
for table in $tables_timed; do
  preset=${table%%:*}; dtype=${table#*:}
  out_of_time "coldstart    | $preset $dtype" && continue
  timeout 60 "$hmoe" coldstart --model "$preset" --dtype "$dtype" >"$out/coldstart-$preset-$dtype.log" 2>&1
  line=$(grep '^coldstart:' "$out/coldstart-$preset-$dtype.log" | sed 's/^coldstart: //')
  note "coldstart    | ${line:-$preset $dtype FAILED}"
done

# ---- Host overhead: CPU time per run and per graph launch, launches per layer.
host_presets="qwen3-30b-a3b deepseek-v3-tp8"; [ -z "$tables_timed" ] && host_presets=""
for preset in $host_presets; do
  out_of_time "host         | $preset" && continue
  timeout 60 "$hmoe" bench --model "$preset" --host-overhead >"$out/host-overhead-$preset.log" 2>&1
  while read -r t run p90 replay graph kernels nodes rest; do
    note "host         | $preset T=$t: run ${run} us (p90 ${p90}), replayed run ${replay} us, graph launch ${graph} us, ${kernels} kernels/${nodes} nodes"
  done < <(grep -E '^ +[0-9]+ ' "$out/host-overhead-$preset.log")
done

for table in $tables; do
  preset=${table%%:*}; dtype=${table#*:}
  [ -f "$out/tune-$preset-$dtype.log" ] || continue
  echo "==== $preset $dtype: tune"; cat "$out/tune-$preset-$dtype.log"; tail -3 "$out/tune-$preset-$dtype.err"
done
for dtype in $recheck_dtypes; do
  [ -f "$out/explain-qwen3-30b-a3b-$dtype.log" ] || continue
  echo "==== qwen3-30b-a3b $dtype: explain"; cat "$out/explain-qwen3-30b-a3b-$dtype.log"
done
for table in $tables_timed; do
  preset=${table%%:*}; dtype=${table#*:}
  [ -f "$out/coldstart-$preset-$dtype.log" ] && { echo "==== $preset $dtype: coldstart"; cat "$out/coldstart-$preset-$dtype.log"; }
done
for preset in $host_presets; do
  [ -f "$out/host-overhead-$preset.log" ] && { echo "==== $preset: host overhead"; cat "$out/host-overhead-$preset.log"; }
done
grep -E '^\[  FAILED  \]' "$out/dispatch_tests.log" | head -20 || true   # (no failure is not an error)
# (the summary table is printed last by finish, on exit)
