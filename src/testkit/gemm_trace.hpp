// What `hmoe trace` makes of the expert GEMMs' work-item timeline (src/gemm/trace.hpp): per launch,
// where a work item's time goes — waiting for its first stage, the mainloop, the epilogue — and
// whether the producer had issued that first stage before the consumers wanted it.
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "gemm/trace.hpp"

namespace hmoe::testkit {

// One launch's records as kept, per CTA and role (producer, consumer warpgroup 0, 1); records with
// clock 0 are places no event filled and are skipped.
struct LaunchRecords {
  std::string variant;
  int grid = 0;
  std::vector<std::array<std::vector<gemm::trace::Record>, gemm::trace::kRoles>> ctas;
  long long dropped = 0;   // records made beyond the buffer's room (counted, not kept)
};

// A first-stage wait shorter than this many cycles counts as none (the barrier check itself).
inline constexpr double kWaitThresholdCycles = 200.0;

struct LaunchSummary {
  std::string variant;
  int grid = 0;
  long long items = 0;              // consumer work items with a start and a first stage
  long long dropped = 0;
  // Means over those items, in SM cycles: start → next start; start → first stage landed; first
  // stage → last batch retired; last batch → output written (items with an epilogue only).
  double item_cycles = 0.0;
  double first_stage_wait_cycles = 0.0;
  double mainloop_cycles = 0.0;
  double epilogue_cycles = 0.0;
  // Items whose first stage the consumers waited for (> kWaitThresholdCycles), and of those the
  // share whose first stage the producer issued only after the item had started (producer late),
  // and the median time from that issue to the stage landing (the load's latency, when waited for).
  double waited_share = 0.0;
  double producer_late_share = 0.0;
  double waited_load_cycles = 0.0;
  // Median over all items of item start − first stage issued: how far ahead the producer ran.
  double producer_lead_cycles = 0.0;
};

// Runs `run` (which enqueues on `stream`) with every expert-GEMM launch recording into a buffer of
// `records_per_role` records per recording thread, waits for it, and returns the launches' records.
// A build without the timeline (gemm::trace::kCompiled false) records nothing: no launches.
std::vector<LaunchRecords> record_gemm_timeline(const std::function<void()>& run, cudaStream_t stream,
                                                int records_per_role);

LaunchSummary summarize(const LaunchRecords& launch);

// The summaries as a table; clock_khz converts cycles to µs (0: cycles only).
std::string format_summaries(const std::vector<LaunchSummary>& summaries, int clock_khz);

// Every kept record as CSV: launch,variant,cta,role,item,k_block,event,sm,clock.
std::string records_csv(const std::vector<LaunchRecords>& launches);

}  // namespace hmoe::testkit
