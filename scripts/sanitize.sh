#!/usr/bin/env bash
# Runs compute-sanitizer's memcheck, racecheck, synccheck and initcheck over a small set of GPU test
# cases that covers every kernel family (both routing functions, both permute paths, normal and
# Swap-AB GEMMs at several tiles, combine), both entry points, invalid ids and chunked runs, then
# prints one line per tool with its error count. Needs a Hopper GPU and compute-sanitizer in PATH.
#   scripts/sanitize.sh [BUILD_DIR]     (default: build; the tests must already be built)
# Logs: BUILD_DIR/sanitize-<tool>.log. Exit status: 0 when every tool reports zero errors.
set -uo pipefail
cd "$(dirname "$0")/.."
build_dir="${1:-build}"
binary="${build_dir}/hmoe_gpu_tests"
[[ -x "${binary}" ]] || { echo "sanitize: ${binary} not found; build first (make build BUILD=${build_dir})"; exit 2; }
command -v compute-sanitizer >/dev/null || { echo "sanitize: compute-sanitizer is not in PATH"; exit 2; }

# Small cases only: sanitizers slow kernels 10-100x. Why each is here:
cases=(
  # softmax routing + single-block permute + Swap-AB (t8) and normal (t64) GEMMs, logits entry
  'Presets/LayerTest.MatchesReference/qwen3_30b_a3b_T1_uniform_logits_normal'
  'Presets/LayerTest.MatchesReference/qwen3_30b_a3b_T1_uniform_logits_swap'
  'Presets/LayerTest.MatchesReference/qwen3_30b_a3b_T64_uniform_logits_swap'
  # top-k entry point
  'Presets/LayerTest.MatchesReference/qwen3_30b_a3b_T7_uniform_topk_auto'
  'Presets/LayerTest.MatchesReference/olmoe_1b_7b_T64_uniform_topk_auto'
  # grouped sigmoid routing, both orientations
  'Presets/LayerTest.MatchesReference/deepseek_v3_tp8_T7_uniform_logits_normal'
  'Presets/LayerTest.MatchesReference/deepseek_v3_tp8_T7_uniform_logits_swap'
  # E = 1 and k = E
  'Shapes/HostileRouting.MatchesReference/e1_T3_uniform_logits_swap'
  'Shapes/HostileRouting.MatchesReference/e8_k8_T64_uniform_logits_normal'
  # T·k > 8192: the multi-kernel permute path, normal t128 and Swap-AB t128 tiles
  'Shapes/HostileRouting.MatchesReference/e8_k8_T2049_zipf_topk_auto'
  'Shapes/HostileRouting.MatchesReference/e8_k8_T2049_uniform_logits_swap'
  # out-of-range ids, a workspace cap (chunked runs), graph capture of a chunked run
  'WorkspaceCap.ChunksCountInvalidIdsAndMatchUnchunkedBits'
)
filter="$(IFS=:; echo "${cases[*]}")"

status=0
summary=()
for tool in memcheck racecheck synccheck initcheck; do
  log="${build_dir}/sanitize-${tool}.log"
  start=$(date +%s)
  timeout 600 compute-sanitizer --tool "${tool}" --print-limit 50 \
    "${binary}" --gtest_filter="${filter}" --gtest_brief=1 >"${log}" 2>&1
  run_status=$?
  seconds=$(( $(date +%s) - start ))
  # memcheck, synccheck, initcheck end with "ERROR SUMMARY: N errors"; racecheck with
  # "RACECHECK SUMMARY: H hazards displayed (N errors, W warnings)".
  errors=$(grep -Eo 'ERROR SUMMARY: [0-9]+' "${log}" | tail -1 | grep -Eo '[0-9]+$')
  race=$(grep -Eo 'RACECHECK SUMMARY: [0-9]+ hazards? displayed \([0-9]+ errors?, [0-9]+ warnings?' "${log}" | tail -1)
  hazards=""
  if [[ -n "${race}" ]]; then
    hazards=$(grep -Eo '[0-9]+ hazards?' <<<"${race}" | grep -Eo '[0-9]+')
    [[ -z "${errors}" ]] && errors=$(grep -Eo '[0-9]+ errors?' <<<"${race}" | grep -Eo '[0-9]+')
  fi
  passed=$(grep -Eo '\[  PASSED  \] [0-9]+' "${log}" | grep -Eo '[0-9]+$' | tail -1)
  failed=$(grep -Eo '\[  FAILED  \] [0-9]+' "${log}" | grep -Eo '[0-9]+' | head -1)
  skipped=$(grep -Eo '\[  SKIPPED \] [0-9]+' "${log}" | grep -Eo '[0-9]+$' | tail -1)
  line=$(printf '%-10s %s errors%s, tests passed %s failed %s skipped %s, exit %s, %ss (log %s)' "${tool}" \
         "${errors:-?}" "${hazards:+ (${hazards} hazards incl. warnings)}" "${passed:-0}" "${failed:-0}" "${skipped:-0}" \
         "${run_status}" "${seconds}" "${log}")
  summary+=("${line}")
  echo "${line}"
  # Every listed case must have run and passed (a renamed test would otherwise drop out silently).
  if [[ "${errors:-x}" != "0" || "${run_status}" != "0" || "${passed:-0}" != "${#cases[@]}" ]]; then status=1; fi
done

echo "---- sanitize summary (${#cases[@]} test cases per tool) ----"
printf '%s\n' "${summary[@]}"
exit "${status}"
