// How `hmoe tune` ranks its timings (tools/tune_choice.hpp): the analytic pair's priority margin,
// which close calls go to the final, and that a final's times decide among its finalists only.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "tune_choice.hpp"

namespace hmoe::tools {
namespace {

const std::string kAnalytic = "analytic";

TEST(TuneChoice, AnotherPairRanksAheadOfTheAnalyticOneOnlyByMoreThanTheMargin) {
  // 1.5 % faster: inside the margin, the analytic pair stays first.
  EXPECT_EQ(preference_order({{kAnalytic, 100.0}, {"b", 98.5}}, kAnalytic, {}).front(), kAnalytic);
  // 3 % faster: it goes first, the analytic pair second.
  const std::vector<std::string> order = preference_order({{kAnalytic, 100.0}, {"b", 97.0}}, kAnalytic, {});
  EXPECT_EQ(order, (std::vector<std::string>{"b", kAnalytic}));
  // Between two other pairs there is no margin.
  EXPECT_EQ(preference_order({{kAnalytic, 200.0}, {"b", 100.0}, {"c", 99.9}}, kAnalytic, {}),
            (std::vector<std::string>{"c", "b", kAnalytic}));
}

TEST(TuneChoice, OnlyCloseCallsGoToTheFinal) {
  // The analytic pair ranks at 100 / 1.02 = 98.04; 101.9 is inside 4 % of that, 102.1 is not.
  EXPECT_EQ(finalists({{kAnalytic, 100.0}, {"b", 101.9}}, kAnalytic), (std::vector<std::string>{kAnalytic, "b"}));
  EXPECT_TRUE(finalists({{kAnalytic, 100.0}, {"b", 102.1}}, kAnalytic).empty());
  // A clear winner alone: no final.
  EXPECT_TRUE(finalists({{kAnalytic, 100.0}, {"b", 80.0}}, kAnalytic).empty());
  EXPECT_TRUE(finalists({{kAnalytic, 100.0}}, kAnalytic).empty());
  // At most kMaxFinalists, the fastest ranked first.
  const std::vector<std::string> chosen =
      finalists({{"c", 100.5}, {kAnalytic, 103.0}, {"b", 100.0}, {"d", 101.0}}, kAnalytic);
  ASSERT_EQ(static_cast<int>(chosen.size()), kMaxFinalists);
  EXPECT_EQ(chosen[0], "b");
  EXPECT_EQ(chosen[1], "c");
}

TEST(TuneChoice, TheFinalDecidesAmongItsFinalistsWithTheSameMargin) {
  const std::vector<TimedPair> scan = {{kAnalytic, 885.7}, {"three_stage", 890.0}, {"other", 990.0}};
  // The scan ranked the analytic pair first; timed as `hmoe bench` times, the other pair is 4 % faster.
  EXPECT_EQ(preference_order(scan, kAnalytic, {{kAnalytic, 864.0}, {"three_stage", 830.0}}),
            (std::vector<std::string>{"three_stage", kAnalytic, "other"}));
  // Faster in the final by less than the margin: the analytic pair stays.
  EXPECT_EQ(preference_order(scan, kAnalytic, {{kAnalytic, 864.0}, {"three_stage", 850.0}}).front(), kAnalytic);
}

TEST(TuneChoice, FinalTimesAreNeverComparedWithScanTimes) {
  // The final ran slower overall (other conditions); a pair outside it with a scan time below the
  // finalists' final times must still rank after them.
  const std::vector<TimedPair> scan = {{kAnalytic, 100.0}, {"b", 101.0}, {"c", 110.0}};
  EXPECT_EQ(preference_order(scan, kAnalytic, {{kAnalytic, 130.0}, {"b", 120.0}}),
            (std::vector<std::string>{"b", kAnalytic, "c"}));
}

TEST(TuneChoice, FinalRoundsAlternateTheOrder) {
  const std::vector<std::string> pairs = {"a", "b"};
  EXPECT_EQ(final_round_order(pairs, 0), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(final_round_order(pairs, 1), (std::vector<std::string>{"b", "a"}));
  EXPECT_EQ(final_round_order(pairs, 2), pairs);
}

}  // namespace
}  // namespace hmoe::tools
