// `hmoe quantize`: bf16 expert weights from a raw file → e4m3 values and fp32 scales in the
// checkpoint layouts, for users who start from BF16 (issue 4). On a GPU it runs
// hmoe::quantize_weights; without one the CPU reference, which gives the same bits (the GPU test
// Fp8QuantizeWeights.MatchesTheReferenceBitForBit holds them equal).
#include <cmath>
#include <cstdio>
#include <exception>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "cli.hpp"
#include "reference/reference.hpp"
#include "testkit/cuda_handles.hpp"
#include "testkit/device.hpp"

namespace hmoe::cli {
namespace {

constexpr const char* kQuantizeUsage =
    "usage: hmoe quantize --dtype fp8-tensor|fp8-channel|fp8-block --shape E,N,K --in FILE --out PREFIX\n"
    "                     [--ue8m0] [--cpu]\n"
    "  --dtype   the scheme: one scale per expert (fp8-tensor), per output row (fp8-channel), or per\n"
    "            128x128 block (fp8-block, DeepSeek-V3's weight_scale_inv)\n"
    "  --shape   E experts, N rows (output features), K columns (input features): w13 is E,2I,H and\n"
    "            w2 is E,H,I. N and K multiples of 64 (128 for fp8-block)\n"
    "  --in      raw little-endian bf16 [E, N, K], row-major (e.g. a tensor dumped from a checkpoint;\n"
    "            from Python, hmoe.torch.quantize_weights does this on torch tensors)\n"
    "  --out     writes PREFIX.e4m3 (E*N*K bytes, the values prepare_weights takes) and PREFIX.scales.f32\n"
    "            (fp32: [E] / [E, N] / [E, ceil(N/128), ceil(K/128)])\n"
    "  --ue8m0   round every scale up to a power of two\n"
    "  --cpu     quantise on the CPU even when a GPU is present (same bits)\n"
    "prints the scale count, the scale range and the relative error of the dequantised weights\n";

struct QuantizeCommand {
  MoeSpec spec;            // E = experts, hidden = N, intermediate = K: the shape as a w2 matrix
  std::string in_path;
  std::string out_prefix;
  bool cpu = false;
};

QuantizeCommand parse_quantize(const ParsedOptions& parsed) {
  for (const char* option : {"--dtype", "--shape", "--in", "--out"})
    if (!parsed.has(option)) throw UsageError(std::string("missing ") + option);
  QuantizeCommand command;
  const std::string shape = parsed.get("--shape", "");
  std::vector<int> dims;
  std::stringstream fields(shape);
  for (std::string field; std::getline(fields, field, ',');) {
    try {
      std::size_t used = 0;
      const int value = std::stoi(field, &used);
      if (used != field.size() || value <= 0) throw std::invalid_argument(field);
      dims.push_back(value);
    } catch (const std::exception&) {
      throw UsageError("--shape '" + shape + "': expected E,N,K, three positive integers");
    }
  }
  if (dims.size() != 3) throw UsageError("--shape '" + shape + "': expected E,N,K, three positive integers");
  MoeSpec& spec = command.spec;
  spec.num_experts = dims[0];
  spec.top_k = 1;
  spec.hidden = dims[1];
  spec.intermediate = dims[2];
  try {
    apply_dtype(parsed.get("--dtype", ""), spec);
    if (spec.weight_dtype != WeightDType::kFP8E4M3) throw UsageError("--dtype bf16: expected an FP8 scheme");
    spec.ue8m0_scales = parsed.flag("--ue8m0");
    validate(spec);
  } catch (const Error& error) {
    // Messages name MoeSpec fields: say which --shape entry they are.
    throw UsageError("--shape " + shape + " (E = num_experts, N = hidden, K = intermediate): " + error.what());
  }
  command.in_path = parsed.get("--in", "");
  command.out_prefix = parsed.get("--out", "");
  command.cpu = parsed.flag("--cpu");
  return command;
}

std::vector<std::uint16_t> read_bf16(const std::string& path, std::size_t count) {
  std::ifstream file(path, std::ios::binary | std::ios::ate);
  if (!file) throw UsageError("--in '" + path + "': cannot open");
  const std::size_t bytes = static_cast<std::size_t>(file.tellg());
  if (bytes != count * 2)
    throw UsageError("--in '" + path + "' holds " + std::to_string(bytes) + " bytes: expected E*N*K*2 = " +
                     std::to_string(count * 2) + " for the --shape given");
  std::vector<std::uint16_t> values(count);
  file.seekg(0);
  file.read(reinterpret_cast<char*>(values.data()), static_cast<std::streamsize>(bytes));
  if (!file) throw Error("hmoe quantize: reading '" + path + "' failed");
  return values;
}

template <typename T>
void write_file(const std::string& path, const std::vector<T>& values) {
  // Written to a temporary name, then renamed: an interrupted run leaves no half-written output.
  const std::string partial = path + ".partial";
  {
    std::ofstream file(partial, std::ios::binary | std::ios::trunc);
    file.write(reinterpret_cast<const char*>(values.data()), static_cast<std::streamsize>(values.size() * sizeof(T)));
    if (!file) throw Error("hmoe quantize: cannot write '" + partial + "'");
  }
  if (std::rename(partial.c_str(), path.c_str()) != 0) throw Error("hmoe quantize: cannot rename to '" + path + "'");
}

reference::QuantizedWeights quantize_on_gpu(const MoeSpec& spec, const std::vector<std::uint16_t>& bf16) {
  const testkit::Stream stream;
  testkit::DeviceBuffer source(bf16.size() * 2);
  testkit::copy_to_device(source.get(), bf16, stream.get());
  testkit::DeviceBuffer values(bf16.size());
  const std::size_t scale_count = weight_scale_count(spec, WeightMatrix::kW2);
  testkit::DeviceBuffer scales(scale_count * sizeof(float));
  quantize_weights(spec, WeightMatrix::kW2, source.get(), values.get(), scales.as<float>(), stream.get());
  reference::QuantizedWeights result;
  result.scheme = spec.scheme;
  result.experts = spec.num_experts;
  result.rows = spec.hidden;
  result.cols = spec.intermediate;
  result.values = testkit::copy_to_host<std::uint8_t>(values.get(), bf16.size(), stream.get());
  result.scales = testkit::copy_to_host<float>(scales.get(), scale_count, stream.get());
  return result;
}

}  // namespace

int run_quantize(const std::vector<std::string>& args) {
  QuantizeCommand command;
  std::vector<std::uint16_t> bf16;
  try {
    const ParsedOptions parsed = parse_options(args, {"--dtype", "--shape", "--in", "--out"}, {"--ue8m0", "--cpu"});
    if (parsed.help) {
      std::cout << kQuantizeUsage;
      return 0;
    }
    command = parse_quantize(parsed);
    const MoeSpec& spec = command.spec;
    bf16 = read_bf16(command.in_path,
                     static_cast<std::size_t>(spec.num_experts) * spec.hidden * static_cast<std::size_t>(spec.intermediate));
  } catch (const UsageError& error) {
    return usage_error("quantize", error.what(), kQuantizeUsage);
  }
  try {
    const MoeSpec& spec = command.spec;
    std::string no_gpu;
    const bool gpu = !command.cpu && testkit::hopper_gpu_available(&no_gpu);
    reference::Fp8Options options;
    options.ue8m0_scales = spec.ue8m0_scales;
    const reference::QuantizedWeights quantized =
        gpu ? quantize_on_gpu(spec, bf16)
            : reference::quantize_weights(spec.scheme, bf16.data(), spec.num_experts, spec.hidden, spec.intermediate,
                                          options);
    write_file(command.out_prefix + ".e4m3", quantized.values);
    write_file(command.out_prefix + ".scales.f32", quantized.scales);

    // What the user got: the scale range and how far the dequantised weights are from the input.
    float low = quantized.scales.front(), high = low;
    for (float scale : quantized.scales) low = std::fmin(low, scale), high = std::fmax(high, scale);
    std::vector<double> original(spec.intermediate), restored(spec.intermediate);
    double diff = 0.0, norm = 0.0;
    for (int expert = 0; expert < spec.num_experts; ++expert) {
      for (int row = 0; row < spec.hidden; ++row) {
        reference::dequantize_weight_row(quantized, expert, row, restored.data());
        const std::uint16_t* source = bf16.data() + (static_cast<std::size_t>(expert) * spec.hidden + row) * spec.intermediate;
        for (int c = 0; c < spec.intermediate; ++c) {
          const double value = reference::bf16_to_float(source[c]);
          diff += (restored[c] - value) * (restored[c] - value);
          norm += value * value;
        }
      }
    }
    std::printf("hmoe quantize: %s on the %s: %zu values -> %s.e4m3, %zu scales in [%.6g, %.6g] -> %s.scales.f32; "
                "dequantised rel error %.3e\n",
                to_string(spec.scheme).c_str(), gpu ? "GPU" : "CPU", quantized.values.size(), command.out_prefix.c_str(),
                quantized.scales.size(), low, high, command.out_prefix.c_str(), norm > 0 ? std::sqrt(diff / norm) : 0.0);
    return 0;
  } catch (const std::exception& error) {
    std::cerr << "hmoe quantize: error: " << error.what() << "\n";
    return kExitFailure;
  }
}

}  // namespace hmoe::cli
