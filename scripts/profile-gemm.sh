#!/usr/bin/env bash
# Why an expert GEMM runs at the speed it does: Nsight Compute's hardware counters for every expert
# GEMM launch of one layer run (`hmoe check`, one reference token), one compact line per launch:
# duration, grid, SM / DRAM / L2 throughput, tensor-pipe activity, achieved occupancy, and the warp stall
# reasons that dominate (cycles a warp waits per issued instruction, largest first).
# Usage: scripts/profile-gemm.sh PRESET:DTYPE:T[:GEMM1+GEMM2] [...]   e.g. deepseek-v3-tp8:fp8-block:256
# A fourth field forces that kernel pair: the layer then runs as `hmoe bench --variant` (check has no
# --variant), whose repeated runs are cut at the first six expert-GEMM launches (the warm-up's, then the
# layer's own). L2 columns: hit rate of all L2 reads, and DRAM / L2 read bytes per launch.
# HMOE_PROFILE_SOURCE=1 adds, per item, where the warps of its two GEMM launches wait, per SASS
# instruction (ncu warp-state sampling; two more ncu runs an item). NOT yet run on the H200.
# HMOE_PROFILE_KERNELS=REGEX profiles the launches of other kernels instead of the expert GEMMs in the
# counter run (e.g. 'quantize_kernel|amax_kernel' for the FP8 x stage; ncu's --kernel-name regex on the
# function name); the per-instruction runs stay on the GEMMs.
# On the H200 only (ncu reads the counters on the Firecracker machines, --clock-control none as
# METHOD.md asks). Uses a carried build/ (else build-device/); $OUT, when set, gets profile.tgz (the
# raw CSV of every item and ncu's metric list) and profile.txt (the lines printed here).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
[ $# -ge 1 ] || { echo "usage: scripts/profile-gemm.sh PRESET:DTYPE:T[:GEMM1+GEMM2] [...]" >&2; exit 2; }
command -v ncu >/dev/null || { echo "profile-gemm.sh: ncu not found (run it on the H200)" >&2; exit 1; }
bin=build
"$bin/hmoe" --help >/dev/null 2>&1 || bin=build-device
"$bin/hmoe" --help >/dev/null 2>&1 || { echo "profile-gemm.sh: no hmoe binary in build/ or build-device/" >&2; exit 1; }
work=$(mktemp -d /tmp/hmoe-profile.XXXXXX)
dest=${OUT:-$work}
mkdir -p "$dest"

# Metric names differ between ncu versions: take the stall ratios and the tensor-pipe counter this
# ncu knows (a name it does not know would fail the whole run).
ncu --query-metrics >"$work/metrics.txt" 2>&1
stalls=$(grep -oE '^smsp__average_warps_issue_stalled_[a-z_]+_per_issue_active' "$work/metrics.txt" | sort -u |
         sed 's/$/.ratio/' | paste -sd, -)
# NOTE: the first run on the H200 (2026-12-04) found no sm__pipe_tensor_op_gmma_cycles_active in this
# ncu's list: take whichever tensor-pipe cycle counter it has (the list goes into profile.tgz).
tensor=$(grep -oE '^ *sm__pipe_tensor(_op_gmma|_op_hmma)?_cycles_active\b' "$work/metrics.txt" | tr -d ' ' | head -1)
metrics="gpu__time_duration.sum,launch__grid_size,launch__registers_per_thread,launch__occupancy_limit_registers"
metrics="$metrics,sm__throughput.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed"
metrics="$metrics,lts__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active"
# L2 reads: hit rate and bytes, where this ncu lists them.
for name in lts__t_sector_op_read_hit_rate.pct lts__t_sectors_op_read.sum dram__bytes_read.sum; do
  grep -qE "^ *${name%.*}\b" "$work/metrics.txt" && metrics="$metrics,$name"
done
[ -n "$tensor" ] && metrics="$metrics,$tensor.avg.pct_of_peak_sustained_active"
[ -n "$stalls" ] && metrics="$metrics,$stalls"

{
echo "tensor-pipe counter: ${tensor:-none found by ncu --query-metrics} (the tensor column)"
for item in "$@"; do
  IFS=: read -r preset dtype tokens variant <<<"$item"
  tag="${preset}_${dtype}_${tokens}${variant:+_${variant//+/_}}"
  csv="$work/$tag.csv"
  # The layer: `hmoe check` (one reference token), or with a forced pair `hmoe bench --variant`,
  # cut after six expert-GEMM launches.
  if [ -n "$variant" ]; then
    layer=("$bin/hmoe" bench --model "$preset" --dtype "$dtype" --tokens "$tokens" --variant "$variant")
    cap=(--launch-count 6)
  else
    layer=("$bin/hmoe" check --model "$preset" --dtype "$dtype" --tokens "$tokens" --ref-tokens 1)
    cap=()
  fi
  # The plan-time warm-up launches the same kernels on a small copy first: they show as short,
  # small-grid lines above the layer's own two launches.
  # --log-file keeps ncu's CSV apart from hmoe's own output. If this ncu refuses a metric, the run is
  # repeated with the basic set alone.
  profile() {
    timeout 240 ncu --clock-control none --kernel-name "regex:${HMOE_PROFILE_KERNELS:-expert_gemm}" "${cap[@]}" \
      --metrics "$1" --csv --log-file "$csv" "${layer[@]}" >"$csv.out" 2>&1
  }
  profile "$metrics"
  rc=$?
  if ! grep -q '"Metric Value"' "$csv" 2>/dev/null; then
    profile "gpu__time_duration.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed"
    rc="$rc, then $? with the basic metrics"
  fi
  echo "== $item (ncu exit $rc)"
  python3 - "$csv" <<'EOF'
import csv, re, sys
try:
    rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
except OSError:
    rows = []
if not rows:
    print("  no ncu rows: see the .csv and .csv.out files in profile.tgz"); sys.exit(0)
head, body = rows[0], rows[1:]
col = {name: i for i, name in enumerate(head)}
launches = {}
for r in body:
    key = (r[col["ID"]], r[col["Kernel Name"]])
    launches.setdefault(key, {})[r[col["Metric Name"]]] = r[col["Metric Value"]]
def num(v):
    try: return float(v.replace(",", ""))
    except ValueError: return float("nan")
for (lid, name), m in launches.items():
    config = name[name.find("GemmConfig<") + 11:name.find(">")] if "GemmConfig<" in name else name[:60]
    # epilogue (0 SwiGLU, 1 x routing weight), swap_ab, token tile, weight tile, stages, gather,
    # quant (0 bf16, 1 epilogue scale, 2 block scales): GemmConfig in src/gemm/config.hpp
    config = re.sub(r"\((?:hmoe::gemm::)?\w+\)", "", config).replace(" ", "")
    ms = {k: num(v) for k, v in m.items()}
    tensor = next((v for k, v in ms.items() if k.startswith("sm__pipe_tensor")), float("nan"))
    stalls = sorted(((v, k.replace("smsp__average_warps_issue_stalled_", "").replace("_per_issue_active.ratio", ""))
                     for k, v in ms.items() if k.startswith("smsp__average_warps_issue_stalled")), reverse=True)
    print(f"  #{lid} {config}")
    print(f"     {ms.get('gpu__time_duration.sum', float('nan')) / 1e3:9.1f} us  grid {ms.get('launch__grid_size', 0):.0f}"
          f"  regs {ms.get('launch__registers_per_thread', 0):.0f} (CTA limit {ms.get('launch__occupancy_limit_registers', 0):.0f})"
          f"  SM {ms.get('sm__throughput.avg.pct_of_peak_sustained_elapsed', float('nan')):.0f}%"
          f"  DRAM {ms.get('dram__throughput.avg.pct_of_peak_sustained_elapsed', float('nan')):.0f}%"
          f"  L2 {ms.get('lts__throughput.avg.pct_of_peak_sustained_elapsed', float('nan')):.0f}%"
          f"  tensor {tensor:.0f}%  warps {ms.get('sm__warps_active.avg.pct_of_peak_sustained_active', float('nan')):.0f}%")
    if "lts__t_sectors_op_read.sum" in ms or "dram__bytes_read.sum" in ms:
        print(f"     L2 read hit {ms.get('lts__t_sector_op_read_hit_rate.pct', float('nan')):.1f}%"
              f"  L2 read {ms.get('lts__t_sectors_op_read.sum', float('nan')) * 32 / 1e6:.1f} MB"
              f"  DRAM read {ms.get('dram__bytes_read.sum', float('nan')) / 1e6:.1f} MB")
    print("     stalls/issue: " + ", ".join(f"{k} {v:.2f}" for v, k in stalls[:6]))
EOF
  # HMOE_PROFILE_SOURCE=1: where the warps of the layer's two GEMM launches wait, per SASS instruction
  # (ncu's warp-state sampling; launches 0 and 1 are the plan-time warm-up's): the instructions with
  # the most samples, and the samples summed per opcode. The .ncu-rep files go into profile.tgz.
  [ "${HMOE_PROFILE_SOURCE:-0}" = 1 ] || continue
  for launch in 2 3; do
    rep="$work/${tag}_launch$launch"
    timeout 240 ncu --clock-control none --kernel-name regex:expert_gemm --launch-skip "$launch" --launch-count 1 \
      --section SourceCounters --section WarpStateStats -f -o "$rep" \
      "${layer[@]}" >"$rep.out" 2>&1
    rc=$?
    ncu --import "$rep.ncu-rep" --page source --csv --print-source sass >"$rep.sass.csv" 2>"$rep.sass.err"
    echo "  -- launch $launch: warp-state samples per SASS instruction (ncu exit $rc, import exit $?)"
    python3 - "$rep.sass.csv" <<'EOF'
import collections, csv, sys
rows = list(csv.reader(open(sys.argv[1], errors="replace")))
head_at = next((i for i, r in enumerate(rows) if any(c.startswith("Warp Stall Sampling (All") for c in r)), None)
if head_at is None:
    print("     no 'Warp Stall Sampling' column: see the .sass.csv / .sass.err files in profile.tgz"); sys.exit(0)
head = rows[head_at]
samples_col = next(i for i, c in enumerate(head) if c.startswith("Warp Stall Sampling (All"))
source_col = head.index("Source") if "Source" in head else 1
def num(v):
    try: return float(v.replace(",", ""))
    except ValueError: return 0.0
lines = [(num(r[samples_col]), r[source_col].strip()) for r in rows[head_at + 1:] if len(r) > max(samples_col, source_col)]
total = sum(n for n, _ in lines) or 1.0
per_opcode = collections.Counter()
for n, text in lines:
    words = [w for w in text.split(" ") if w and not w.startswith("@")]   # drop a predicate (@P0, @!P1)
    per_opcode[words[0].split(".")[0] if words else "?"] += n
print("     per opcode: " + ", ".join(f"{op} {100 * n / total:.0f}%" for op, n in per_opcode.most_common(8)))
for n, text in sorted(lines, reverse=True)[:15]:
    print(f"     {100 * n / total:5.1f}%  {text[:100]}")
EOF
  done
done
} 2>&1 | tee "$dest/profile.txt"
tar -czf "$dest/profile.tgz" -C "$work" . 2>/dev/null
