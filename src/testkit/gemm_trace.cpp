// The GEMM timeline's summary (gemm_trace.hpp): pairs each consumer item with the producer's issue
// of its first stage (both count the CTA's items in the same order) and averages the phases.
#include "testkit/gemm_trace.hpp"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <map>
#include <sstream>

#include "common/cuda_check.hpp"
#include "testkit/cuda_handles.hpp"
#include "testkit/device.hpp"

namespace hmoe::testkit {
namespace {

using TraceEvent = gemm::trace::Event;
using gemm::trace::Record;

constexpr std::uint64_t kMissing = std::numeric_limits<std::uint64_t>::max();

struct ItemTimes {
  std::uint64_t start = kMissing, first_stage = kMissing, mainloop_end = kMissing, epilogue_end = kMissing;
};

double median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const std::size_t mid = values.size() / 2;
  return values.size() % 2 == 1 ? values[mid] : 0.5 * (values[mid - 1] + values[mid]);
}

double signed_difference(std::uint64_t later, std::uint64_t earlier) {
  return static_cast<double>(static_cast<std::int64_t>(later - earlier));
}

// Launches one layer holds at most in the buffer (two GEMMs, a few more when it runs in chunks).
constexpr int kMaxLaunches = 4;
// CTAs an SM at most (the GEMM variants run one to three).
constexpr int kMaxCtasPerSm = 4;

}  // namespace

std::vector<LaunchRecords> record_gemm_timeline(const std::function<void()>& run, cudaStream_t stream,
                                                int records_per_role) {
  namespace trace = gemm::trace;
  std::vector<LaunchRecords> recorded;
  if (!trace::kCompiled) return recorded;
  trace::Buffer buffer;
  buffer.per_role = records_per_role;
  buffer.max_ctas = kMaxCtasPerSm * current_device_info().sm_count;
  buffer.max_launches = kMaxLaunches;
  const std::size_t role_slots = static_cast<std::size_t>(kMaxLaunches) * buffer.max_ctas * trace::kRoles;
  DeviceBuffer records(role_slots * records_per_role * sizeof(Record));
  DeviceBuffer counts(role_slots * sizeof(std::uint32_t));
  // Zeroed: a consumer's records sit at fixed places, and one no event fills reads as clock 0.
  HMOE_CUDA_CHECK(cudaMemsetAsync(counts.get(), 0, counts.bytes(), stream));
  HMOE_CUDA_CHECK(cudaMemsetAsync(records.get(), 0, records.bytes(), stream));
  buffer.records = static_cast<Record*>(records.get());
  buffer.counts = static_cast<std::uint32_t*>(counts.get());
  trace::set_buffer(buffer);
  try {
    run();
  } catch (...) {
    trace::clear();
    throw;
  }
  const int launches = trace::clear();
  HMOE_CUDA_CHECK(cudaStreamSynchronize(stream));

  std::vector<std::uint32_t> host_counts(role_slots);
  HMOE_CUDA_CHECK(cudaMemcpy(host_counts.data(), counts.get(), counts.bytes(), cudaMemcpyDeviceToHost));
  for (int launch = 0; launch < launches; ++launch) {
    LaunchRecords of_launch;
    of_launch.variant = trace::launch_variant(launch);
    of_launch.grid = trace::launch_grid(launch);
    const int ctas = std::min(of_launch.grid, buffer.max_ctas);
    of_launch.ctas.resize(ctas);
    for (int cta = 0; cta < ctas; ++cta) {
      for (int role = 0; role < trace::kRoles; ++role) {
        const std::size_t slot = (static_cast<std::size_t>(launch) * buffer.max_ctas + cta) * trace::kRoles + role;
        const std::uint32_t made = host_counts[slot];
        const std::uint32_t kept = std::min<std::uint32_t>(made, static_cast<std::uint32_t>(records_per_role));
        of_launch.dropped += made - kept;
        std::vector<Record>& into = of_launch.ctas[cta][role];
        into.resize(kept);
        if (kept > 0)
          HMOE_CUDA_CHECK(cudaMemcpy(into.data(), buffer.records + slot * records_per_role, kept * sizeof(Record),
                                     cudaMemcpyDeviceToHost));
      }
    }
    recorded.push_back(std::move(of_launch));
  }
  return recorded;
}

LaunchSummary summarize(const LaunchRecords& launch) {
  LaunchSummary summary;
  summary.variant = launch.variant;
  summary.grid = launch.grid;
  summary.dropped = launch.dropped;
  double item_sum = 0.0, wait_sum = 0.0, mainloop_sum = 0.0, epilogue_sum = 0.0;
  long long item_count = 0, with_successor = 0, epilogue_count = 0, waited = 0, late = 0;
  std::vector<double> waited_load, lead;
  for (const auto& roles : launch.ctas) {
    // The producer's first issue of each item (its lowest K block comes first).
    std::map<std::uint32_t, std::uint64_t> first_issue;
    for (const Record& record : roles[0])
      if (record.clock != 0 && static_cast<TraceEvent>(record.event) == TraceEvent::kStageIssued)
        first_issue.emplace(record.item, record.clock);
    for (int role = 1; role < gemm::trace::kRoles; ++role) {
      std::map<std::uint32_t, ItemTimes> items;
      for (const Record& record : roles[role]) {
        if (record.clock == 0) continue;   // a place no event filled (an item without its own epilogue)
        ItemTimes& times = items[record.item];
        switch (static_cast<TraceEvent>(record.event)) {
          case TraceEvent::kItemStart: times.start = record.clock; break;
          case TraceEvent::kFirstStage: times.first_stage = record.clock; break;
          case TraceEvent::kMainloopEnd: times.mainloop_end = record.clock; break;
          case TraceEvent::kEpilogueEnd: times.epilogue_end = record.clock; break;
          case TraceEvent::kStageIssued: break;
        }
      }
      for (auto it = items.begin(); it != items.end(); ++it) {
        const ItemTimes& times = it->second;
        if (times.start == kMissing || times.first_stage == kMissing) continue;
        ++item_count;
        const double wait = signed_difference(times.first_stage, times.start);
        wait_sum += wait;
        const auto next = std::next(it);
        if (next != items.end() && next->first == it->first + 1 && next->second.start != kMissing) {
          item_sum += signed_difference(next->second.start, times.start);
          ++with_successor;
        }
        if (times.mainloop_end != kMissing) mainloop_sum += signed_difference(times.mainloop_end, times.first_stage);
        if (times.mainloop_end != kMissing && times.epilogue_end != kMissing) {
          epilogue_sum += signed_difference(times.epilogue_end, times.mainloop_end);
          ++epilogue_count;
        }
        const auto issued = first_issue.find(it->first);
        if (issued != first_issue.end()) lead.push_back(signed_difference(times.start, issued->second));
        if (wait > kWaitThresholdCycles) {
          ++waited;
          if (issued != first_issue.end()) {
            if (issued->second > times.start) ++late;
            waited_load.push_back(signed_difference(times.first_stage, issued->second));
          }
        }
      }
    }
  }
  summary.items = item_count;
  if (item_count > 0) {
    // Item time: the mean over items that have a successor (the last item of a role has none).
    summary.item_cycles = with_successor > 0 ? item_sum / static_cast<double>(with_successor) : 0.0;
    summary.first_stage_wait_cycles = wait_sum / static_cast<double>(item_count);
    summary.mainloop_cycles = mainloop_sum / static_cast<double>(item_count);
    summary.epilogue_cycles = epilogue_count > 0 ? epilogue_sum / static_cast<double>(epilogue_count) : 0.0;
    summary.waited_share = static_cast<double>(waited) / static_cast<double>(item_count);
  }
  summary.producer_late_share = waited > 0 ? static_cast<double>(late) / static_cast<double>(waited) : 0.0;
  summary.waited_load_cycles = median(waited_load);
  summary.producer_lead_cycles = median(lead);
  return summary;
}

std::string format_summaries(const std::vector<LaunchSummary>& summaries, int clock_khz) {
  std::ostringstream text;
  const double cycles_per_us = clock_khz > 0 ? clock_khz / 1000.0 : 0.0;
  const auto cycles = [&](double value) {
    char cell[48];
    if (cycles_per_us > 0)
      std::snprintf(cell, sizeof(cell), "%.0f (%.2f us)", value, value / cycles_per_us);
    else
      std::snprintf(cell, sizeof(cell), "%.0f", value);
    return std::string(cell);
  };
  // NOTE: cudaDevAttrClockRate is the maximum SM clock; under a prefill GEMM an H100 ran at ~1.6 of its
  // 1.98 GHz (docs/PERF.md, twenty-first session), so the µs read low there; the cycle counts are exact.
  text << "per work item, mean SM cycles"
       << (cycles_per_us > 0 ? " (us at the maximum SM clock: a throttled card takes longer)" : "") << ":\n";
  for (const LaunchSummary& s : summaries) {
    char head[256];
    std::snprintf(head, sizeof(head), "%s  grid %d  items %lld%s\n", s.variant.c_str(), s.grid, s.items,
                  s.dropped > 0 ? ("  (" + std::to_string(s.dropped) + " records dropped: buffer full)").c_str() : "");
    text << head;
    text << "  item " << cycles(s.item_cycles) << " = first-stage wait " << cycles(s.first_stage_wait_cycles)
         << " + mainloop " << cycles(s.mainloop_cycles) << " + epilogue " << cycles(s.epilogue_cycles)
         << " (+ the rest: scheduler, scales)\n";
    char tail[256];
    std::snprintf(tail, sizeof(tail),
                  "  waited for the first stage: %.1f %% of items; of those, issued by the producer after the item "
                  "started: %.1f %%; issue -> landed (median) %s; producer lead at item start (median) %s\n",
                  100.0 * s.waited_share, 100.0 * s.producer_late_share, cycles(s.waited_load_cycles).c_str(),
                  cycles(s.producer_lead_cycles).c_str());
    text << tail;
  }
  return text.str();
}

std::string records_csv(const std::vector<LaunchRecords>& launches) {
  std::ostringstream text;
  text << "launch,variant,cta,role,item,k_block,event,sm,clock\n";
  for (std::size_t launch = 0; launch < launches.size(); ++launch) {
    for (std::size_t cta = 0; cta < launches[launch].ctas.size(); ++cta) {
      for (int role = 0; role < gemm::trace::kRoles; ++role) {
        for (const Record& record : launches[launch].ctas[cta][role])
          if (record.clock != 0)
            text << launch << "," << launches[launch].variant << "," << cta << "," << role << "," << record.item << ","
               << record.k_block << "," << static_cast<int>(record.event) << "," << static_cast<int>(record.sm) << ","
               << record.clock << "\n";
      }
    }
  }
  return text.str();
}

}  // namespace hmoe::testkit
