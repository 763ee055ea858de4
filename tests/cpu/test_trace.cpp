// `hmoe trace` without a GPU: the summary of a hand-made GEMM timeline (testkit/gemm_trace.hpp), its
// CSV, and the command's answers where it cannot run (bad usage; a build without the timeline).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "gemm/trace.hpp"
#include "run_command.hpp"
#include "testkit/gemm_trace.hpp"

namespace hmoe::testkit {
namespace {

using gemm::trace::Event;
using gemm::trace::Record;
using hmoe::test::contains;

Record at(std::uint64_t clock, std::uint32_t item, Event event, int k_block = 0) {
  return Record{clock, item, static_cast<std::uint16_t>(k_block), static_cast<std::uint8_t>(event), 7};
}

// One CTA, two items. Warpgroup 0 waits for both first stages, which the producer issued only after
// the items had started; warpgroup 1 finds them (nearly) ready.
LaunchRecords two_items() {
  LaunchRecords launch;
  launch.variant = "weighted_normal_t128_w128_fp8block";
  launch.grid = 1;
  launch.ctas.resize(1);
  launch.ctas[0][0] = {at(100, 0, Event::kStageIssued, 0), at(150, 0, Event::kStageIssued, 1),
                       at(1000, 1, Event::kStageIssued, 0), at(1100, 1, Event::kStageIssued, 1)};
  launch.ctas[0][1] = {at(90, 0, Event::kItemStart),    at(400, 0, Event::kFirstStage),
                       at(600, 0, Event::kMainloopEnd), at(700, 0, Event::kEpilogueEnd),
                       at(900, 1, Event::kItemStart),   at(1500, 1, Event::kFirstStage),
                       at(1700, 1, Event::kMainloopEnd), at(1800, 1, Event::kEpilogueEnd)};
  launch.ctas[0][2] = {at(95, 0, Event::kItemStart),    at(120, 0, Event::kFirstStage),
                       at(610, 0, Event::kMainloopEnd), at(690, 0, Event::kEpilogueEnd),
                       at(905, 1, Event::kItemStart),   at(1010, 1, Event::kFirstStage),
                       at(1705, 1, Event::kMainloopEnd), at(1790, 1, Event::kEpilogueEnd)};
  return launch;
}

TEST(GemmTrace, SplitsAnItemsTimeAndSaysWhetherTheProducerWasAhead) {
  const LaunchSummary summary = summarize(two_items());
  EXPECT_EQ(summary.items, 4);
  EXPECT_DOUBLE_EQ(summary.item_cycles, 810.0);                                  // 900 − 90, 905 − 95
  EXPECT_DOUBLE_EQ(summary.first_stage_wait_cycles, (310.0 + 600.0 + 25.0 + 105.0) / 4);
  EXPECT_DOUBLE_EQ(summary.mainloop_cycles, (200.0 + 200.0 + 490.0 + 695.0) / 4);
  EXPECT_DOUBLE_EQ(summary.epilogue_cycles, (100.0 + 100.0 + 80.0 + 85.0) / 4);
  // Waits above 200 cycles: warpgroup 0's two; both first stages issued after their item started.
  EXPECT_DOUBLE_EQ(summary.waited_share, 0.5);
  EXPECT_DOUBLE_EQ(summary.producer_late_share, 1.0);
  EXPECT_DOUBLE_EQ(summary.waited_load_cycles, (300.0 + 500.0) / 2);            // landed − issued
  EXPECT_DOUBLE_EQ(summary.producer_lead_cycles, (-95.0 + -10.0) / 2);          // start − issued
}

TEST(GemmTrace, ItemsWithoutAnEpilogueAndMissingRecordsAreHandled) {
  LaunchRecords launch = two_items();
  // A split-K item that another CTA finishes has no epilogue (its place stays zero); a role whose
  // records were dropped has no first stage for its last item.
  launch.ctas[0][1].back() = Record{};                           // item 1 of warpgroup 0: no epilogue end
  launch.ctas[0][2].resize(4);                                   // warpgroup 1 kept item 0 only
  launch.dropped = 4;
  const LaunchSummary summary = summarize(launch);
  EXPECT_EQ(summary.items, 3);
  EXPECT_EQ(summary.dropped, 4);
  EXPECT_DOUBLE_EQ(summary.epilogue_cycles, (100.0 + 80.0) / 2);
  EXPECT_DOUBLE_EQ(summary.item_cycles, 810.0);                  // only warpgroup 0's item 0 has a successor
}

TEST(GemmTrace, PrintsTheSummaryAndEveryRecord) {
  const LaunchSummary summary = summarize(two_items());
  const std::string text = format_summaries({summary}, 1'000'000);   // 1 GHz: 1000 cycles a µs
  EXPECT_TRUE(contains(text, "weighted_normal_t128_w128_fp8block  grid 1  items 4")) << text;
  EXPECT_TRUE(contains(text, "item 810 (0.81 us)")) << text;
  EXPECT_TRUE(contains(text, "waited for the first stage: 50.0 % of items")) << text;
  const std::string csv = records_csv({two_items()});
  EXPECT_TRUE(contains(csv, "launch,variant,cta,role,item,k_block,event,sm,clock\n")) << csv;
  EXPECT_TRUE(contains(csv, "0,weighted_normal_t128_w128_fp8block,0,0,1,1,0,7,1100\n")) << csv;
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 1 + 4 + 8 + 8);
}

TEST(GemmTrace, TheCommandSaysWhatItNeeds) {
  EXPECT_EQ(hmoe::test::run_cli("trace --tokens 4096").exit_code, 2);
  EXPECT_EQ(hmoe::test::run_cli("trace --model qwen3-30b-a3b").exit_code, 2);
  EXPECT_EQ(hmoe::test::run_cli("trace --model qwen3-30b-a3b --tokens 0").exit_code, 2);
  const hmoe::test::CommandResult help = hmoe::test::run_cli("trace --help");
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_TRUE(contains(help.output, "-DHMOE_GEMM_TRACE=ON")) << help.output;
  // A build without the timeline says how to get one (with it, the command needs a Hopper GPU).
  if (!gemm::trace::kCompiled) {
    const hmoe::test::CommandResult run = hmoe::test::run_cli("trace --model qwen3-30b-a3b --tokens 256");
    EXPECT_EQ(run.exit_code, 1) << run.output;
    EXPECT_TRUE(contains(run.output, "configure a build with -DHMOE_GEMM_TRACE=ON")) << run.output;
  }
}

}  // namespace
}  // namespace hmoe::testkit
