// `hmoe bench` without a GPU: every malformed option is one line naming it, then the usage, exit 2;
// --explain works for --spec and shows batch-invariant mode; the JSON/CSV renderings the scripts in
// bench/ read parse and carry every field; the model layer table covers every preset; the committed
// benchmark page is what bench/report.py makes of the committed results; scripts/ab-bench.py
// alternates its rounds and reads the rows back; scripts/rule-vs-points.py looks the analytic rule's
// pairs up in a tuner's points.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <unistd.h>

#include "dispatch/json.hpp"
#include "hmoe/hmoe.hpp"
#include "run_command.hpp"
#include "testkit/bench_report.hpp"
#include "testkit/device.hpp"
#include "testkit/model_layers.hpp"
#include "testkit/replay_timing.hpp"

namespace {

using hmoe::test::contains;
using CliResult = hmoe::test::CommandResult;

CliResult run_bench(const std::string& arguments) { return hmoe::test::run_cli("bench " + arguments); }

// The row `hmoe bench --explain` printed for T = tokens (it starts with T right-aligned in 6 columns), or ""
// where there is none.
std::string explain_row(const std::string& output, int tokens) {
  char prefix[16];
  std::snprintf(prefix, sizeof(prefix), "\n%6d ", tokens);
  const std::size_t at = output.find(prefix);
  return at == std::string::npos ? std::string() : output.substr(at + 1, output.find('\n', at + 1) - at - 1);
}

// One error line ("hmoe bench: ..." naming the problem), then the usage; exit 2.
void expect_usage_error(const std::string& arguments, const std::string& message_part) {
  const CliResult result = run_bench(arguments);
  const std::string context = "hmoe bench " + arguments + "\n" + result.output;
  EXPECT_EQ(result.exit_code, 2) << context;
  const std::string first_line = result.output.substr(0, result.output.find('\n'));
  EXPECT_EQ(first_line.rfind("hmoe bench: ", 0), 0u) << context;
  EXPECT_TRUE(contains(first_line, message_part)) << context;
  EXPECT_EQ(result.output.find("usage: hmoe bench"), first_line.size() + 1) << context;
}

TEST(BenchCli, HelpListsTheNewOptions) {
  const CliResult result = run_bench("--help");
  EXPECT_EQ(result.exit_code, 0) << result.output;
  for (const char* option : {"--spec", "--json", "--csv", "--peers", "--e2e", "--ceilings", "--batch-invariant",
                             "--explain", "--routing", "--tokens", "--dtype", "--skip", "--fused-decode", "--variant"})
    EXPECT_TRUE(contains(result.output, option)) << option << "\n" << result.output;
}

TEST(BenchCli, LayerSelection) {
  expect_usage_error("--model gpt-17", "gpt-17");
  expect_usage_error("--tokens 1", "--model");
  expect_usage_error("--model qwen3-30b-a3b --spec 8,2,4096,14336", "--spec");
}

TEST(BenchCli, MalformedSpecs) {
  for (const std::string spec : {"8,2,4096", "8,2,4096,14336,1", "8,2,x,14336", "8,,4096,14336", "8,2,4096,14336,",
                                 "0,2,4096,14336", "8,-2,4096,14336"})
    expect_usage_error("--spec '" + spec + "'", "--spec");
  expect_usage_error("--spec 8,2,100,128", "hidden");       // not a multiple of 64
  expect_usage_error("--spec 8,9,4096,14336", "top_k");     // k > E
}

TEST(BenchCli, MalformedTokenListsAndNonPositiveCounts) {
  for (const std::string tokens : {"1,,2", "1,x", "1,", "abc", "4.5", "0", "8,0", "-4"})
    expect_usage_error("--model qwen3-30b-a3b --tokens '" + tokens + "'", "--tokens");
  expect_usage_error("--spec 8,2,4096,14336 --tokens 0", "--tokens");
}

TEST(BenchCli, BadOptionValuesAndCombinations) {
  expect_usage_error("--model qwen3-30b-a3b --routing heavy", "--routing");
  expect_usage_error("--model qwen3-30b-a3b --peers torch", "--peers");
  expect_usage_error("--model qwen3-30b-a3b --dtype fp8-block --peers cublas", "--peers");
  expect_usage_error("--spec 8,2,4096,192 --dtype fp8-block", "multiple of 128");
  expect_usage_error("--model qwen3-30b-a3b --dtype fp16", "--dtype");
  expect_usage_error("--spec 8,2,4096,14336 --e2e", "--e2e");
  expect_usage_error("--model qwen3-30b-a3b --explain --json out.json", "--json");
  expect_usage_error("--model qwen3-30b-a3b --host-overhead --csv out.csv", "--csv");
  expect_usage_error("--model qwen3-30b-a3b --explain --e2e", "--e2e");
  expect_usage_error("--model qwen3-30b-a3b --explain --ceilings", "exclude");
  expect_usage_error("--ceilings --model qwen3-30b-a3b", "--model");
  expect_usage_error("--ceilings --peers cublas", "--peers");
  expect_usage_error("--model qwen3-30b-a3b --batch-invariant --orientation swap", "--batch-invariant");
  expect_usage_error("--model qwen3-30b-a3b --json", "--json needs a value");
}

// --skip (stage attribution) never mixes into reports: it rejects unknown or repeated stages and
// every output that feeds docs/BENCHMARKS.md.
TEST(BenchCli, SkipNamesStagesAndStaysOutOfReports) {
  expect_usage_error("--model qwen3-30b-a3b --skip gemm3", "unknown stage 'gemm3'");
  expect_usage_error("--model qwen3-30b-a3b --skip gemm1,gemm1", "given twice");
  expect_usage_error("--model qwen3-30b-a3b --skip gemm1,", "--skip");
  expect_usage_error("--model qwen3-30b-a3b --skip ','", "--skip");
  expect_usage_error("--model qwen3-30b-a3b --skip gemm1 --json out.json", "--json");
  expect_usage_error("--model qwen3-30b-a3b --skip gemm1 --csv out.csv", "--csv");
  expect_usage_error("--model qwen3-30b-a3b --skip gemm1 --peers cublas", "--peers");
  expect_usage_error("--model qwen3-30b-a3b --skip combine --e2e", "--e2e");
  expect_usage_error("--model qwen3-30b-a3b --skip combine --explain", "--skip");
}

TEST(BenchCli, ExplainWorksForSpecsAndShowsBatchInvariance) {
  CliResult result = run_bench("--spec 8,2,4096,14336 --tokens 1,4096 --explain");
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_TRUE(contains(result.output, "spec-E8-k2-H4096-I14336")) << result.output;
  EXPECT_TRUE(contains(result.output, "batch-invariant off")) << result.output;

  result = run_bench("--model qwen3-30b-a3b --tokens 1,4096 --batch-invariant --explain");
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_TRUE(contains(result.output, "batch-invariant on")) << result.output;
  // Both token counts run the one fixed plan, and say who chose it.
  std::size_t rows = 0;
  for (std::size_t at = result.output.find("batch-invariant\n"); at != std::string::npos;
       at = result.output.find("batch-invariant\n", at + 1))
    ++rows;
  EXPECT_EQ(rows, 2u) << result.output;
}

// --variant plans every T with the given pair (PlanOptions::force_variant), source "forced", even at
// T <= 4 (it implies --fused-decode off); a pair that does not exist or does not fit the layer, and
// the options that choose plans themselves, are usage errors.
TEST(BenchCli, VariantOptionForcesThePairAtEveryT) {
  const std::string pair = "swiglu_normal_t64_w128+weighted_normal_t64_w128";
  const CliResult result = run_bench("--model qwen3-30b-a3b --tokens 1,64,4096 --explain --variant " + pair);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  for (int tokens : {1, 64, 4096}) {
    const std::string row = explain_row(result.output, tokens);
    ASSERT_FALSE(row.empty()) << tokens << "\n" << result.output;
    EXPECT_TRUE(contains(row, "swiglu_normal_t64_w128 ")) << row;
    EXPECT_TRUE(contains(row, "weighted_normal_t64_w128 ")) << row;
    EXPECT_TRUE(contains(row, "forced")) << row;
  }
  expect_usage_error("--model qwen3-30b-a3b --variant nonsense", "--variant 'nonsense'");
  expect_usage_error("--model qwen3-30b-a3b --variant swiglu_swap_t8_w64+weighted_normal_t64_w128", "--variant");
  expect_usage_error("--model qwen3-30b-a3b --variant swiglu_normal_t64_w128_fp8block+weighted_normal_t64_w128_fp8block",
                     "--variant");
  expect_usage_error("--model qwen3-30b-a3b --variant " + pair + " --orientation normal", "--orientation");
  expect_usage_error("--model qwen3-30b-a3b --variant " + pair + " --batch-invariant", "--batch-invariant");
  expect_usage_error("--model qwen3-30b-a3b --variant " + pair + " --fused-decode on", "--fused-decode on");
  expect_usage_error("--model qwen3-30b-a3b --host-overhead --variant " + pair, "--variant");
  expect_usage_error("--ceilings --variant " + pair, "--variant");
  expect_usage_error("--model qwen3-30b-a3b --dtype fp8-block --static-scales", "--static-scales");
  expect_usage_error("--model qwen3-30b-a3b --static-scales", "--static-scales");
  expect_usage_error("--ceilings --static-scales", "--static-scales");
}

// --explain says where GEMM1 writes GEMM2's e4m3 input itself (PlanInfo::fused_requant, "+requant"): the
// 256-row block-scaled GEMM1 tiles do, narrower ones and the other schemes do not; and where it keeps the
// amax of its bf16 output for a dynamic per-tensor re-quantisation (PlanInfo::gemm1_amax, "+amax"): every
// fp8-tensor GEMM1, no fp8-channel or fp8-block one. HMOE_FUSED_REQUANT=0 (read at plan time) turns both off.
TEST(BenchCli, ExplainSaysWhereGemm1Requantizes) {
  const auto plan_column = [](const std::string& output) {
    const std::string row = explain_row(output, 4096);
    EXPECT_FALSE(row.empty()) << output;
    return row;
  };
  const auto explain = [&](const std::string& arguments) {
    const CliResult result = run_bench("--model qwen3-30b-a3b --tokens 4096 --explain " + arguments);
    EXPECT_EQ(result.exit_code, 0) << result.output;
    return plan_column(result.output);
  };
  const std::string wide = "--dtype fp8-block --variant swiglu_normal_t128_w256_fp8block+weighted_normal_t128_w256_fp8block_s3";
  const std::string narrow = "--dtype fp8-block --variant swiglu_normal_t64_w128_fp8block+weighted_normal_t64_w128_fp8block";
  const std::string tensor_wide = "--dtype fp8-tensor --variant swiglu_normal_t128_w256_fp8+weighted_normal_t128_w256_fp8_s3";
  const std::string tensor_swap = "--dtype fp8-tensor --variant swiglu_swap_t16_w64_fp8+weighted_swap_t16_w64_fp8";
  const std::string channel = "--dtype fp8-channel --variant swiglu_normal_t128_w256_fp8+weighted_normal_t128_w256_fp8_s3";
  std::string row = explain(wide);
  EXPECT_TRUE(contains(row, "+requant")) << row;
  EXPECT_FALSE(contains(row, "+amax")) << row;
  row = explain(narrow);
  EXPECT_FALSE(contains(row, "+requant") || contains(row, "+amax")) << row;
  for (const std::string& tensor : {tensor_wide, tensor_swap}) {
    row = explain(tensor);
    EXPECT_TRUE(contains(row, "+amax")) << row;
    EXPECT_FALSE(contains(row, "+requant")) << row;
  }
  row = explain(channel);
  EXPECT_FALSE(contains(row, "+requant") || contains(row, "+amax")) << row;
  // Static fp8-tensor scales: no tile keeps an amax; the 256-row tiles write e4m3 under them unless
  // HMOE_STATIC_REQUANT=0, and only where I % 128 == 0.
  setenv("HMOE_STATIC_REQUANT", "0", 1);
  row = explain(tensor_wide + " --static-scales");
  EXPECT_FALSE(contains(row, "+requant") || contains(row, "+amax")) << row;
  unsetenv("HMOE_STATIC_REQUANT");
  row = explain(tensor_wide + " --static-scales");
  EXPECT_TRUE(contains(row, "+requant")) << row;
  EXPECT_FALSE(contains(row, "+amax")) << row;
  row = explain(tensor_swap + " --static-scales");
  EXPECT_FALSE(contains(row, "+requant") || contains(row, "+amax")) << row;
  const CliResult odd = run_bench("--spec 8,2,256,320 --tokens 4096 --explain " + tensor_wide + " --static-scales");
  EXPECT_EQ(odd.exit_code, 0) << odd.output;
  EXPECT_FALSE(contains(plan_column(odd.output), "+requant")) << odd.output;
  setenv("HMOE_FUSED_REQUANT", "0", 1);
  for (const std::string& fused : {wide, tensor_wide, tensor_swap, tensor_wide + " --static-scales"}) {
    row = explain(fused);
    EXPECT_FALSE(contains(row, "+requant") || contains(row, "+amax")) << fused << ": " << row;
  }
  unsetenv("HMOE_FUSED_REQUANT");
}

// --split-k N is a ceiling (PlanOptions::split_k): where a GEMM splits fewer ways than asked -- too many
// output tiles for the partials buffer (qwen3-30b-a3b T = 7), too short a K (its GEMM2 at T = 1), the
// normal orientation (T = 4096) -- the plan column says "(asked N)"; where both reach N, and without
// --split-k, it does not.
TEST(BenchCli, SplitKSaysWhereItWasCapped) {
  const auto plan_row = [](const std::string& arguments, int tokens) {
    const CliResult result = run_bench("--model qwen3-30b-a3b --tokens 1,7,4096 --explain " + arguments);
    EXPECT_EQ(result.exit_code, 0) << result.output;
    const std::string row = explain_row(result.output, tokens);
    EXPECT_FALSE(row.empty()) << result.output;
    return row;
  };
  EXPECT_TRUE(contains(plan_row("--split-k 4", 1), "split-K 4/1 (asked 4)")) << plan_row("--split-k 4", 1);
  EXPECT_TRUE(contains(plan_row("--split-k 4", 7), "split-K 1/1 (asked 4)")) << plan_row("--split-k 4", 7);
  EXPECT_TRUE(contains(plan_row("--split-k 4", 4096), "normal 256x128 split-K 1/1 (asked 4)"))
      << plan_row("--split-k 4", 4096);
  for (const std::string& arguments : {std::string(), std::string("--split-k 1"), std::string("--split-k auto")})
    for (int tokens : {1, 7, 4096}) {
      const std::string row = plan_row(arguments, tokens);
      EXPECT_FALSE(contains(row, "asked")) << arguments << " T=" << tokens << ": " << row;
    }
  // Both GEMMs reach the count asked (olmoe-1b-7b at T = 1: few tiles, K = 2048 and 1024):
  const CliResult both = run_bench("--model olmoe-1b-7b --tokens 1 --explain --split-k 2");
  EXPECT_EQ(both.exit_code, 0) << both.output;
  EXPECT_TRUE(contains(both.output, "split-K 2/2")) << both.output;
  EXPECT_FALSE(contains(both.output, "asked")) << both.output;
}

// --fused-decode reaches the runner (PlanOptions::fused_decode): on puts the fused layer at T <= 4
// with "option" as who chose it, off and auto without a table never; bad values and combinations
// are usage errors.
TEST(BenchCli, FusedDecodeOptionReachesThePlan) {
  if (std::getenv("HMOE_FUSED_DECODE") != nullptr) GTEST_SKIP() << "HMOE_FUSED_DECODE is set: it overrides the plans";
  CliResult result = run_bench("--model qwen3-30b-a3b --tokens 1,4,5 --explain --fused-decode on");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  for (int tokens : {1, 4}) {
    EXPECT_TRUE(contains(explain_row(result.output, tokens), "fused layer")) << tokens << "\n" << result.output;
    EXPECT_TRUE(contains(explain_row(result.output, tokens), "option")) << tokens << "\n" << result.output;
  }
  EXPECT_FALSE(contains(explain_row(result.output, 5), "fused layer")) << result.output;
  EXPECT_FALSE(explain_row(result.output, 5).empty()) << result.output;
  result = run_bench("--model qwen3-30b-a3b --tokens 1 --explain --fused-decode off");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_FALSE(contains(explain_row(result.output, 1), "fused layer")) << result.output;
  EXPECT_FALSE(explain_row(result.output, 1).empty()) << result.output;
  expect_usage_error("--model qwen3-30b-a3b --fused-decode yes", "--fused-decode 'yes': expected auto, on or off");
  expect_usage_error("--model qwen3-30b-a3b --skip gemm1 --fused-decode on", "--fused-decode on");
  expect_usage_error("--model qwen3-30b-a3b --host-overhead --fused-decode on", "--fused-decode");
  expect_usage_error("--ceilings --fused-decode on", "--fused-decode");
  const CliResult check = hmoe::test::run_cli("check --model qwen3-30b-a3b --fused-decode maybe");
  EXPECT_EQ(check.exit_code, 2) << check.output;
  EXPECT_TRUE(contains(check.output, "--fused-decode 'maybe'")) << check.output;
}

TEST(BenchCli, TimedModesSayWhenThereIsNoHopperGpu) {
  if (hmoe::testkit::hopper_gpu_available(nullptr)) GTEST_SKIP() << "a Hopper GPU is present: nothing to refuse";
  for (const std::string arguments : {"--ceilings", "--model qwen3-30b-a3b --peers cublas --e2e --json /tmp/unused.json",
                                      "--spec 8,2,4096,14336 --csv /tmp/unused.csv"}) {
    const CliResult result = run_bench(arguments);
    EXPECT_EQ(result.exit_code, 1) << arguments << "\n" << result.output;
    EXPECT_TRUE(contains(result.output, "no Hopper GPU")) << arguments << "\n" << result.output;
  }
}

TEST(BenchModelLayers, EveryPresetHasALayerCount) {
  for (const std::string& name : hmoe::preset_names()) EXPECT_TRUE(hmoe::testkit::moe_layers(name).has_value()) << name;
  EXPECT_EQ(hmoe::testkit::moe_layers("mixtral-8x7b"), 32);
  EXPECT_EQ(hmoe::testkit::moe_layers("qwen3-30b-a3b"), 48);
  EXPECT_EQ(hmoe::testkit::moe_layers("qwen3-235b-a22b-tp4"), 94);
  EXPECT_EQ(hmoe::testkit::moe_layers("deepseek-v3-tp8"), 58);
  EXPECT_EQ(hmoe::testkit::moe_layers("olmoe-1b-7b"), 16);
  EXPECT_FALSE(hmoe::testkit::moe_layers("gpt-17").has_value());
}

hmoe::testkit::BenchReport sample_report() {
  hmoe::testkit::BenchReport report;
  report.command = "hmoe bench --model qwen3-30b-a3b --tokens 1 --peers cublas";
  report.device = "NVIDIA H200 (132 SMs, \"quoted\")";
  report.cuda_runtime_version = 13000;
  report.date_utc = "2026-12-02T00:00:00Z";
  report.ceilings = hmoe::testkit::ReportCeilings{4200.0, 4300.0, 4300.0, 800.0, std::nullopt};
  hmoe::testkit::ReportLayer layer;
  layer.name = "qwen3-30b-a3b";
  layer.spec = hmoe::preset("qwen3-30b-a3b");
  layer.routing = "uniform";
  layer.orientation = "auto";
  layer.input_sets = 2;
  layer.moe_layers = 48;
  report.layer = layer;
  hmoe::testkit::ReportRow hmoe_row;
  hmoe_row.impl = "hmoe";
  hmoe_row.num_tokens = 1;
  hmoe_row.median_us = 40.0;
  hmoe_row.floor_us = 17.0;
  hmoe_row.variant = "swap 64x8";
  hmoe_row.variant_source = "tuned:E=128,N=768.json";
  hmoe_row.tokens_per_expert = {{1, 0, 2}, {0, 3, 0}};
  hmoe::testkit::ReportRow peer_row;
  peer_row.impl = "cublas-loop";
  peer_row.num_tokens = 1;
  peer_row.median_us = 80.0;
  peer_row.hmoe_over_peer = 0.5;
  report.rows = {hmoe_row, peer_row};
  return report;
}

TEST(BenchReport, JsonParsesAndCarriesTheRows) {
  const hmoe::dispatch::JsonValue json = hmoe::dispatch::parse_json(hmoe::testkit::to_json(sample_report()));
  ASSERT_TRUE(json.is_object());
  EXPECT_EQ(json.find("schema")->string, "hmoe-bench/1");
  EXPECT_EQ(json.find("device")->string, "NVIDIA H200 (132 SMs, \"quoted\")");
  EXPECT_EQ(json.find("ceilings")->find("bf16_gemm_tflop_per_s")->number, 800.0);
  EXPECT_EQ(json.find("ceilings")->find("fp8_gemm_tflop_per_s")->kind, hmoe::dispatch::JsonValue::Kind::kNull);
  EXPECT_EQ(json.find("layer")->find("moe_layers")->number, 48.0);
  EXPECT_EQ(json.find("layer")->find("E")->number, 128.0);
  const hmoe::dispatch::JsonValue& rows = *json.find("rows");
  ASSERT_EQ(rows.items.size(), 2u);
  EXPECT_EQ(rows.items[0].find("impl")->string, "hmoe");
  EXPECT_EQ(rows.items[0].find("median_us")->number, 40.0);
  EXPECT_EQ(rows.items[0].find("tokens_per_expert")->items.size(), 2u);
  EXPECT_EQ(rows.items[0].find("tokens_per_expert")->items[1].items[1].number, 3.0);
  EXPECT_EQ(rows.items[0].find("hmoe_over_peer")->kind, hmoe::dispatch::JsonValue::Kind::kNull);
  EXPECT_EQ(rows.items[1].find("hmoe_over_peer")->number, 0.5);
}

TEST(BenchReport, CsvHasOneLinePerRowAndQuotesCommas) {
  const std::string csv = hmoe::testkit::to_csv(sample_report());
  EXPECT_EQ(csv.rfind("impl,T,median_us,", 0), 0u) << csv;
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 3) << csv;
  EXPECT_TRUE(contains(csv, "\"tuned:E=128,N=768.json\"")) << csv;
  EXPECT_TRUE(contains(csv, "cublas-loop,1,80,")) << csv;
}

}  // namespace

namespace {

// bench/report.py turns the newest H200 results committed under bench/results/ back into the page:
// it runs without a GPU, and the committed page is what it writes (no hand edits, no drift).
TEST(ReportPage, RegeneratesFromTheCommittedResults) {
  namespace fs = std::filesystem;
  const fs::path root = HMOE_SOURCE_DIR;
  std::vector<fs::path> runs;
  for (const auto& entry : fs::directory_iterator(root / "bench" / "results"))
    if (entry.is_directory()) runs.push_back(entry.path());
  ASSERT_FALSE(runs.empty()) << "no results under bench/results";
  std::sort(runs.begin(), runs.end());   // dated folders: the last is the newest
  const fs::path page = fs::path(::testing::TempDir()) / "BENCHMARKS.regenerated.md";
  const hmoe::test::CommandResult result = hmoe::test::run_command(
      "python3 '" + (root / "bench" / "report.py").string() + "' '" + runs.back().string() + "' '" + page.string() + "'");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const auto read = [](const fs::path& path) {
    std::ifstream file(path);
    return std::string(std::istreambuf_iterator<char>(file), {});
  };
  const std::string regenerated = read(page);
  for (const char* section : {"## Ceilings", "## Model level", "## Repeatability", "@fp8-block"})
    EXPECT_TRUE(contains(regenerated, section)) << section;
  EXPECT_EQ(regenerated, read(root / "docs" / "BENCHMARKS.md"))
      << "docs/BENCHMARKS.md differs from what bench/report.py makes of " << runs.back()
      << ": commit the results bench/report.sh produced with the page";
}

}  // namespace

namespace {

// Replays rotate over input sets that take different times: the reported time is the mean of each
// set's median, which a small shift of the mixture cannot move between the sets' modes.
TEST(ReplayTiming, MeanOfPerSetMedians) {
  // Replay i ran set i % 2: set 0 around 100 µs, set 1 around 110 µs.
  const std::vector<double> replays = {100.0, 110.0, 101.0, 111.0, 99.0, 109.0, 100.0, 110.0, 102.0, 112.0};
  const hmoe::testkit::ReplayTiming timing = hmoe::testkit::summarize_replays(replays, 2);
  EXPECT_EQ(timing.replays, 10);
  EXPECT_DOUBLE_EQ(timing.median_us, (100.0 + 110.0) / 2);   // set medians 100 and 110
  EXPECT_DOUBLE_EQ(timing.p10_us, 99.0);    // over all replays
  EXPECT_DOUBLE_EQ(timing.p90_us, 111.0);
  // Two replays more, one of each set: the mean of the set medians barely moves.
  std::vector<double> more = replays;
  more.push_back(111.0);
  more.push_back(100.5);
  const hmoe::testkit::ReplayTiming shifted = hmoe::testkit::summarize_replays(more, 2);
  EXPECT_LT(std::abs(shifted.median_us - timing.median_us) / timing.median_us, 0.01);
  EXPECT_THROW(hmoe::testkit::summarize_replays({1.0}, 2), hmoe::Error);
}

}  // namespace

namespace {

namespace fs = std::filesystem;

// scripts/ab-bench.py, the device sessions' A/B of two builds: rounds alternate ABBA, each layer's
// rows are read back from `hmoe bench --json`, and the ratio is of the rounds' means. Run here with
// two stand-in `hmoe` scripts that write fixed rows (GEMM1 g1 up to T = 256, g3 above); `info` prints
// build "<side>" (folder c: "a").
class AbBench : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::path(::testing::TempDir()) / ("ab-bench-" + std::to_string(::getpid()));
    for (const auto& [side, median] : {std::pair{"a", 100.0}, {"b", 90.0}, {"c", 100.0}}) {
      fs::create_directories(root_ / side);
      const fs::path fake = root_ / side / "hmoe";
      std::ofstream file(fake);
      // Writes one row per --tokens entry with this side's median, and logs the call.
      file << "#!/usr/bin/env python3\nimport json, sys\nargs = sys.argv[1:]\n"
           << "if args[0] == 'info':\n    print('hmoe 0.1.0 (build " << (std::string(side) == "c" ? "a" : side)
           << ")')\n    print('device: none')\n    sys.exit(0)\n"
           << "tokens = [int(t) for t in args[args.index('--tokens') + 1].split(',')]\n"
           << "out = args[args.index('--json') + 1]\n"
           << "open('" << (root_ / "calls.log").string() << "', 'a').write('" << side << " ' + ' '.join(args) + '\\n')\n"
           << "rows = [{'impl': 'hmoe', 'T': t, 'median_us': " << median << " + t, "
           << "'gemm1': 'g1' if t <= 256 else 'g3', 'gemm2': 'g2'} for t in tokens]\n"
           << "json.dump({'rows': rows}, open(out, 'w'))\n";
      file.close();
      fs::permissions(fake, fs::perms::owner_all);
    }
  }
  void TearDown() override { fs::remove_all(root_); }

  hmoe::test::CommandResult ab(const std::string& arguments) const {
    return hmoe::test::run_command("python3 '" + (fs::path(HMOE_SOURCE_DIR) / "scripts" / "ab-bench.py").string() +
                                   "' " + arguments);
  }

  fs::path root_;
};

TEST_F(AbBench, AlternatesRoundsAndReportsTheRatioOfMeans) {
  const hmoe::test::CommandResult result =
      ab("--a '" + (root_ / "a").string() + "' --b '" + (root_ / "b").string() + "' --rounds 2 qwen3-30b-a3b:fp8-block:1,256");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  std::ifstream log(root_ / "calls.log");
  std::vector<char> order;
  for (std::string line; std::getline(log, line);) order.push_back(line[0]);
  EXPECT_EQ(order, (std::vector<char>{'a', 'b', 'b', 'a'}));
  // T = 256: A 356 µs, B 346 µs in both rounds.
  EXPECT_TRUE(contains(result.output, "356.0 / 356.0")) << result.output;
  EXPECT_TRUE(contains(result.output, "346.0 / 346.0")) << result.output;
  EXPECT_TRUE(contains(result.output, "0.972x")) << result.output;
  EXPECT_TRUE(contains(result.output, "plans: A g1+g2; B g1+g2")) << result.output;
  EXPECT_TRUE(contains(result.output, "build A: " + (root_ / "a").string() + ": hmoe 0.1.0 (build a)\n")) << result.output;
  EXPECT_TRUE(contains(result.output, "build B: " + (root_ / "b").string() + ": hmoe 0.1.0 (build b)\n")) << result.output;
  EXPECT_FALSE(contains(result.output, "WARNING")) << result.output;
}

// A layer whose T run different plans lists each T's plan, in the order the layer gave them.
TEST_F(AbBench, ListsEachTsPlanWhenThePlansDiffer) {
  const hmoe::test::CommandResult result =
      ab("--a '" + (root_ / "a").string() + "' --b '" + (root_ / "b").string() + "' --rounds 1 qwen3-30b-a3b:bf16:4096,16");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_TRUE(contains(result.output, "plans: A T=4096 g3+g2, T=16 g1+g2; B T=4096 g3+g2, T=16 g1+g2")) << result.output;
}

// Folder c holds a binary that reports folder a's build: the A/B still runs, under a warning.
TEST_F(AbBench, WarnsWhenTwoFoldersHoldTheSameBuild) {
  const hmoe::test::CommandResult result =
      ab("--a '" + (root_ / "a").string() + "' --b '" + (root_ / "c").string() + "' --rounds 1 qwen3-30b-a3b:fp8-block:1");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_TRUE(contains(result.output, "WARNING: A and B are different folders with the same build")) << result.output;
  // One folder with two environments is one build on purpose: no warning.
  const hmoe::test::CommandResult one =
      ab("--a '" + (root_ / "a").string() + "' --b-env X=1 --rounds 1 qwen3-30b-a3b:fp8-block:1");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  EXPECT_FALSE(contains(one.output, "WARNING")) << one.output;
}

TEST_F(AbBench, OneBuildNeedsTwoVariantsAndLayersAreChecked) {
  const std::string a = "--a '" + (root_ / "a").string() + "' ";
  EXPECT_EQ(ab(a + "qwen3-30b-a3b:bf16:4096").exit_code, 2);
  EXPECT_EQ(ab(a + "qwen3-30b-a3b:bf16").exit_code, 2);
  EXPECT_EQ(ab(a + "qwen3-30b-a3b:bf16:0").exit_code, 2);
  const hmoe::test::CommandResult dry = ab(a + "--dry-run qwen3-30b-a3b:bf16:4096:x+y/-");
  ASSERT_EQ(dry.exit_code, 0) << dry.output;
  EXPECT_TRUE(contains(dry.output, "round 1 A: ")) << dry.output;
  EXPECT_TRUE(contains(dry.output, "--variant x+y")) << dry.output;
  EXPECT_TRUE(contains(dry.output, "round 2 A: ")) << dry.output;
  // One build, one variant, two environments.
  const hmoe::test::CommandResult env = ab(a + "--b-env HMOE_GEMM2_STORE=copy --dry-run qwen3-30b-a3b:bf16:4096");
  ASSERT_EQ(env.exit_code, 0) << env.output;
  EXPECT_TRUE(contains(env.output, "round 1 B: HMOE_GEMM2_STORE=copy ")) << env.output;
  EXPECT_EQ(ab(a + "--b-env NOEQUALS qwen3-30b-a3b:bf16:4096").exit_code, 2);
  // DTYPE fp8-tensor+static: the bench's --static-scales.
  const hmoe::test::CommandResult fixed = ab(a + "--b-env X=1 --dry-run qwen3-30b-a3b:fp8-tensor+static:4096");
  ASSERT_EQ(fixed.exit_code, 0) << fixed.output;
  EXPECT_TRUE(contains(fixed.output, "--dtype fp8-tensor --tokens 4096")) << fixed.output;
  EXPECT_TRUE(contains(fixed.output, "--static-scales")) << fixed.output;
}

// scripts/rule-vs-points.py: the analytic rule's pair at each T (asked of the real `hmoe bench
// --explain`, no GPU) over the best timed pair of a points file; a pair the file lacks is "pruned".
TEST(RuleVsPoints, DividesTheRulesPairByTheBestTimedPair) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("rule-vs-points-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string rule_4096 = "swiglu_normal_t128_w256_fp8block+weighted_normal_t128_w256_fp8block_s3";
  const std::string other = "swiglu_normal_t128_w128_fp8block+weighted_normal_t128_w128_fp8block";
  {
    std::ofstream points(dir / "points.json");
    points << "{\"points\": [{\"T\": 4096, \"variant\": \"" << rule_4096 << "\", \"us\": 110.0},\n"
           << "{\"T\": 4096, \"variant\": \"" << other << "\", \"us\": 100.0},\n"
           << "{\"T\": 4096, \"variant\": \"fused\", \"us\": 1.0},\n"
           << "{\"T\": 8192, \"variant\": \"" << other << "\", \"us\": 200.0}]}\n";
  }
  const hmoe::test::CommandResult result = hmoe::test::run_command(
      "python3 '" + (fs::path(HMOE_SOURCE_DIR) / "scripts" / "rule-vs-points.py").string() + "' --hmoe '" +
      HMOE_CLI_PATH + "' qwen3-30b-a3b:fp8-block=" + (dir / "points.json").string());
  fs::remove_all(dir);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  // T = 4096 (256 tokens per expert): the rule's 128×256 pair, 110 µs against the best 100 µs.
  EXPECT_TRUE(contains(result.output, "  4096      110.0      100.0      1.100  " + rule_4096 + " / " + other))
      << result.output;
  EXPECT_TRUE(contains(result.output, "  8192     pruned      200.0")) << result.output;
  EXPECT_TRUE(contains(result.output, "geomean rule/best over 1 timed buckets: 1.100")) << result.output;
}

}  // namespace
