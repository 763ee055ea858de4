// The dispatcher without a GPU: the kernel registry agrees with cmake's generated list and with the
// binary, plans only ever use variants whose constraints hold, tuned tables are read, looked up and
// rejected (with one warning) as docs/DISPATCH.md says, and the CLI exposes it all.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "dispatch/json.hpp"
#include "dispatch/plan.hpp"
#include "dispatch/registry.hpp"
#include "dispatch/tuned_table.hpp"
#include "hmoe/hmoe.hpp"
#include "permute/permute.hpp"
#include "run_command.hpp"
#include "testkit/device.hpp"

namespace hmoe::dispatch {
namespace {

namespace fs = std::filesystem;

constexpr const char* kDevice = "NVIDIA H200";
constexpr QuantScheme kEveryScheme[] = {QuantScheme::kNone, QuantScheme::kPerTensor, QuantScheme::kPerChannelPerToken,
                                        QuantScheme::kBlock128};

// A preset with bf16 weights (kNone) or FP8 weights in the given scheme.
MoeSpec preset_in(const std::string& name, QuantScheme scheme) {
  MoeSpec spec = preset(name);
  spec.scheme = scheme;
  spec.weight_dtype = scheme == QuantScheme::kNone ? WeightDType::kBF16 : WeightDType::kFP8E4M3;
  return spec;
}

std::string run_command(const std::string& command, int* exit_code) {
  const hmoe::test::CommandResult result = hmoe::test::run_command(command);
  *exit_code = result.exit_code;
  return result.output;
}

std::string cli(const std::string& arguments, int* exit_code) {
  return run_command(std::string("'") + HMOE_CLI_PATH + "' " + arguments, exit_code);
}

// A fresh directory under the system temp dir, removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "hmoe-tuned-XXXXXX").string();
    path_ = mkdtemp(pattern.data());
  }
  ~TempDir() {
    std::error_code error;
    fs::remove_all(path_, error);
  }
  const std::string& path() const { return path_; }
  std::string write(const std::string& name, const std::string& text) const {
    const std::string file = (fs::path(path_) / name).string();
    std::ofstream(file) << text;
    return file;
  }

 private:
  std::string path_;
};

// Sets HMOE_TUNED_DIR for one test.
class ScopedTunedDir {
 public:
  explicit ScopedTunedDir(const std::string& dir) { setenv(kTunedDirEnv, dir.c_str(), 1); }
  ~ScopedTunedDir() { unsetenv(kTunedDirEnv); }
};

std::string table_json(const MoeSpec& spec, const std::string& device, const std::string& buckets) {
  std::ostringstream text;
  text << "{\"format\": \"hmoe-tuned-v1\", \"device_name\": \"" << device << "\", \"dtype\": \"bf16\", \"E\": "
       << spec.num_experts << ", \"N\": " << spec.intermediate << ", \"K\": " << spec.hidden
       << ", \"buckets\": {" << buckets << "}}";
  return text.str();
}

// One bucket; extra: more members, e.g. ", \"fused\": true".
std::string bucket(int tokens, const std::string& gemm1, const std::string& gemm2, const std::string& extra = "") {
  return "\"" + std::to_string(tokens) + "\": {\"gemm1\": \"" + gemm1 + "\", \"gemm2\": \"" + gemm2 + "\", \"us\": 1.5" +
         extra + "}";
}

// ---- JSON reader -------------------------------------------------------------------------------

TEST(Json, ReadsTheFormatsHmoeWrites) {
  const JsonValue value = parse_json(R"( {"a": [1, -2.5e1, true, null], "b": {"c": "x\"\u00e9\n"}, "d": {}} )");
  ASSERT_TRUE(value.is_object());
  ASSERT_EQ(value.find("a")->items.size(), 4u);
  EXPECT_EQ(value.find("a")->items[1].number, -25.0);
  EXPECT_TRUE(value.find("a")->items[2].boolean);
  EXPECT_EQ(value.find("b")->find("c")->string, "x\"\xc3\xa9\n");
  EXPECT_TRUE(value.find("d")->is_object());
  EXPECT_EQ(value.find("missing"), nullptr);
  EXPECT_EQ(parse_json(json_quote("tab\there \"q\" \\")).string, "tab\there \"q\" \\");
}

TEST(Json, ErrorsSayWhere) {
  for (const char* bad : {"", "{", "{\"a\" 1}", "{\"a\": 1,}", "[1 2]", "{\"a\": tru}", "\"open", "01x", "{} {}",
                          "{\"a\": 1.}", "[\"\\q\"]"}) {
    EXPECT_THROW(parse_json(bad), JsonError) << bad;
  }
  try {
    parse_json("{\n  \"a\": [1,\n  ]\n}");
    FAIL() << "no error";
  } catch (const JsonError& error) {
    EXPECT_NE(std::string(error.what()).find("line 3"), std::string::npos) << error.what();
  }
}

// ---- Registry -----------------------------------------------------------------------------------

// cmake/kernels.cmake's list, entry by entry: "name epilogue swap_ab token_tile weight_tile stages gather".
std::map<std::string, std::vector<std::string>> cmake_variant_list() {
  std::ifstream file(std::string(HMOE_SOURCE_DIR) + "/cmake/kernels.cmake");
  std::stringstream text;
  text << file.rdbuf();
  const std::string content = text.str();
  const std::size_t begin = content.find("set(HMOE_GEMM_VARIANTS");
  const std::size_t end = content.find(')', begin);
  std::map<std::string, std::vector<std::string>> entries;
  if (begin == std::string::npos) return entries;
  const std::string list = content.substr(begin, end - begin);
  const std::regex entry_pattern("\"([^\"]+)\"");
  for (auto match = std::sregex_iterator(list.begin(), list.end(), entry_pattern); match != std::sregex_iterator(); ++match) {
    std::istringstream fields((*match)[1].str());
    std::vector<std::string> values;
    for (std::string field; fields >> field;) values.push_back(field);
    if (!values.empty()) entries[values[0]] = values;
  }
  return entries;
}

TEST(Registry, AgreesWithTheCmakeList) {
  const auto entries = cmake_variant_list();
  ASSERT_FALSE(entries.empty()) << "could not read HMOE_GEMM_VARIANTS from cmake/kernels.cmake";
  std::set<std::string> registered;
  for (const gemm::GemmVariant& variant : gemm::gemm_variants()) {
    registered.insert(variant.name);
    const auto entry = entries.find(variant.name);
    ASSERT_NE(entry, entries.end()) << variant.name << " is registered but not in cmake/kernels.cmake";
    const std::vector<std::string>& fields = entry->second;
    ASSERT_EQ(fields.size(), 8u) << variant.name;
    EXPECT_EQ(fields[1], variant.epilogue == gemm::EpilogueKind::kSwiGlu ? "kSwiGlu" : "kRoutingWeight") << variant.name;
    EXPECT_EQ(fields[2], variant.swap_ab ? "true" : "false") << variant.name;
    EXPECT_EQ(std::stoi(fields[3]), variant.token_tile) << variant.name;
    EXPECT_EQ(std::stoi(fields[4]), variant.weight_tile) << variant.name;
    EXPECT_EQ(std::stoi(fields[5]), variant.stages) << variant.name;
    EXPECT_EQ(fields[6], variant.gather_tokens ? "true" : "false") << variant.name;
    const char* quant = variant.quant == gemm::QuantKind::kNone            ? "kNone"
                        : variant.quant == gemm::QuantKind::kEpilogueScale ? "kEpilogueScale"
                                                                           : "kBlockScale";
    EXPECT_EQ(fields[7], quant) << variant.name;
  }
  for (const auto& [name, fields] : entries) EXPECT_TRUE(registered.count(name)) << name << " generated but not registered";
  std::printf("registry: %zu variants, all in cmake/kernels.cmake with the same constraints\n", registered.size());
}

TEST(Registry, PairsAreValidAndOrderedByGranule) {
  const MoeSpec spec = preset("qwen3-30b-a3b");
  const std::vector<PlanVariant> pairs = eligible_plan_variants(spec);
  ASSERT_FALSE(pairs.empty());
  for (std::size_t i = 0; i < pairs.size(); ++i) {
    std::string why;
    EXPECT_TRUE(valid_plan_variant(pairs[i], spec, &why)) << pairs[i].id() << ": " << why;
    EXPECT_EQ(parse_plan_variant(pairs[i].id(), spec).id(), pairs[i].id());
    if (i > 0) {
      EXPECT_LE(granule_rank(*pairs[i - 1].gemm1), granule_rank(*pairs[i].gemm1));
    }
  }
  std::printf("qwen3-30b-a3b: %zu eligible pairs, from %s to %s\n", pairs.size(), pairs.front().summary().c_str(),
              pairs.back().summary().c_str());
}

TEST(Registry, RejectsWhatCannotRun) {
  const MoeSpec spec = preset("qwen3-30b-a3b");
  EXPECT_THROW(parse_plan_variant("nonsense", spec), Error);
  EXPECT_THROW(parse_plan_variant("swiglu_swap_t8_w64+no_such_kernel", spec), Error);
  EXPECT_THROW(parse_plan_variant("swiglu_swap_t8_w64+weighted_swap_t16_w64", spec), Error);   // token tiles differ
  EXPECT_THROW(parse_plan_variant("weighted_swap_t8_w64+swiglu_swap_t8_w64", spec), Error);    // roles swapped
  MoeSpec fp8 = spec;
  fp8.weight_dtype = WeightDType::kFP8E4M3;
  fp8.scheme = QuantScheme::kBlock128;
  // A bf16 kernel for an FP8 layer, an FP8 kernel for a bf16 layer, the wrong FP8 scheme.
  std::string why;
  EXPECT_FALSE(supports(*find_gemm_variant_by_name("swiglu_swap_t8_w64"), fp8, &why));
  EXPECT_NE(why.find("reads bf16"), std::string::npos) << why;
  EXPECT_FALSE(supports(*find_gemm_variant_by_name("swiglu_swap_t8_w64_fp8block"), spec, &why));
  EXPECT_NE(why.find("fp8-block"), std::string::npos) << why;
  EXPECT_FALSE(supports(*find_gemm_variant_by_name("swiglu_swap_t8_w64_fp8"), fp8, &why));
  EXPECT_NE(why.find("fp8-tensor|fp8-channel"), std::string::npos) << why;
  EXPECT_THROW(parse_plan_variant("swiglu_swap_t8_w64_fp8+weighted_swap_t8_w64_fp8", fp8), Error);
  EXPECT_NO_THROW(parse_plan_variant("swiglu_swap_t8_w64_fp8block+weighted_swap_t8_w64_fp8block", fp8));
  // The gathering FP8 tiles take the schemes of their reading twins: the scales stay per sorted row.
  MoeSpec channel = fp8;
  channel.scheme = QuantScheme::kPerChannelPerToken;
  MoeSpec tensor = fp8;
  tensor.scheme = QuantScheme::kPerTensor;
  EXPECT_NO_THROW(parse_plan_variant("swiglu_normal_t128_w256_fp8_gather+weighted_normal_t128_w256_fp8_s3", channel));
  EXPECT_NO_THROW(parse_plan_variant("swiglu_normal_t128_w256_fp8_gather+weighted_normal_t128_w256_fp8_s3", tensor));
  EXPECT_NO_THROW(
      parse_plan_variant("swiglu_normal_t128_w256_fp8block_gather+weighted_normal_t128_w256_fp8block_s3", fp8));
  EXPECT_FALSE(supports(*find_gemm_variant_by_name("swiglu_normal_t128_w256_fp8block_gather"), tensor, &why));
  EXPECT_NE(why.find("fp8-block"), std::string::npos) << why;
}

// The analytic rule's orientation switch: Swap-AB up to 16 tokens per expert, bf16 and FP8 alike
// (measured on H200: the tuned tables of every preset run normal tiles from 32 tokens per expert on,
// docs/DISPATCH.md "The analytic rule"; FP8 Swap-AB tiles of 32-64 tokens lost to the normal ones by
// 19-23%, docs/PERF.md "FP8 v2").
TEST(Registry, AnalyticRuleSwitchesOrientationAt16TokensPerExpert) {
  // 128 experts, k = 8: tokens per expert = T / 16
  const MoeSpec bf16 = preset_in("qwen3-30b-a3b", QuantScheme::kNone);
  const MoeSpec fp8 = preset_in("qwen3-30b-a3b", QuantScheme::kBlock128);
  for (int tokens : {16, 256, 272, 512, 1024, 1040, 2048}) {
    const double per_expert = tokens / 16.0;
    EXPECT_EQ(choose_plan(bf16, tokens, Orientation::kAuto).swap_ab, per_expert <= 16.0) << "bf16 T=" << tokens;
    EXPECT_EQ(choose_plan(fp8, tokens, Orientation::kAuto).swap_ab, per_expert <= 16.0) << "fp8 T=" << tokens;
  }
}

// Token tiles hold twice the tokens per expert, bf16 and FP8 alike (what hmoe tune picked on every
// preset, H200); normal tiles take 256 weight rows at 128 tokens, bf16 and FP8 alike.
TEST(Registry, AnalyticRuleSizesTokenTilesForTwiceTheTokensPerExpert) {
  const MoeSpec bf16_spec = preset_in("qwen3-30b-a3b", QuantScheme::kNone);   // tokens per expert = T / 16
  const MoeSpec fp8_spec = preset_in("qwen3-30b-a3b", QuantScheme::kBlock128);
  struct Row { int tokens; bool swap; int tile; int weight_tile; };
  for (const Row row : {Row{1, true, 8, 64}, Row{64, true, 8, 64}, Row{100, true, 16, 128}, Row{128, true, 16, 128},
                        Row{256, true, 32, 128}, Row{512, false, 64, 128}, Row{1024, false, 128, 256},
                        Row{2048, false, 128, 256}}) {
    const Plan bf16 = choose_plan(bf16_spec, row.tokens, Orientation::kAuto);
    EXPECT_EQ(bf16.swap_ab, row.swap) << "bf16 T=" << row.tokens;
    EXPECT_EQ(bf16.token_tile, row.tile) << "bf16 T=" << row.tokens;
    EXPECT_EQ(bf16.gemm1->weight_tile, row.weight_tile) << "bf16 T=" << row.tokens;
    const Plan fp8 = choose_plan(fp8_spec, row.tokens, Orientation::kAuto);
    EXPECT_EQ(fp8.swap_ab, row.swap) << "fp8 T=" << row.tokens;
    EXPECT_EQ(fp8.token_tile, row.tile) << "fp8 T=" << row.tokens;
    EXPECT_EQ(fp8.gemm1->weight_tile, row.weight_tile) << "fp8 T=" << row.tokens;
  }
}

// FP8 128-token normal tiles take 256 weight rows (two 128-row halves), both GEMMs, every scheme — as
// bf16 ones do; 64-token tiles 128 rows (docs/DISPATCH.md, "Who decides, in order").
TEST(Registry, AnalyticRuleTakesWideFp8TilesWithTheirTokenTiles) {
  for (QuantScheme scheme : {QuantScheme::kPerTensor, QuantScheme::kPerChannelPerToken, QuantScheme::kBlock128}) {
    for (const char* name : {"qwen3-30b-a3b", "deepseek-v3-tp8", "mixtral-8x7b"}) {
      const MoeSpec spec = preset_in(name, scheme);
      for (int tokens : {256, 512, 1024, 2048, 4096, 8192, 16384}) {
        const double per_expert = static_cast<double>(tokens) * spec.top_k / spec.num_experts;
        const Plan plan = choose_plan(spec, tokens, Orientation::kAuto);
        const std::string where = std::string(name) + " " + to_string(scheme) + " T=" + std::to_string(tokens);
        if (plan.swap_ab) {
          EXPECT_LE(plan.gemm1->weight_tile, 128) << where;
          continue;
        }
        EXPECT_EQ(plan.token_tile, per_expert >= 64.0 ? 128 : 64) << where;
        const int expected = plan.token_tile == 128 ? 256 : 128;
        EXPECT_EQ(plan.gemm1->weight_tile, expected) << where;
        EXPECT_EQ(plan.gemm2->weight_tile, expected) << where;
        EXPECT_EQ(plan.gemm1->quant, gemm::quant_kind(spec)) << where;
      }
    }
  }
}

// GEMM2's 128×256 normal tiles run 3 stages in bf16 too: the only depth whose 64 KB output tile fits
// beside the stages (TMA store); the 4-stage bf16 tile, which writes from the fragment, stays for the tuner.
TEST(Registry, AnalyticRuleRunsWideGemm2TilesAtThreeStages) {
  for (QuantScheme scheme : {QuantScheme::kNone, QuantScheme::kPerTensor, QuantScheme::kBlock128}) {
    for (const char* name : {"qwen3-30b-a3b", "deepseek-v3-tp8", "mixtral-8x7b"}) {
      const MoeSpec spec = preset_in(name, scheme);
      for (int tokens : {256, 1024, 4096, 16384}) {
        const Plan plan = choose_plan(spec, tokens, Orientation::kAuto);
        const std::string where = std::string(name) + " " + to_string(scheme) + " T=" + std::to_string(tokens);
        if (plan.swap_ab || plan.gemm2->weight_tile != 256) continue;
        EXPECT_EQ(plan.gemm2->stages, 3) << where;
      }
    }
  }
  const Plan bf16 = choose_plan(preset_in("qwen3-30b-a3b", QuantScheme::kNone), 16384, Orientation::kAuto);
  EXPECT_STREQ(bf16.gemm2->name, "weighted_normal_t128_w256_s3");
  EXPECT_STREQ(bf16.gemm1->name, "swiglu_normal_t128_w256");
  EXPECT_NE(gemm::find_gemm_variant(gemm::EpilogueKind::kRoutingWeight, gemm::QuantKind::kNone, false, 128, 256, false, 4),
            nullptr)
      << "the 4-stage bf16 tile stays compiled for the tuner";
}

// Every FP8 layer plans only variants of its own scheme, at every T, in every orientation.
TEST(Registry, Fp8SchemesPlanTheirOwnVariants) {
  for (const std::string name : {"qwen3-30b-a3b", "deepseek-v3-tp8", "mixtral-8x7b"}) {
    for (QuantScheme scheme : {QuantScheme::kPerTensor, QuantScheme::kPerChannelPerToken, QuantScheme::kBlock128}) {
      MoeSpec spec = preset_in(name, scheme);
      const std::vector<PlanVariant> eligible = eligible_plan_variants(spec);
      ASSERT_FALSE(eligible.empty()) << name << " " << to_string(scheme);
      for (const PlanVariant& pair : eligible)
        EXPECT_EQ(pair.gemm1->quant, gemm::quant_kind(spec)) << pair.id();
      for (Orientation orientation : {Orientation::kAuto, Orientation::kNormal, Orientation::kSwapAB}) {
        for (int tokens : {1, 7, 64, 777, 4096, 16384}) {
          const Plan plan = choose_plan(spec, tokens, orientation);
          std::string why;
          EXPECT_TRUE(valid_plan_variant(PlanVariant{plan.gemm1, plan.gemm2}, spec, &why))
              << name << " " << to_string(scheme) << " T=" << tokens << ": " << why;
          EXPECT_FALSE(plan.gemm1->gather_tokens) << "FP8 quantises x in the gather kernel";
        }
      }
      spec.batch_invariant = true;
      EXPECT_EQ(plan_for(spec, 5, Orientation::kAuto).gemm1->quant, gemm::quant_kind(spec));
    }
  }
}

// choose_plan, over presets, odd shapes, token counts and orientations, only returns pairs whose
// constraints hold — with and without a tuned table.
TEST(Registry, ChoosePlanNeverPicksAVariantThatCannotRun) {
  std::vector<MoeSpec> specs;
  for (const std::string& name : preset_names()) specs.push_back(preset(name));
  MoeSpec odd = preset("olmoe-1b-7b");
  odd.hidden = 64 * 7;
  odd.intermediate = 64 * 3;
  specs.push_back(odd);
  MoeSpec wide = preset("qwen3-30b-a3b");
  wide.num_experts = 1024;
  wide.top_k = 32;
  specs.push_back(wide);
  int plans = 0;
  for (const MoeSpec& spec : specs) {
    const std::vector<PlanVariant> pairs = eligible_plan_variants(spec);
    PlanOverrides tuned;
    auto table = std::make_shared<TunedTable>();
    table->source = "tuned:test";
    for (std::size_t i = 0; i < pairs.size(); ++i)
      table->buckets.push_back(TunedBucket{1 << static_cast<int>(i), pairs[i], 1.0});
    tuned.tuned = table;
    for (int tokens : {1, 2, 3, 7, 8, 17, 63, 64, 65, 100, 255, 777, 1000, 4096, 5000, 12345, 16384, 65536, 1 << 20}) {
      for (Orientation orientation : {Orientation::kAuto, Orientation::kNormal, Orientation::kSwapAB}) {
        for (const PlanOverrides* overrides : {static_cast<const PlanOverrides*>(nullptr),
                                               static_cast<const PlanOverrides*>(&tuned)}) {
          const Plan plan = choose_plan(spec, tokens, orientation, overrides);
          std::string why;
          ASSERT_TRUE(valid_plan_variant(PlanVariant{plan.gemm1, plan.gemm2}, spec, &why))
              << "T=" << tokens << " " << to_string(orientation) << ": " << why;
          EXPECT_EQ(plan.token_tile, plan.gemm1->token_tile);
          EXPECT_EQ(plan.swap_ab, plan.gemm1->swap_ab);
          if (orientation != Orientation::kAuto) {
            EXPECT_EQ(plan.swap_ab, orientation == Orientation::kSwapAB) << "T=" << tokens;
          }
          EXPECT_EQ(plan.source, overrides != nullptr && orientation == Orientation::kAuto ? "tuned:test" : "analytic");
          ++plans;
        }
      }
    }
  }
  std::printf("%d plans checked against their variants' constraints\n", plans);
}

// ---- The split along K --------------------------------------------------------------------------

// The tile bound the grid and the split rule start from: never below what a routing can need (all
// pairs in distinct experts, or all in one), and k tiles at T = 1 rather than E.
TEST(SplitK, TileBoundHoldsForExtremeRoutings) {
  for (int experts : {8, 64, 256}) {
    for (int tile : {8, 16, 64}) {
      for (long long entries : {1LL, 2LL, 8LL, 16LL, 100LL, 1000LL, 8192LL}) {
        const long long spread = std::min<long long>(entries, experts);   // one row in each of the first experts...
        const long long rest = entries - spread;                           // ...the rest in expert 0
        const long long spread_tiles = spread - 1 + (1 + rest + tile - 1) / tile;
        const long long one_expert = (entries + tile - 1) / tile;
        const int bound = max_token_tiles(entries, experts, tile);
        EXPECT_GE(bound, spread_tiles) << experts << " " << tile << " " << entries;
        EXPECT_GE(bound, one_expert) << experts << " " << tile << " " << entries;
        EXPECT_LE(bound, entries);
      }
    }
  }
  EXPECT_EQ(max_token_tiles(8, 256, 8), 8);   // deepseek-v3 at T = 1: its 8 experts, one tile each
}

const gemm::GemmVariant& variant_named(const std::string& name) {
  for (const gemm::GemmVariant& variant : gemm::gemm_variants())
    if (name == variant.name) return variant;
  throw Error("no variant " + name);
}

TEST(SplitK, RuleSplitsOnlyWhereTheTilesLeaveSmsIdle) {
  const gemm::GemmVariant& bf16 = variant_named("swiglu_swap_t8_w64");
  const gemm::GemmVariant& fp8 = variant_named("swiglu_swap_t8_w64_fp8block");
  const gemm::GemmVariant& normal = variant_named("swiglu_normal_t64_w128");
  // deepseek-v3-tp8 GEMM1 at T = 1: 8 token tiles × 8 weight tiles on 132 SMs; K = 7168.
  EXPECT_EQ(choose_splits(fp8, 64, 7168, 132, 0), 2);
  EXPECT_EQ(choose_splits(bf16, 64, 7168, 132, 0), 2);
  // qwen3-235b-a22b-tp4 GEMM1 at T = 1: 8 × 12 = 96 tiles; four splits fill 2.9 waves.
  EXPECT_EQ(choose_splits(bf16, 96, 4096, 132, 0), 4);
  // A full wave already (qwen3-30b-a3b at T = 1: 192 tiles, where two splits measured slower): no split.
  EXPECT_EQ(choose_splits(bf16, 192, 2048, 132, 0), 1);
  EXPECT_EQ(choose_splits(bf16, 132, 7168, 132, 0), 1);
  EXPECT_EQ(choose_splits(bf16, 264, 7168, 132, 0), 1);
  // Too little K (GEMM2 of deepseek-v3-tp8: I = 256, 2 FP8 stages), normal tiles, no SM count, forced off.
  EXPECT_EQ(choose_splits(fp8, 8, 256, 132, 0), 1);
  EXPECT_EQ(choose_splits(normal, 8, 7168, 132, 0), 1);
  EXPECT_EQ(choose_splits(bf16, 64, 7168, 0, 0), 1);
  EXPECT_EQ(choose_splits(bf16, 64, 7168, 132, 1), 1);
  // Forced: as asked, capped by K (8+ stages a split, at most 8) and by the workspace's partials.
  EXPECT_EQ(choose_splits(bf16, 64, 7168, 132, 3), 3);
  EXPECT_EQ(choose_splits(bf16, 64, 7168, 132, 64), 8);
  EXPECT_EQ(choose_splits(bf16, 64, 2048, 132, 8), 4);     // 32 bf16 stages
  EXPECT_EQ(choose_splits(fp8, 64, 2048, 132, 8), 2);      // 16 FP8 stages
  const long long tiles_for_two = gemm::kSplitPartialFloats / (2 * 8 * 64);
  EXPECT_EQ(choose_splits(bf16, tiles_for_two, 7168, 132, 8), 2);
  EXPECT_EQ(choose_splits(bf16, tiles_for_two + 1, 7168, 132, 8), 1);
  EXPECT_EQ(choose_splits(bf16, gemm::kSplitCounters + 1, 7168, 132, 8), 1);
  // Whatever the inputs, the count fits K and the workspace.
  for (const gemm::GemmVariant& variant : gemm::gemm_variants()) {
    for (long long tiles : {1LL, 7LL, 64LL, 131LL, 200LL, 1000LL, 5000LL}) {
      for (int k : {128, 1024, 2048, 7168}) {
        for (int requested : {0, 2, 8}) {
          const int splits = choose_splits(variant, tiles, k, 132, requested);
          const int k_step = variant.quant == gemm::QuantKind::kNone ? 64 : 128;
          ASSERT_GE(splits, 1);
          if (splits == 1) continue;
          EXPECT_TRUE(variant.split_k) << variant.name;
          EXPECT_GE(k / k_step / splits, 8) << variant.name << " K=" << k;
          EXPECT_LE(tiles * splits * variant.token_tile * variant.weight_tile, gemm::kSplitPartialFloats);
        }
      }
    }
  }
}

// The warm-up's token count, checked by dealing its slots out as MoeRunner::warm_up does and
// counting the work items of the GEMM with fewer weight tiles.
TEST(WarmUp, TokensGiveEveryResidentCtaAWorkItem) {
  const auto work_items = [](const MoeSpec& small, int tokens, int token_tile, int weight_tile) {
    std::vector<long long> slots_of(small.num_experts, 0);
    for (long long slot = 0; slot < static_cast<long long>(tokens) * small.top_k; ++slot) ++slots_of[slot % small.num_experts];
    long long token_tiles = 0;
    for (long long count : slots_of) token_tiles += (count + token_tile - 1) / token_tile;
    return token_tiles * std::max(small.hidden / weight_tile, 1);
  };
  constexpr int kMost = 4096;
  for (const std::string& name : preset_names()) {
    MoeSpec small = preset(name);
    small.hidden = small.intermediate = 128;
    for (const auto& [token_tile, weight_tile] : std::vector<std::pair<int, int>>{{8, 64}, {16, 128}, {64, 128}, {128, 256}}) {
      for (const long long want : {1LL, 132LL, 4LL * 132, 4LL * 132 * 8}) {
        const int tokens = warm_up_tokens(small, token_tile, weight_tile, want, kMost);
        SCOPED_TRACE(name + " tile " + std::to_string(token_tile) + "x" + std::to_string(weight_tile) + " want " +
                     std::to_string(want) + " -> " + std::to_string(tokens) + " tokens");
        ASSERT_GE(tokens, 1);
        ASSERT_LE(tokens, kMost);
        if (tokens == kMost) continue;
        EXPECT_GE(work_items(small, tokens, token_tile, weight_tile), want);
        // Not wasteful: two token tiles an expert fewer would not do.
        const int two_rounds = 2 * ((small.num_experts * token_tile + small.top_k - 1) / small.top_k);
        if (tokens > two_rounds) EXPECT_LT(work_items(small, tokens - two_rounds, token_tile, weight_tile), want);
      }
    }
  }
  // qwen3-30b-a3b (E = 128, k = 8) on 132 SMs × 4 with 8×64 tiles: 3 token tiles an expert, 384 tokens.
  MoeSpec qwen3 = preset("qwen3-30b-a3b");
  qwen3.hidden = qwen3.intermediate = 128;
  EXPECT_EQ(warm_up_tokens(qwen3, 8, 64, 4 * 132, kMost), 384);
  EXPECT_EQ(warm_up_tokens(qwen3, 128, 256, 4 * 132 * 8, kMost), kMost);   // capped
}

TEST(SplitK, RunnerReportsItAndRejectsBadCounts) {
  PlanOptions options;
  options.max_tokens = 64;
  options.split_k = 3;
  const PlanInfo plan = MoeRunner(preset("deepseek-v3-tp8"), options).plan_info(1);
  EXPECT_EQ(plan.gemm1_splits, 3);
  EXPECT_EQ(plan.gemm2_splits, 1) << "GEMM2's K = I = 256 is too short to split";
  options.split_k = 1;
  EXPECT_EQ(MoeRunner(preset("deepseek-v3-tp8"), options).plan_info(1).gemm1_splits, 1);
  options.split_k = -1;
  try {
    MoeRunner runner(preset("deepseek-v3-tp8"), options);
    FAIL() << "no error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("PlanOptions.split_k = -1"), std::string::npos) << error.what();
  }
  MoeSpec invariant = preset("deepseek-v3-tp8");
  invariant.batch_invariant = true;
  options.split_k = 2;
  try {
    MoeRunner runner(invariant, options);
    FAIL() << "no error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("batch_invariant"), std::string::npos) << error.what();
  }
  options.split_k = 0;
  EXPECT_EQ(MoeRunner(invariant, options).plan_info(1).gemm1_splits, 1);
  EXPECT_EQ(workspace_layout(invariant, 64).split_partials, 0u) << "batch-invariant layers have no split region";
}

// ---- Tuned tables -------------------------------------------------------------------------------

TEST(TunedTable, FileNameFollowsTheServingEngineConvention) {
  EXPECT_EQ(tuned_file_name(preset("qwen3-30b-a3b"), kDevice), "E=128,N=768,K=2048,device_name=NVIDIA_H200,dtype=bf16.json");
  EXPECT_EQ(tuned_file_name(preset("deepseek-v3-tp8"), kDevice), "E=256,N=256,K=7168,device_name=NVIDIA_H200,dtype=bf16.json");
}

TEST(TunedTable, ReadsLooksUpNearestBucketAndDrivesThePlan) {
  const MoeSpec spec = preset("qwen3-30b-a3b");
  const TempDir dir;
  const std::string name = tuned_file_name(spec, kDevice);
  dir.write(name, table_json(spec, kDevice,
                             bucket(1, "swiglu_swap_t8_w64", "weighted_swap_t8_w64") + "," +
                                 bucket(64, "swiglu_swap_t32_w64", "weighted_swap_t32_w64") + "," +
                                 bucket(4096, "swiglu_normal_t128_w256", "weighted_normal_t128_w256")));
  std::string error;
  const auto table = read_tuned_table((fs::path(dir.path()) / name).string(), spec, kDevice, &error);
  ASSERT_NE(table, nullptr) << error;
  EXPECT_EQ(table->source, "tuned:" + name);
  ASSERT_EQ(table->buckets.size(), 3u);
  // Nearest on a log scale: 8 = sqrt(1·64) ties to the smaller bucket, 9 goes up; 512 = sqrt(64·4096).
  const std::map<int, int> expected = {{1, 1}, {8, 1}, {9, 64}, {64, 64}, {512, 64}, {513, 4096}, {100000, 4096}};
  for (const auto& [tokens, bucket_tokens] : expected) EXPECT_EQ(table->bucket_for(tokens).num_tokens, bucket_tokens) << tokens;

  const ScopedTunedDir scoped(dir.path());
  const auto found = find_tuned_table(spec, kDevice);
  ASSERT_NE(found, nullptr);
  EXPECT_EQ(find_tuned_table(spec, "NVIDIA H100 80GB HBM3"), nullptr) << "another device's name, another file";
  EXPECT_EQ(find_tuned_table(spec, ""), nullptr) << "no device, no table";
  PlanOverrides overrides;
  overrides.tuned = found;
  const Plan plan = choose_plan(spec, 100, Orientation::kAuto, &overrides);
  EXPECT_EQ(std::string(plan.gemm1->name), "swiglu_swap_t32_w64");
  EXPECT_EQ(plan.source, "tuned:" + name);
  EXPECT_EQ(choose_plan(spec, 100, Orientation::kNormal, &overrides).source, "analytic")
      << "an explicit orientation is the caller's choice";
}

TEST(TunedTable, MalformedOrStaleFilesAreRejectedWithTheReason) {
  const MoeSpec spec = preset("qwen3-30b-a3b");
  const std::string good = bucket(1, "swiglu_swap_t8_w64", "weighted_swap_t8_w64");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{\"E\": 128,", "line 1"},
      {"[1, 2]", "not a JSON object"},
      {table_json(preset("olmoe-1b-7b"), kDevice, good), "does not match the layer"},
      {table_json(spec, "NVIDIA H100", good), "NVIDIA H100"},
      {table_json(spec, kDevice, bucket(1, "swiglu_swap_t8_w64", "weighted_swap_t8_w32")), "no compiled kernel"},
      {table_json(spec, kDevice, bucket(1, "swiglu_swap_t8_w64", "weighted_normal_t64_w128")), "differ"},
      {table_json(spec, kDevice, ""), "empty"},
      {table_json(spec, kDevice, "\"zero\": {\"gemm1\": \"a\", \"gemm2\": \"b\"}"), "positive token count"},
      {table_json(spec, kDevice, good + "," + good), "twice"},
      {table_json(spec, kDevice, bucket(1, "swiglu_swap_t8_w64", "weighted_swap_t8_w64", ", \"fused\": \"yes\"")),
       "bucket \"1\": \"fused\" is not a boolean"},
      {table_json(spec, kDevice, bucket(8, "swiglu_swap_t8_w64", "weighted_swap_t8_w64", ", \"fused\": true")),
       "bucket \"8\": \"fused\" is true above the fused decode layer's 4 tokens"},
  };
  const TempDir dir;
  for (const auto& [text, reason] : cases) {
    const std::string path = dir.write("table.json", text);
    std::string error;
    EXPECT_EQ(read_tuned_table(path, spec, kDevice, &error), nullptr) << text;
    EXPECT_NE(error.find(reason), std::string::npos) << "expected '" << reason << "' in: " << error;
  }
}

// "fused" buckets (written by `hmoe tune` where the fused decode layer beat the pair) read back, and
// under FusedDecode::kAuto they, and only they, run the fused layer, at the T they serve where it
// applies; the option, the environment and the runners that ask for particular kernels decide first.
TEST(TunedTable, FusedBucketsDecideTheFusedDecodeLayerUnderAuto) {
  const MoeSpec spec = preset("qwen3-30b-a3b");
  const TempDir dir;
  const std::string name = tuned_file_name(spec, kDevice);
  const std::string swap8 = "swiglu_swap_t8_w64", weighted8 = "weighted_swap_t8_w64";
  dir.write(name, table_json(spec, kDevice,
                             bucket(1, swap8, weighted8, ", \"fused\": true") + "," + bucket(2, swap8, weighted8) + "," +
                                 bucket(4, swap8, weighted8, ", \"unfused_us\": 9.5, \"fused\": true") + "," +
                                 bucket(64, "swiglu_swap_t32_w64", "weighted_swap_t32_w64", ", \"fused\": false")));
  std::string error;
  const auto table = read_tuned_table((fs::path(dir.path()) / name).string(), spec, kDevice, &error);
  ASSERT_NE(table, nullptr) << error;
  const std::map<int, bool> fused_bucket = {{1, true}, {2, false}, {3, true}, {4, true}, {5, true}, {64, false}};
  for (const auto& [tokens, fused] : fused_bucket) EXPECT_EQ(table->bucket_for(tokens).fused_decode, fused) << tokens;
  EXPECT_EQ(std::string(table->bucket_for(1).variant.gemm1->name), swap8) << "a fused bucket still names its pair";

  PlanOverrides overrides;
  overrides.tuned = table;
  const PlanOptions automatic;   // FusedDecode::kAuto
  ASSERT_EQ(automatic.fused_decode, FusedDecode::kAuto) << "kAuto is the default";
  const std::string source = "tuned:" + name;
  // T = 5 is served by the fused bucket 4, but the fused layer stops at T = 4: its pair runs.
  const std::map<int, std::string> expected = {{1, source}, {2, ""}, {3, source}, {4, source}, {5, ""}, {64, ""}};
  for (const auto& [tokens, by] : expected)
    EXPECT_EQ(fused_decode_source(spec, automatic, &overrides, tokens, -1), by) << "T = " << tokens;
  EXPECT_EQ(fused_decode_source(spec, automatic, nullptr, 1, -1), "") << "no table: never fused";
  PlanOverrides no_table;
  EXPECT_EQ(fused_decode_source(spec, automatic, &no_table, 1, -1), "");
  EXPECT_TRUE(fuses_at_any_decode_size(spec, automatic, &overrides, 64, -1));
  EXPECT_FALSE(fuses_at_any_decode_size(spec, automatic, &no_table, 64, -1));

  // kOff beats the table, kOn needs none; HMOE_FUSED_DECODE (environment 0 / 1) beats both.
  PlanOptions off = automatic, on = automatic;
  off.fused_decode = FusedDecode::kOff;
  on.fused_decode = FusedDecode::kOn;
  EXPECT_EQ(fused_decode_source(spec, off, &overrides, 1, -1), "");
  EXPECT_FALSE(fuses_at_any_decode_size(spec, off, &overrides, 64, -1));
  EXPECT_EQ(fused_decode_source(spec, on, &no_table, 2, -1), "option");
  EXPECT_EQ(fused_decode_source(spec, on, &no_table, 5, -1), "") << "beyond decode::kMaxTokens";
  EXPECT_EQ(fused_decode_source(spec, automatic, &overrides, 1, 0), "");
  EXPECT_EQ(fused_decode_source(spec, on, &overrides, 1, 0), "");
  EXPECT_EQ(fused_decode_source(spec, off, &no_table, 2, 1), "environment");
  EXPECT_EQ(fused_decode_source(spec, automatic, &overrides, 2, 1), "environment");

  // Runners that ask for particular kernels never fuse, whatever the table says.
  PlanOptions normal = automatic, forced = automatic, skipping = automatic, split = automatic;
  normal.orientation = Orientation::kNormal;
  forced.force_variant = swap8 + "+" + weighted8;
  skipping.skip_stages = kStageCombine;
  split.split_k = 1;
  for (const PlanOptions& options : {normal, forced, skipping, split}) {
    EXPECT_EQ(fused_decode_source(spec, options, &overrides, 1, -1), "");
    EXPECT_EQ(fused_decode_source(spec, options, &overrides, 1, 1), "") << "not even with HMOE_FUSED_DECODE=1";
    EXPECT_FALSE(fuses_at_any_decode_size(spec, options, &overrides, 64, -1));
  }
  MoeSpec invariant = spec;
  invariant.batch_invariant = true;
  EXPECT_EQ(fused_decode_source(invariant, automatic, &overrides, 1, -1), "");

  // The plan-time preparation and warm-up look at every T a chunk can have: with bucket 1 unfused
  // and bucket 4 fused, T = 3 (nearer 4) is the first that fuses.
  const std::string later = name + ".later";
  dir.write(later, table_json(spec, kDevice,
                              bucket(1, swap8, weighted8) + "," + bucket(4, swap8, weighted8, ", \"fused\": true") +
                                  "," + bucket(16, swap8, weighted8)));
  PlanOverrides later_overrides;
  later_overrides.tuned = read_tuned_table((fs::path(dir.path()) / later).string(), spec, kDevice, &error);
  ASSERT_NE(later_overrides.tuned, nullptr) << error;
  EXPECT_FALSE(fuses_at_any_decode_size(spec, automatic, &later_overrides, 2, -1)) << "chunks of at most 2 tokens";
  EXPECT_TRUE(fuses_at_any_decode_size(spec, automatic, &later_overrides, 3, -1));
  EXPECT_TRUE(fuses_at_any_decode_size(spec, automatic, &later_overrides, 4096, -1));
}

TEST(TunedTable, ABadFileWarnsOnceAndFallsBackToTheAnalyticRule) {
  const MoeSpec spec = preset("olmoe-1b-7b");
  const TempDir dir;
  dir.write(tuned_file_name(spec, kDevice), table_json(spec, kDevice, bucket(1, "gone_kernel", "weighted_swap_t8_w64")));
  const ScopedTunedDir scoped(dir.path());
  testing::internal::CaptureStderr();
  EXPECT_EQ(find_tuned_table(spec, kDevice), nullptr);
  EXPECT_EQ(find_tuned_table(spec, kDevice), nullptr);
  const std::string warnings = testing::internal::GetCapturedStderr();
  std::printf("warning printed: %s", warnings.c_str());
  EXPECT_NE(warnings.find("gone_kernel"), std::string::npos) << warnings;
  EXPECT_NE(warnings.find("analytic rule"), std::string::npos) << warnings;
  EXPECT_EQ(warnings.find("warning"), warnings.rfind("warning")) << "expected exactly one warning:\n" << warnings;
}

TEST(TunedTable, EmptyOrMissingDirectoryMeansTheAnalyticRule) {
  const MoeSpec spec = preset("qwen3-30b-a3b");
  const TempDir dir;
  {
    const ScopedTunedDir scoped(dir.path());
    EXPECT_EQ(tuned_search_dirs(), std::vector<std::string>{dir.path()}) << "the variable replaces the defaults";
    testing::internal::CaptureStderr();
    EXPECT_EQ(find_tuned_table(spec, kDevice), nullptr);
    EXPECT_EQ(testing::internal::GetCapturedStderr(), "") << "an empty directory is not an error";
  }
  {
    const ScopedTunedDir scoped(dir.path() + "/missing");
    testing::internal::CaptureStderr();
    EXPECT_EQ(find_tuned_table(spec, kDevice), nullptr);
    EXPECT_NE(testing::internal::GetCapturedStderr().find("not a directory"), std::string::npos);
  }
  const std::vector<std::string> defaults = tuned_search_dirs();
  ASSERT_FALSE(defaults.empty());
  EXPECT_EQ(defaults.back(), std::string(HMOE_SOURCE_DIR) + "/tuned");
}

// Every table shipped in tuned/ reads back for its preset: a renamed or removed kernel fails here,
// not silently at serving time.
TEST(TunedTable, ShippedTablesAreValid) {
  const fs::path dir = fs::path(HMOE_SOURCE_DIR) / "tuned";
  if (!fs::is_directory(dir)) GTEST_SKIP() << "no tuned/ directory in the source tree";
  int checked = 0;
  for (const auto& entry : fs::directory_iterator(dir, fs::directory_options::skip_permission_denied)) {
    if (entry.path().extension() != ".json") continue;
    std::ifstream file(entry.path());
    std::stringstream text;
    text << file.rdbuf();
    const JsonValue root = parse_json(text.str());
    const std::string device = root.find("device_name")->string;
    bool matched = false;
    for (const std::string& name : preset_names()) {
      for (const QuantScheme scheme : kEveryScheme) {
        const MoeSpec spec = preset_in(name, scheme);
        if (tuned_file_name(spec, device) != entry.path().filename().string()) continue;
        std::string error;
        EXPECT_NE(read_tuned_table(entry.path().string(), spec, device, &error), nullptr)
            << entry.path() << ": " << error;
        matched = true;
      }
    }
    EXPECT_TRUE(matched) << entry.path() << " matches no preset's file name";
    ++checked;
  }
  std::printf("%d shipped tuned tables valid\n", checked);
  // Every preset ships an H200 table for bf16 and for each FP8 scheme.
  for (const std::string& name : preset_names()) {
    for (const QuantScheme scheme : kEveryScheme) {
      EXPECT_TRUE(fs::exists(dir / tuned_file_name(preset_in(name, scheme), kDevice))) << name << " " << to_string(scheme);
    }
  }
}

TEST(ForcedVariant, RunnerUsesItOrNamesWhatIsWrong) {
  const MoeSpec spec = preset("qwen3-30b-a3b");
  PlanOptions options;
  options.max_tokens = 4096;
  options.force_variant = "swiglu_normal_t64_w128+weighted_normal_t64_w128";
  const PlanInfo plan = MoeRunner(spec, options).plan_info(1);
  EXPECT_EQ(plan.source, "forced");
  EXPECT_EQ(plan.gemm1_kernel, "swiglu_normal_t64_w128");
  EXPECT_EQ(plan.orientation, Orientation::kNormal);
  options.force_variant = "swiglu_normal_t64_w128";
  try {
    MoeRunner runner(spec, options);
    FAIL() << "no error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("swiglu_normal_t64_w128"), std::string::npos) << error.what();
  }
}

// The fused decode layer (src/decode): by default (kAuto) only where a tuned table says so, so never
// without one; kOn runs it at T ≤ 4 when its shared memory fits, and never when the caller asks for
// particular GEMMs, stages, splits or batch invariance; kOff never.
TEST(FusedDecode, PlannedExactlyForTheSmallestDecodeSizes) {
  PlanOptions options;
  options.max_tokens = 64;
  if (std::getenv("HMOE_FUSED_DECODE") != nullptr) GTEST_SKIP() << "HMOE_FUSED_DECODE is set: it overrides the plans";
  {
    const TempDir empty;
    const ScopedTunedDir scoped(empty.path());   // no table, also on a machine with a GPU
    for (int tokens = 1; tokens <= 5; ++tokens)
      EXPECT_FALSE(MoeRunner(preset("qwen3-30b-a3b"), options).plan_info(tokens).fused_decode) << "auto, no table";
  }
  options.fused_decode = FusedDecode::kOn;
  for (const std::string& name : preset_names()) {
    const MoeRunner runner(preset(name), options);
    const PlanInfo one = runner.plan_info(1);
    EXPECT_TRUE(one.fused_decode) << name;
    EXPECT_EQ(one.gemm1_kernel, "decode_layer") << name;
    EXPECT_EQ(one.gemm2_kernel, "") << name;
    EXPECT_EQ(one.source, "option") << name;
    EXPECT_FALSE(runner.plan_info(5).fused_decode) << name;
    EXPECT_NE(runner.plan_info(5).gemm2_kernel, "") << name;
  }
  // Shared memory: mixtral's I = 14336 fits T = 1 only (2 slots × I fp32), qwen3 every T ≤ 4.
  EXPECT_FALSE(MoeRunner(preset("mixtral-8x7b"), options).plan_info(2).fused_decode);
  EXPECT_TRUE(MoeRunner(preset("qwen3-30b-a3b"), options).plan_info(4).fused_decode);
  MoeSpec fp8 = preset("deepseek-v3-tp8");
  fp8.weight_dtype = WeightDType::kFP8E4M3;
  fp8.scheme = QuantScheme::kBlock128;
  EXPECT_EQ(MoeRunner(fp8, options).plan_info(1).gemm1_kernel, "decode_layer_fp8block");

  const MoeSpec qwen3 = preset("qwen3-30b-a3b");
  PlanOptions normal = options;
  normal.orientation = Orientation::kNormal;
  EXPECT_FALSE(MoeRunner(qwen3, normal).plan_info(1).fused_decode);
  PlanOptions forced = options;
  forced.force_variant = "swiglu_swap_t8_w64_gather+weighted_swap_t8_w64";
  EXPECT_FALSE(MoeRunner(qwen3, forced).plan_info(1).fused_decode);
  PlanOptions skipping = options;
  skipping.skip_stages = kStageCombine;
  EXPECT_FALSE(MoeRunner(qwen3, skipping).plan_info(1).fused_decode);
  PlanOptions split = options;
  split.split_k = 1;
  EXPECT_FALSE(MoeRunner(qwen3, split).plan_info(1).fused_decode);
  MoeSpec invariant = qwen3;
  invariant.batch_invariant = true;
  EXPECT_FALSE(MoeRunner(invariant, options).plan_info(1).fused_decode);
  PlanOptions off = options;
  off.fused_decode = FusedDecode::kOff;
  for (int tokens = 1; tokens <= 4; ++tokens) EXPECT_FALSE(MoeRunner(qwen3, off).plan_info(tokens).fused_decode);
  PlanOptions bad = options;
  bad.fused_decode = static_cast<FusedDecode>(3);
  try {
    MoeRunner runner(qwen3, bad);
    FAIL() << "no error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("PlanOptions.fused_decode = 3"), std::string::npos) << error.what();
  }
}

// ---- CLI and the binary ---------------------------------------------------------------------------

TEST(KernelList, InfoKernelsMatchesCompiledKernels) {
  int exit_code = -1;
  const std::string output = cli("info --kernels", &exit_code);
  ASSERT_EQ(exit_code, 0) << output;
  std::vector<std::string> listed;
  std::istringstream lines(output);
  std::string line;
  std::getline(lines, line);   // "compiled kernels (N), ..."
  std::getline(lines, line);   // column names
  while (std::getline(lines, line)) {
    std::istringstream fields(line);
    std::string name;
    fields >> name;
    listed.push_back(name);
    const bool fp8 = name.find("_fp8") != std::string::npos;
    EXPECT_NE(line.find(fp8 ? "fp8-e4m3" : "bf16"), std::string::npos) << line;
  }
  EXPECT_EQ(listed, compiled_kernels()) << output;
  EXPECT_NE(output.find("no JIT"), std::string::npos) << output;
}

// The binary holds SASS for every listed variant and no PTX, so the driver has nothing to JIT.
TEST(KernelList, BinaryHoldsEveryVariantAsSassAndNoPtx) {
  const std::string cuobjdump = HMOE_CUOBJDUMP_PATH;
  if (cuobjdump.empty() || cuobjdump.find("NOTFOUND") != std::string::npos) GTEST_SKIP() << "cuobjdump not found";
  int exit_code = -1;
  const std::string ptx = run_command("'" + cuobjdump + "' --list-ptx '" + HMOE_CLI_PATH + "'", &exit_code);
  EXPECT_EQ(ptx.find(".ptx"), std::string::npos) << "PTX embedded (JIT-able):\n" << ptx;
  const std::string symbols = run_command("'" + cuobjdump + "' --dump-resource-usage '" + HMOE_CLI_PATH + "'", &exit_code);
  ASSERT_EQ(exit_code, 0) << symbols;
  int found = 0;
  for (const gemm::GemmVariant& variant : gemm::gemm_variants()) {
    // Itanium mangling of GemmConfig<EpilogueKind(e), swap_ab, token_tile, weight_tile, stages, gather, quant>.
    const std::string arguments = "EpilogueKindE" + std::to_string(static_cast<int>(variant.epilogue)) + "ELb" +
                                  (variant.swap_ab ? "1" : "0") + "ELi" + std::to_string(variant.token_tile) + "ELi" +
                                  std::to_string(variant.weight_tile) + "ELi" + std::to_string(variant.stages) + "ELb" +
                                  (variant.gather_tokens ? "1" : "0") + "E";
    // ... followed by QuantKind(q), whose mangled type name carries a substitution index.
    const std::regex quant(arguments + "LN[A-Za-z0-9_]*9QuantKindE" + std::to_string(static_cast<int>(variant.quant)) + "E");
    const bool present = symbols.find("GemmConfig") != std::string::npos && std::regex_search(symbols, quant);
    EXPECT_TRUE(present) << variant.name << ": no sm_90a kernel with template arguments " << arguments;
    found += present;
  }
  std::printf("cuobjdump: %d/%zu variants present as sm_90a SASS, no PTX\n", found, gemm::gemm_variants().size());
}

// No kernel in the binary touches local memory: register spills, a stack frame, or an array indexed by a
// value the compiler cannot resolve (a thread-dependent index into a kernel parameter's array copies the
// array to local memory; the permute stage's zeroed slots did, 2026-12-07). Each is a round trip through
// L1 the kernels' designs leave out; `cuobjdump --dump-resource-usage` prints STACK and LOCAL per kernel.
TEST(KernelList, NoKernelUsesLocalMemory) {
  const std::string cuobjdump = HMOE_CUOBJDUMP_PATH;
  if (cuobjdump.empty() || cuobjdump.find("NOTFOUND") != std::string::npos) GTEST_SKIP() << "cuobjdump not found";
  int exit_code = -1;
  const std::string usage = run_command("'" + cuobjdump + "' --dump-resource-usage '" + HMOE_CLI_PATH + "'", &exit_code);
  ASSERT_EQ(exit_code, 0) << usage;
  std::istringstream lines(usage);
  std::string line, function;
  int kernels = 0;
  const std::regex stack(R"(\bSTACK:(\d+))"), local(R"(\bLOCAL:(\d+))");
  while (std::getline(lines, line)) {
    const std::size_t at = line.find("Function ");
    if (at != std::string::npos) {
      function = line.substr(at + 9);
      continue;
    }
    std::smatch stack_bytes, local_bytes;
    if (function.empty() || !std::regex_search(line, stack_bytes, stack) || !std::regex_search(line, local_bytes, local))
      continue;
    ++kernels;
    EXPECT_EQ(stack_bytes[1].str(), "0") << function << ": a stack frame (" << line << ")";
    EXPECT_EQ(local_bytes[1].str(), "0") << function << ": local memory (" << line << ")";
    function.clear();
  }
  EXPECT_GE(kernels, static_cast<int>(gemm::gemm_variants().size())) << usage;
  std::printf("cuobjdump: %d kernels checked for a stack frame or local memory\n", kernels);
}

TEST(Cli, TuneAndColdstartUsage) {
  for (const std::string command : {"tune --help", "coldstart --help"}) {
    int exit_code = -1;
    const std::string output = cli(command, &exit_code);
    EXPECT_EQ(exit_code, 0) << output;
    EXPECT_NE(output.find("usage: hmoe"), std::string::npos) << output;
  }
  for (const std::string command : {"tune", "tune --model gpt-17", "coldstart --model qwen3-30b-a3b --tokens 0",
                                    "tune --model qwen3-30b-a3b --dtype fp8", "bench --model qwen3-30b-a3b --explain=1",
                                    "coldstart --model qwen3-30b-a3b --dtype fp9",
                                    "coldstart --model qwen3-30b-a3b --processes 0",
                                    "coldstart --model qwen3-30b-a3b --processes 33",
                                    "tune --model qwen3-30b-a3b --points /nonexistent-hmoe-folder/points.json",
                                    "tune --model qwen3-30b-a3b --points /tmp/"}) {
    int exit_code = -1;
    const std::string output = cli(command, &exit_code);
    EXPECT_EQ(exit_code, 2) << command << "\n" << output;
  }
}

TEST(Cli, GpuToolsSayWhenThereIsNoGpu) {
  if (testkit::hopper_gpu_available(nullptr)) GTEST_SKIP() << "a Hopper GPU is present";
  for (const std::string command : {"tune --model qwen3-30b-a3b", "coldstart --model qwen3-30b-a3b",
                                    "coldstart --model qwen3-30b-a3b --processes 3",
                                    "coldstart --model qwen3-30b-a3b --gate --tokens 1,3",
                                    "bench --model qwen3-30b-a3b --host-overhead"}) {
    int exit_code = -1;
    const std::string output = cli(command, &exit_code);
    EXPECT_EQ(exit_code, 1) << command << "\n" << output;
    EXPECT_NE(output.find("no Hopper GPU"), std::string::npos) << output;
    EXPECT_EQ(output.find('\n'), output.size() - 1) << "expected one line:\n" << output;
  }
}

TEST(Cli, BenchExplainShowsVariantAndSource) {
  int exit_code = -1;
  const std::string output = cli("bench --model qwen3-30b-a3b --tokens 1,777,16384 --explain", &exit_code);
  EXPECT_EQ(exit_code, 0) << output;
  for (const char* part : {"swiglu_", "weighted_", "source"}) EXPECT_NE(output.find(part), std::string::npos) << output;
  if (!testkit::hopper_gpu_available(nullptr)) {
    EXPECT_NE(output.find("analytic"), std::string::npos) << output;
  }
  std::printf("%s", output.c_str());
  // The fused decode layer and who turned it on (here the environment; a tuned table shows its file).
  const std::string fused = run_command(std::string("HMOE_FUSED_DECODE=1 '") + HMOE_CLI_PATH +
                                            "' bench --model qwen3-30b-a3b --tokens 1,5 --explain",
                                        &exit_code);
  EXPECT_EQ(exit_code, 0) << fused;
  std::istringstream lines(fused);
  std::string line, one, five;
  while (std::getline(lines, line)) {
    if (line.rfind("     1 ", 0) == 0) one = line;
    if (line.rfind("     5 ", 0) == 0) five = line;
  }
  EXPECT_NE(one.find("fused layer"), std::string::npos) << fused;
  EXPECT_NE(one.find("decode_layer"), std::string::npos) << fused;
  EXPECT_NE(one.find("environment"), std::string::npos) << fused;
  EXPECT_EQ(five.find("fused layer"), std::string::npos) << "T = 5 is beyond the fused layer:\n" << fused;
  std::printf("%s", fused.c_str());
}

// Prefill x rows go to the expert-sorted rows per token (each x row read once) above 2048 (token,
// slot) pairs when a token has more than one slot (docs/DISPATCH.md, "x rows at prefill");
// HMOE_SCATTER_X=0 turns that off for runners planned after it is set.
TEST(XRows, PerTokenAbove2048PairsWithMoreThanOneSlot) {
  EXPECT_FALSE(permute::scatter_x_rows(1, 8));
  EXPECT_FALSE(permute::scatter_x_rows(256, 8));       // 2048 pairs: still per row
  EXPECT_TRUE(permute::scatter_x_rows(257, 8));
  EXPECT_TRUE(permute::scatter_x_rows(1025, 2));
  EXPECT_FALSE(permute::scatter_x_rows(1024, 2));
  EXPECT_FALSE(permute::scatter_x_rows(65536, 1));     // one slot: each x row is read once anyway
  EXPECT_TRUE(permute::scatter_x_rows(65536, 8));
  ASSERT_EQ(getenv("HMOE_SCATTER_X"), nullptr) << "the test expects the variable unset";
  EXPECT_TRUE(permute::scatter_x_environment());
  setenv("HMOE_SCATTER_X", "0", 1);
  EXPECT_FALSE(permute::scatter_x_environment());
  setenv("HMOE_SCATTER_X", "1", 1);
  EXPECT_TRUE(permute::scatter_x_environment());
  unsetenv("HMOE_SCATTER_X");
}

}  // namespace
}  // namespace hmoe::dispatch
