// Runs the built `hmoe` binary with good and bad command lines: exit statuses (0 ok, 1 cannot run
// here, 2 bad usage) and messages that name what was wrong.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "hmoe/hmoe.hpp"
#include "reference/reference.hpp"
#include "run_command.hpp"
#include "testkit/device.hpp"

namespace {

using hmoe::test::contains;
using hmoe::test::run_cli;
using CliResult = hmoe::test::CommandResult;

void expect_usage_error(const std::string& arguments, const std::string& message_part) {
  const CliResult result = run_cli(arguments);
  EXPECT_EQ(result.exit_code, 2) << "hmoe " << arguments << "\n" << result.output;
  EXPECT_TRUE(contains(result.output, message_part)) << "hmoe " << arguments << "\n" << result.output;
  EXPECT_TRUE(contains(result.output, "usage: hmoe")) << "hmoe " << arguments << "\n" << result.output;
}

TEST(Cli, HelpExitsZero) {
  for (const std::string arguments : {"--help", "-h", "info --help", "check --help", "bench --help"}) {
    const CliResult result = run_cli(arguments);
    EXPECT_EQ(result.exit_code, 0) << "hmoe " << arguments << "\n" << result.output;
    EXPECT_TRUE(contains(result.output, "usage: hmoe")) << "hmoe " << arguments << "\n" << result.output;
  }
  EXPECT_TRUE(contains(run_cli("check --help").output, "--ref-tokens"));
  EXPECT_TRUE(contains(run_cli("bench --help").output, "--orientation"));
}

TEST(Cli, UnknownOrMissingCommand) {
  expect_usage_error("frobnicate", "unknown command 'frobnicate'");
  expect_usage_error("", "missing command");
}

TEST(Cli, UnknownPresetIsNamed) {
  expect_usage_error("check --model gpt-17 --tokens 1", "gpt-17");
  expect_usage_error("bench --model gpt-17", "gpt-17");
}

TEST(Cli, MalformedTokenLists) {
  for (const std::string tokens : {"1,,2", "1,x", "1,", "abc", "4.5", "1;2"})
    expect_usage_error("check --model qwen3-30b-a3b --tokens '" + tokens + "'", "--tokens");
  expect_usage_error("bench --model qwen3-30b-a3b --tokens 1,,2", "--tokens");
}

TEST(Cli, NonPositiveTokenCounts) {
  expect_usage_error("check --model qwen3-30b-a3b --tokens 0", "--tokens");
  expect_usage_error("check --model qwen3-30b-a3b --tokens 8,0", "--tokens");
  expect_usage_error("check --model qwen3-30b-a3b --tokens -4", "--tokens");
  expect_usage_error("bench --model qwen3-30b-a3b --tokens 0", "--tokens");
}

TEST(Cli, BadOptions) {
  expect_usage_error("check --model qwen3-30b-a3b --frobnicate 1", "unknown option '--frobnicate'");
  expect_usage_error("check --model", "--model needs a value");
  expect_usage_error("check --tokens 1", "missing --model");
  expect_usage_error("check --model qwen3-30b-a3b --model qwen3-30b-a3b", "given twice");
  expect_usage_error("check --model qwen3-30b-a3b stray", "unexpected argument 'stray'");
  expect_usage_error("check --model qwen3-30b-a3b --routing heavy", "--routing");
  expect_usage_error("check --model qwen3-30b-a3b --entry ids", "--entry");
  expect_usage_error("bench --model qwen3-30b-a3b --orientation sideways", "--orientation");
  expect_usage_error("check --model qwen3-30b-a3b --seed -1", "--seed");
  expect_usage_error("check --model qwen3-30b-a3b --ref-tokens 0", "--ref-tokens");
  expect_usage_error("info --verbose", "unknown option '--verbose'");
}

TEST(Cli, Fp8DtypeOptions) {
  expect_usage_error("check --model qwen3-30b-a3b --dtype fp16", "--dtype");
  expect_usage_error("check --model qwen3-30b-a3b --dtype fp8-block --static-scales", "--static-scales");
  expect_usage_error("check --model qwen3-30b-a3b --ue8m0", "--ue8m0");
  // Well-formed FP8 commands get as far as the GPU check.
  for (const std::string command : {"check --model qwen3-30b-a3b --dtype fp8-block --ue8m0",
                                    "check --model mixtral-8x7b --dtype fp8-tensor --static-scales",
                                    "bench --model deepseek-v3-tp8 --dtype fp8-channel"}) {
    const CliResult result = run_cli(command);
    EXPECT_NE(result.exit_code, 2) << command << "\n" << result.output;
    EXPECT_FALSE(contains(result.output, "usage: hmoe")) << command << "\n" << result.output;
  }
}

TEST(Cli, InfoListsPresets) {
  const CliResult result = run_cli("info");
  EXPECT_EQ(result.exit_code, 0) << result.output;
  for (const char* name : {"mixtral-8x7b", "qwen3-30b-a3b", "qwen3-235b-a22b-tp4", "deepseek-v3-tp8", "olmoe-1b-7b"})
    EXPECT_TRUE(contains(result.output, name)) << result.output;
  EXPECT_TRUE(contains(result.output, "device:")) << result.output;
}

// Works with or without a GPU: the version and the compiled kernel list come from the library alone.
TEST(Cli, InfoPrintsVersionAndCompiledKernels) {
  const CliResult result = run_cli("info");
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_TRUE(contains(result.output, "hmoe 0.1.0 (build ")) << result.output;
  EXPECT_FALSE(contains(result.output, "version not exposed")) << result.output;
  EXPECT_TRUE(contains(result.output, "compiled kernels")) << result.output;
  const std::vector<std::string> kernels = hmoe::compiled_kernels();
  ASSERT_FALSE(kernels.empty());
  bool listed_swap = false;
  for (const std::string& kernel : kernels) {
    EXPECT_TRUE(contains(result.output, "  " + kernel + "\n")) << kernel << " not listed:\n" << result.output;
    if (kernel.find("swap") != std::string::npos) listed_swap = true;
  }
  EXPECT_TRUE(listed_swap) << "no Swap-AB variant compiled";
  if (!hmoe::testkit::hopper_gpu_available(nullptr))
    EXPECT_TRUE(contains(result.output, "device: no Hopper GPU")) << result.output;
}

// The build id names the source tree's commit (cmake/build_id.cmake), so that a carried binary that a
// build did not relink shows an older one. The tests run right after the build that made the CLI.
TEST(Cli, InfoNamesTheCommitTheCliWasBuiltFrom) {
  const hmoe::test::CommandResult head =
      hmoe::test::run_command(std::string("git -C '") + HMOE_SOURCE_DIR + "' rev-parse --short=12 HEAD");
  const CliResult result = run_cli("info");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  if (head.exit_code != 0) {
    EXPECT_TRUE(contains(result.output, "(build unknown (not a git checkout))")) << result.output;
    return;
  }
  const std::string commit = head.output.substr(0, head.output.find('\n'));
  ASSERT_EQ(commit.size(), 12u) << head.output;
  EXPECT_TRUE(contains(result.output, "hmoe 0.1.0 (build " + commit + ")\n") ||
              contains(result.output, "hmoe 0.1.0 (build " + commit + "-dirty."))
      << "HEAD is " << commit << ":\n" << result.output;
}

TEST(Cli, GpuCommandsSayWhenThereIsNoHopperGpu) {
  if (hmoe::testkit::hopper_gpu_available(nullptr)) GTEST_SKIP() << "a Hopper GPU is present: nothing to refuse";
  for (const std::string arguments : {"check --model qwen3-30b-a3b --tokens 1", "bench --model qwen3-30b-a3b"}) {
    const CliResult result = run_cli(arguments);
    EXPECT_EQ(result.exit_code, 1) << "hmoe " << arguments << "\n" << result.output;
    EXPECT_TRUE(contains(result.output, "no Hopper GPU")) << "hmoe " << arguments << "\n" << result.output;
    EXPECT_EQ(result.output.find('\n'), result.output.size() - 1) << "expected one line:\n" << result.output;
  }
}


// `hmoe quantize` on the CPU (this machine has no GPU): the files hold exactly what the reference
// quantiser computes, for every scheme, with and without UE8M0 scales.
TEST(Cli, QuantizeWritesTheReferenceBits) {
  const std::string dir = ::testing::TempDir() + "hmoe_quantize_test";
  std::filesystem::create_directories(dir);
  const int experts = 2, rows = 256, cols = 128;
  std::vector<std::uint16_t> bf16(static_cast<std::size_t>(experts) * rows * cols);
  std::mt19937 generator(5);
  std::uniform_real_distribution<float> uniform(-0.3f, 0.3f);
  for (std::uint16_t& value : bf16) value = hmoe::reference::float_to_bf16(uniform(generator));
  std::fill(bf16.begin(), bf16.begin() + cols, 0);   // an all-zero row: scale 1 for fp8-channel
  const std::string input = dir + "/w.bf16";
  std::ofstream(input, std::ios::binary).write(reinterpret_cast<const char*>(bf16.data()), bf16.size() * 2);
  for (hmoe::QuantScheme scheme : {hmoe::QuantScheme::kPerTensor, hmoe::QuantScheme::kPerChannelPerToken,
                                   hmoe::QuantScheme::kBlock128}) {
    for (bool ue8m0 : {false, true}) {
      const std::string prefix = dir + "/out";
      const CliResult result = run_cli("quantize --dtype " + hmoe::to_string(scheme) + " --shape 2,256,128 --in " +
                                       input + " --out " + prefix + (ue8m0 ? " --ue8m0" : "") + " --cpu");
      ASSERT_EQ(result.exit_code, 0) << result.output;
      EXPECT_TRUE(contains(result.output, "dequantised rel error")) << result.output;
      hmoe::reference::Fp8Options options;
      options.ue8m0_scales = ue8m0;
      const hmoe::reference::QuantizedWeights expected =
          hmoe::reference::quantize_weights(scheme, bf16.data(), experts, rows, cols, options);
      const auto read = [](const std::string& path) {
        std::ifstream file(path, std::ios::binary);
        return std::string(std::istreambuf_iterator<char>(file), {});
      };
      EXPECT_EQ(read(prefix + ".e4m3"),
                std::string(reinterpret_cast<const char*>(expected.values.data()), expected.values.size()));
      EXPECT_EQ(read(prefix + ".scales.f32"),
                std::string(reinterpret_cast<const char*>(expected.scales.data()), expected.scales.size() * 4));
      EXPECT_FALSE(std::filesystem::exists(prefix + ".e4m3.partial"));
    }
  }
  expect_usage_error("quantize --dtype fp8-block --shape 2,256,128 --out x", "missing --in");
  expect_usage_error("quantize --dtype fp8-block --shape 2,256 --in " + input + " --out x", "three positive integers");
  expect_usage_error("quantize --dtype fp8-block --shape 2,256,192 --in " + input + " --out x", "multiple of 128");
  expect_usage_error("quantize --dtype fp8-tensor --shape 2,256,64 --in " + input + " --out x", "expected E*N*K*2");
  expect_usage_error("quantize --dtype bf16 --shape 2,256,128 --in " + input + " --out x", "FP8 scheme");
}

}  // namespace
