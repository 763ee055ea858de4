#!/usr/bin/env bash
# Regenerates docs/BENCHMARKS.md and docs/img/*.png on an H200 in one go (< 10 minutes): ceilings,
# token sweeps of three presets against the cuBLAS loop and the PyTorch peers, the model-level
# tables, a repeated sweep; then packs the page, the plots and the raw JSON into one tarball.
# Usage: bench/report.sh            (on the H200; $OUT, when set, receives report.tgz)
# Afterwards, commit the page, docs/img/*.png and the result JSON under bench/results/<date>/ together:
# a CPU test (ReportPage.RegeneratesFromTheCommittedResults) rebuilds the page from the newest folder.
# Environment: HMOE_REPORT_PRESETS (default "qwen3-30b-a3b deepseek-v3-tp8 mixtral-8x7b"),
#              HMOE_REPORT_BUDGET_S (default 540: later steps are skipped, and said so, past it).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
out=${OUT:-/tmp/hmoe-report-out}
results=$(mktemp -d "${TMPDIR:-/tmp}/hmoe-report.XXXXXX")
mkdir -p "$out" docs/img
presets=${HMOE_REPORT_PRESETS:-"qwen3-30b-a3b deepseek-v3-tp8 mixtral-8x7b"}
repeat_preset=qwen3-30b-a3b
budget_s=${HMOE_REPORT_BUDGET_S:-540}
started=$(date +%s)
status=0
skipped="$results/skipped.txt"
: >"$skipped"

elapsed() { echo $(( $(date +%s) - started )); }
log() { echo "[report $(elapsed)s] $*"; }
# Runs a step unless the time budget is spent; a skipped or failed step is recorded for the page.
step() {
  local name=$1 limit=$2; shift 2
  if [ "$(elapsed)" -ge "$budget_s" ]; then
    echo "$name: skipped, time budget of ${budget_s}s spent" | tee -a "$skipped"
    return 1
  fi
  log "$name"
  timeout "$limit" "$@" >"$results/$name.log" 2>&1
  local rc=$?
  if [ $rc -ne 0 ]; then
    echo "$name: exit $rc (last lines below)" | tee -a "$skipped"
    tail -5 "$results/$name.log" | tee -a "$skipped"
  fi
  grep -h '^peers.py: skip' "$results/$name.log" >>"$skipped" 2>/dev/null
  return $rc
}

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1 >"$results/gpu.txt" ||
  { echo "report.sh: nvidia-smi failed: no GPU here"; exit 1; }
log "GPU: $(cat "$results/gpu.txt")"

# ---- Build: reuse a carried build/ when its binary starts here (scripts/device-check.sh does the same).
bin=build
if ! "$bin/hmoe" --help >/dev/null 2>&1; then
  bin=build-report
  generator=()
  command -v ninja >/dev/null && generator=(-G Ninja)
  log "building into $bin"
  { cmake -S . -B "$bin" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF &&
    cmake --build "$bin" -j "$(nproc)" --target hmoe; } >"$results/build.log" 2>&1 ||
    { tail -40 "$results/build.log"; echo "report.sh: BUILD FAILED"; exit 1; }
fi
hmoe="$bin/hmoe"
# The tuned tables of this checkout, wherever the carried build was configured (docs/DISPATCH.md).
export HMOE_TUNED_DIR=${HMOE_TUNED_DIR:-$root/tuned}
log "using $hmoe ($("$hmoe" info 2>/dev/null | head -1))"

# ---- Ceilings (copy, read-only stream, bf16 and fp8 GEMM), once for the page.
step ceilings 120 "$hmoe" bench --ceilings --json "$results/ceilings.json" || status=1

# ---- FP8: sweep it when hmoe has it; until then the page says so.
fp8_status="FP8 layers: this hmoe build has no fp8-block variants (\`hmoe bench --dtype fp8-block --explain\` failed). The PyTorch FP8 peer (torch._scaled_grouped_mm, row-wise) is shown beside the bf16 rows where it runs."
fp8_dtype=fp8-block
if "$hmoe" bench --model "$repeat_preset" --dtype "$fp8_dtype" --tokens 1 --explain >/dev/null 2>&1; then
  fp8_status="FP8 ($fp8_dtype: 128x128 weight blocks, 1x128 activation groups) sweeps: see the sections marked $fp8_dtype. Their floors use the measured cuBLASLt e4m3 GEMM peak and 1-byte weights; the cuBLAS loop peer is bf16-only, the PyTorch FP8 peer (torch._scaled_grouped_mm, row-wise scales) appears beside the bf16 rows."
else
  fp8_dtype=
fi

# ---- Sweeps: hmoe + cuBLAS loop + model level, then the PyTorch peers on the same expert loads.
for preset in $presets; do
  step "$preset" 240 "$hmoe" bench --model "$preset" --peers cublas --e2e --json "$results/$preset.json" || status=1
  cat "$results/$preset.log"
  if [ -s "$results/$preset.json" ]; then
    step "$preset.peers" 180 python3 bench/peers.py --from-json "$results/$preset.json" \
      --out "$results/$preset.peers.json"
  fi
  if [ -n "$fp8_dtype" ]; then
    step "$preset@$fp8_dtype" 240 "$hmoe" bench --model "$preset" --dtype "$fp8_dtype" --e2e \
      --json "$results/$preset@$fp8_dtype.json" || status=1
  fi
  # ---- Repeatability: the same sweep of one preset again (hmoe only), right after its first run so
  # that the time budget never skips it.
  if [ "$preset" = "$repeat_preset" ]; then
    step "$repeat_preset.repeat" 180 "$hmoe" bench --model "$repeat_preset" --json "$results/$repeat_preset.repeat.json" ||
      status=1
  fi
done

# ---- The page and the plots.
cuda_toolkit=$( (command -v nvcc >/dev/null && nvcc --version | grep -oE 'release [0-9.]+' | cut -d' ' -f2) || echo "?")
torch_version=$(python3 -c 'import torch; print(torch.__version__)' 2>/dev/null || echo "not installed")
# NOTE: the device tool copies the working tree but not always current git metadata: pass the
# commit in HMOE_COMMIT when the copy's HEAD would be stale.
commit=${HMOE_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo "?")}
GPU_LINE="$(cat "$results/gpu.txt")" CUDA_TOOLKIT="$cuda_toolkit" TORCH_VERSION="$torch_version" COMMIT="$commit" \
FP8_STATUS="$fp8_status" SKIPPED_FILE="$skipped" python3 - "$results/env.json" <<'PY'
import datetime, json, os, sys
gpu, _, driver = os.environ["GPU_LINE"].partition(",")
with open(os.environ["SKIPPED_FILE"]) as f:
    skipped = f.read()
json.dump({"gpu": gpu.strip(), "driver": driver.strip(), "cuda_toolkit": os.environ["CUDA_TOOLKIT"],
           "torch": os.environ["TORCH_VERSION"], "commit": os.environ["COMMIT"], "command": "bench/report.sh",
           "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "fp8_status": os.environ["FP8_STATUS"], "skipped": skipped,
           "statistic": "mean-of-set-medians", "warmup_s": 0.1}, open(sys.argv[1], "w"), indent=1)
PY
rm -f docs/img/*.png
# The repeated run stays out of the plots (it would replace the first run's points).
plot_inputs=$(ls "$results"/*.json | grep -v '\.repeat\.json$')
# shellcheck disable=SC2086
python3 bench/plot.py docs/img $plot_inputs >"$results/plot.log" 2>&1 || { cat "$results/plot.log"; status=1; }
python3 bench/report.py "$results" docs/BENCHMARKS.md >"$results/report.log" 2>&1 || { cat "$results/report.log"; status=1; }

# ---- One tarball back (the device tool returns few files): the page, the plots, the raw results.
rm -rf "$results/docs" && mkdir -p "$results/docs/img"
cp docs/BENCHMARKS.md "$results/docs/" 2>/dev/null
cp docs/img/*.png "$results/docs/img/" 2>/dev/null
tar -czf "$out/report.tgz" -C "$results" . || status=1
log "wrote $out/report.tgz ($(du -h "$out/report.tgz" | cut -f1)); unpack with: tar -xzf report.tgz ./docs (the page and plots), results JSON at the top level"
echo
sed -n '/^## Repeatability/,/^## Skipped/p' docs/BENCHMARKS.md 2>/dev/null | tail -5
echo "==== skipped / failed steps ===="
cat "$skipped"
log "done, exit $status"
exit $status
