// ep_moe: the expert-parallel MoE layer across GPUs, one process per GPU. Every rank builds the
// same seeded layer, runs it expert-parallel over NCCL and as the single-GPU layer (all experts on
// its own GPU) on the same tokens, checks one against the other, then times both and a uniform
// NCCL all-to-all of the same size. Rank 0 prints what it checked and how fast it ran.
//
//   rm -f /tmp/ep.id
//   for r in 0 1; do build/ep_moe --rank $r --world-size 2 --id-file /tmp/ep.id & done; wait
//
// docs/EP.md has the options, the launch for 4 and 8 GPUs and what the columns mean.
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ep/ep_layer_data.hpp"
#include "hmoe/ep.hpp"
#include "hmoe/hmoe.hpp"
#include "reference/reference.hpp"
#include "testkit/check.hpp"
#include "testkit/cuda_handles.hpp"
#include "testkit/device.hpp"

namespace {

using hmoe::testkit::DeviceBuffer;
using hmoe::testkit::Event;

#define EXAMPLE_NCCL(call)                                                                              \
  do {                                                                                                  \
    const ncclResult_t status_ = (call);                                                                \
    if (status_ != ncclSuccess) throw hmoe::Error(std::string(#call) + ": " + ncclGetErrorString(status_)); \
  } while (0)

constexpr double kTolerance = 1e-2;  // DESIGN.md §2: bf16 path; the "within 1e-2"

struct Options {
  int rank = -1;
  int world_size = -1;
  int device = -1;
  std::string id_file;
  std::string preset_name = "deepseek-v3-tp8";
  int intermediate = 2048;          // DeepSeek-V3's expert size (the -tp8 preset splits it 8 ways)
  std::string dtype = "bf16";       // or fp8-block
  bool fp8_dispatch = false;
  std::vector<int> tokens = {1, 64, 4096};
  int warmup = 3;
  int iters = 20;
  bool check = true;
  bool overlap = false;             // also time run_overlapped with the tokens split in two micro-batches
};

const char* kUsage =
    "usage: ep_moe --rank R --world-size N --id-file PATH [options]\n"
    "  --rank, --world-size   this process's rank and the number of ranks (default: $RANK / $WORLD_SIZE,\n"
    "                         then $OMPI_COMM_WORLD_RANK / $OMPI_COMM_WORLD_SIZE)\n"
    "  --device D             CUDA device (default: $LOCAL_RANK, else rank % device count)\n"
    "  --id-file PATH         rank 0 writes the NCCL unique id there, the others read it; must not exist\n"
    "                         at start; rank 0 removes it once every rank has joined\n"
    "  --preset NAME          layer shape (default deepseek-v3-tp8 with --intermediate 2048: DeepSeek-V3)\n"
    "  --intermediate I       expert intermediate size (default 2048)\n"
    "  --dtype bf16|fp8-block weights (default bf16)\n"
    "  --fp8-dispatch         send x as e4m3 rows with 1x128 scales\n"
    "  --tokens T[,T...]      tokens per rank (default 1,64,4096)\n"
    "  --iters N, --warmup N  timed and untimed runs per token count (default 20, 3)\n"
    "  --no-check             skip the comparison with the single-GPU layer\n"
    "  --overlap              also time the same tokens as two micro-batches through run_overlapped\n"
    "                         (two-batch overlap) against one run_from_topk, and check they agree\n";

int env_int(const char* name, int fallback) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? std::atoi(value) : fallback;
}

std::vector<int> parse_list(const std::string& text) {
  std::vector<int> values;
  std::stringstream stream(text);
  for (std::string item; std::getline(stream, item, ',');) values.push_back(std::stoi(item));
  return values;
}

Options parse(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw hmoe::Error("ep_moe: " + arg + " needs a value\n" + kUsage);
      return argv[++i];
    };
    if (arg == "--rank") options.rank = std::stoi(value());
    else if (arg == "--world-size") options.world_size = std::stoi(value());
    else if (arg == "--device") options.device = std::stoi(value());
    else if (arg == "--id-file") options.id_file = value();
    else if (arg == "--preset") options.preset_name = value();
    else if (arg == "--intermediate") options.intermediate = std::stoi(value());
    else if (arg == "--dtype") options.dtype = value();
    else if (arg == "--fp8-dispatch") options.fp8_dispatch = true;
    else if (arg == "--tokens") options.tokens = parse_list(value());
    else if (arg == "--iters") options.iters = std::stoi(value());
    else if (arg == "--warmup") options.warmup = std::stoi(value());
    else if (arg == "--no-check") options.check = false;
    else if (arg == "--overlap") options.overlap = true;
    else if (arg == "--help" || arg == "-h") {
      std::cout << kUsage;
      std::exit(0);
    } else {
      throw hmoe::Error("ep_moe: unknown option " + arg + "\n" + kUsage);
    }
  }
  if (options.rank < 0) options.rank = env_int("RANK", env_int("OMPI_COMM_WORLD_RANK", -1));
  if (options.world_size < 0) options.world_size = env_int("WORLD_SIZE", env_int("OMPI_COMM_WORLD_SIZE", -1));
  if (options.rank < 0 || options.world_size < 1 || options.rank >= options.world_size)
    throw hmoe::Error("ep_moe: need 0 <= --rank < --world-size (or $RANK and $WORLD_SIZE)\n" + std::string(kUsage));
  if (options.id_file.empty()) throw hmoe::Error("ep_moe: --id-file is required\n" + std::string(kUsage));
  if (options.dtype != "bf16" && options.dtype != "fp8-block")
    throw hmoe::Error("ep_moe: --dtype " + options.dtype + ": expected bf16 or fp8-block");
  if (options.iters < 1 || options.warmup < 0) throw hmoe::Error("ep_moe: --iters must be >= 1, --warmup >= 0");
  for (int t : options.tokens)
    if (t < 1) throw hmoe::Error("ep_moe: --tokens must be positive");
  return options;
}

// Rank 0 publishes the id atomically (write, then rename); the others wait for the file.
ncclUniqueId share_unique_id(const Options& options) {
  namespace fs = std::filesystem;
  ncclUniqueId id;
  if (options.rank == 0) {
    if (fs::exists(options.id_file))
      throw hmoe::Error("ep_moe: " + options.id_file + " exists (an id from an earlier run?): remove it first");
    EXAMPLE_NCCL(ncclGetUniqueId(&id));
    const std::string temporary = options.id_file + ".tmp" + std::to_string(::getpid());
    std::ofstream(temporary, std::ios::binary).write(reinterpret_cast<const char*>(&id), sizeof(id));
    fs::rename(temporary, options.id_file);
    return id;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(5);
  while (true) {
    std::error_code error;
    if (fs::exists(options.id_file) && fs::file_size(options.id_file, error) == sizeof(id)) {
      std::ifstream(options.id_file, std::ios::binary).read(reinterpret_cast<char*>(&id), sizeof(id));
      return id;
    }
    if (std::chrono::steady_clock::now() > deadline)
      throw hmoe::Error("ep_moe: no NCCL id appeared at " + options.id_file + " within 5 minutes (is rank 0 running?)");
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

// Element-wise reduction of a few doubles over all ranks.
std::vector<double> all_reduce(const std::vector<double>& values, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream) {
  DeviceBuffer buffer(values.size() * sizeof(double));
  hmoe::testkit::copy_to_device(buffer.get(), values, stream);
  EXAMPLE_NCCL(ncclAllReduce(buffer.get(), buffer.get(), values.size(), ncclFloat64, op, comm, stream));
  return hmoe::testkit::copy_to_host<double>(buffer.get(), values.size(), stream);
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

double event_ms(const Event& start, const Event& stop) { return hmoe::testkit::elapsed_ms(start, stop); }

// Median time of a uniform all-to-all moving bytes_per_peer to every other rank (and from it).
double uniform_all_to_all_ms(std::size_t bytes_per_peer, const Options& options, ncclComm_t comm,
                             cudaStream_t stream) {
  const int world = options.world_size;
  const std::size_t bytes = std::max<std::size_t>(bytes_per_peer * world, 1);
  DeviceBuffer send(bytes), recv(bytes);
  const Event start, stop;
  std::vector<double> times;
  for (int i = 0; i < options.warmup + options.iters; ++i) {
    start.record(stream);
    EXAMPLE_NCCL(ncclGroupStart());
    for (int peer = 0; peer < world; ++peer) {
      if (peer == options.rank) continue;
      const std::size_t offset = peer * bytes_per_peer;
      EXAMPLE_NCCL(ncclSend(send.as<std::uint8_t>() + offset, bytes_per_peer, ncclUint8, peer, comm, stream));
      EXAMPLE_NCCL(ncclRecv(recv.as<std::uint8_t>() + offset, bytes_per_peer, ncclUint8, peer, comm, stream));
    }
    EXAMPLE_NCCL(ncclGroupEnd());
    stop.record(stream);
    HMOE_CUDA_CHECK(cudaStreamSynchronize(stream));
    if (i >= options.warmup) times.push_back(event_ms(start, stop));
  }
  return median(times);
}

struct Check {
  double diff_squared = 0.0, ref_squared = 0.0;
  double bit_identical = 0.0, elements = 0.0, bad = 0.0;  // bad: unwritten or non-finite
};

Check compare(const std::vector<std::uint16_t>& single, const std::vector<std::uint16_t>& ep) {
  Check check;
  for (std::size_t i = 0; i < single.size(); ++i) {
    const double expected = hmoe::reference::bf16_to_float(single[i]);
    const double actual = hmoe::reference::bf16_to_float(ep[i]);
    check.bit_identical += single[i] == ep[i];
    if (ep[i] == hmoe::testkit::kPoisonBf16 || !std::isfinite(actual)) {
      check.bad += 1;
      continue;
    }
    check.diff_squared += (actual - expected) * (actual - expected);
    check.ref_squared += expected * expected;
  }
  check.elements = static_cast<double>(single.size());
  return check;
}

struct Row {
  int tokens = 0;
  double rel_error = -1.0, bit_identical_fraction = 0.0, bad = 0.0;
  double ep_us = 0, a2a_us = 0, experts_us = 0, single_us = 0;
  double a2a_gbps = 0, nccl_gbps = 0;
  double one_batch_us = 0, two_batch_us = 0, overlap_rel_error = -1.0;   // --overlap only
};

// The EP layer's arguments for all of inputs' tokens, written to out.
hmoe::EpRunArgs ep_args(const hmoe::ep::EpLayerWeights& weights, const hmoe::ep::EpInputs& inputs, int tokens,
                        void* out, const DeviceBuffer& workspace) {
  hmoe::EpRunArgs args;
  args.num_tokens = tokens;
  args.x = inputs.x.get();
  args.out = out;
  args.weights = weights.local();
  args.workspace = workspace.get();
  args.workspace_size = workspace.bytes();
  return args;
}

// --overlap: the same tokens and routing (top-k entry) as one run_from_topk and as two micro-batches
// (first half, second half) through run_overlapped; both the slowest rank's median.
void time_overlap(const Options& options, const hmoe::ep::EpLayerWeights& weights, const hmoe::ep::EpInputs& inputs,
                  hmoe::EpMoeLayer& layer, const DeviceBuffer& workspace, int tokens, ncclComm_t comm,
                  cudaStream_t stream, Row& row) {
  const hmoe::MoeSpec& spec = weights.spec;
  const std::size_t out_count = static_cast<std::size_t>(tokens) * spec.hidden;
  const std::size_t row_bytes = static_cast<std::size_t>(spec.hidden) * 2;
  DeviceBuffer second_workspace(layer.workspace_bytes()), one_out(out_count * 2), two_out(out_count * 2);
  const hmoe::testkit::Stream comm_stream;
  const Event start, stop;
  const hmoe::EpRunArgs all = ep_args(weights, inputs, tokens, one_out.get(), workspace);
  const int half = tokens / 2;
  std::vector<hmoe::EpMicroBatch> batches(2);
  for (int b = 0; b < 2; ++b) {
    const std::size_t first = b == 0 ? 0 : half;
    hmoe::EpMicroBatch& batch = batches[b];
    batch.args = all;
    batch.args.num_tokens = b == 0 ? half : tokens - half;
    batch.args.x = static_cast<const std::uint8_t*>(inputs.x.get()) + first * row_bytes;
    batch.args.out = static_cast<std::uint8_t*>(two_out.get()) + first * row_bytes;
    batch.args.workspace = b == 0 ? workspace.get() : second_workspace.get();
    batch.topk_ids = inputs.topk_ids.as<const std::int32_t>() + first * spec.top_k;
    batch.topk_weights = inputs.topk_weights.as<const float>() + first * spec.top_k;
  }
  std::vector<double> one_ms, two_ms;
  for (int i = 0; i < options.warmup + options.iters; ++i) {
    start.record(stream);
    layer.run_from_topk(all, inputs.topk_ids.as<const std::int32_t>(), inputs.topk_weights.as<const float>(), stream);
    stop.record(stream);
    HMOE_CUDA_CHECK(cudaStreamSynchronize(stream));
    if (i >= options.warmup) one_ms.push_back(event_ms(start, stop));
    start.record(stream);
    layer.run_overlapped(batches, stream, comm_stream.get());
    stop.record(stream);
    HMOE_CUDA_CHECK(cudaStreamSynchronize(stream));
    if (i >= options.warmup) two_ms.push_back(event_ms(start, stop));
  }
  // Two micro-batches plan their local GEMMs for fewer rows, so they agree with one run within
  // the bf16 bound, not bit for bit.
  const Check check = compare(hmoe::testkit::copy_to_host<std::uint16_t>(one_out.get(), out_count, stream),
                              hmoe::testkit::copy_to_host<std::uint16_t>(two_out.get(), out_count, stream));
  const std::vector<double> sums = all_reduce({check.diff_squared, check.ref_squared}, ncclSum, comm, stream);
  row.overlap_rel_error = sums[1] > 0 ? std::sqrt(sums[0] / sums[1]) : 0.0;
  const std::vector<double> slowest = all_reduce({median(one_ms), median(two_ms)}, ncclMax, comm, stream);
  row.one_batch_us = slowest[0] * 1e3;
  row.two_batch_us = slowest[1] * 1e3;
}

// One token count: check, then time the EP layer (with its phases), the single-GPU layer and a
// uniform all-to-all of the EP dispatch's size. Every value is reduced over the ranks.
Row run_token_count(const Options& options, const hmoe::ep::EpLayerWeights& weights, int tokens, ncclComm_t comm,
                    cudaStream_t stream) {
  const hmoe::MoeSpec& spec = weights.spec;
  const hmoe::ep::EpInputs inputs =
      hmoe::ep::make_ep_inputs(weights, tokens, hmoe::testkit::RoutingMode::kUniform, 1000 * options.rank + tokens,
                               stream);
  hmoe::EpOptions ep_options;
  ep_options.max_tokens_per_rank = tokens;
  ep_options.dispatch_dtype =
      options.fp8_dispatch ? hmoe::EpDispatchDType::kFP8Block128 : hmoe::EpDispatchDType::kBF16;
  hmoe::EpMoeLayer layer(spec, options.rank, options.world_size, comm, ep_options);
  DeviceBuffer workspace(layer.workspace_bytes());
  const std::size_t out_count = static_cast<std::size_t>(tokens) * spec.hidden;
  DeviceBuffer ep_out(out_count * 2), single_out(out_count * 2);
  const Event start, dispatch_begin, dispatch_end, combine_begin, combine_end, stop;
  const hmoe::EpPhaseEvents phases{dispatch_begin.get(), dispatch_end.get(), combine_begin.get(), combine_end.get()};
  hmoe::EpRunArgs args = ep_args(weights, inputs, tokens, ep_out.get(), workspace);

  const hmoe::MoeRunner single(spec, hmoe::PlanOptions{tokens});
  DeviceBuffer single_workspace(single.workspace_bytes());
  hmoe::RunArgs single_args;
  single_args.num_tokens = tokens;
  single_args.x = inputs.x.get();
  single_args.out = single_out.get();
  single_args.weights = weights.whole();
  single_args.workspace = single_workspace.get();
  single_args.workspace_size = single_workspace.bytes();

  Row row;
  row.tokens = tokens;
  if (options.check) {
    hmoe::testkit::poison_bf16(ep_out.get(), out_count, stream);
    layer.run_from_logits(args, inputs.logits.get(), stream);
    single.run_from_logits(single_args, inputs.logits.get(), stream);
    const Check check = compare(hmoe::testkit::copy_to_host<std::uint16_t>(single_out.get(), out_count, stream),
                                hmoe::testkit::copy_to_host<std::uint16_t>(ep_out.get(), out_count, stream));
    const std::vector<double> sums = all_reduce(
        {check.diff_squared, check.ref_squared, check.bit_identical, check.elements, check.bad}, ncclSum, comm, stream);
    row.rel_error = sums[1] > 0 ? std::sqrt(sums[0] / sums[1]) : 0.0;
    row.bit_identical_fraction = sums[2] / sums[3];
    row.bad = sums[4];
  }

  std::vector<double> total_ms, a2a_ms, experts_ms, single_ms;
  for (int i = 0; i < options.warmup + options.iters; ++i) {
    start.record(stream);
    args.events = &phases;
    layer.run_from_logits(args, inputs.logits.get(), stream);
    stop.record(stream);
    HMOE_CUDA_CHECK(cudaStreamSynchronize(stream));
    if (i < options.warmup) continue;
    total_ms.push_back(event_ms(start, stop));
    a2a_ms.push_back(event_ms(dispatch_begin, dispatch_end) + event_ms(combine_begin, combine_end));
    experts_ms.push_back(event_ms(dispatch_end, combine_begin));
  }
  for (int i = 0; i < options.warmup + options.iters; ++i) {
    start.record(stream);
    single.run_from_logits(single_args, inputs.logits.get(), stream);
    stop.record(stream);
    HMOE_CUDA_CHECK(cudaStreamSynchronize(stream));
    if (i >= options.warmup) single_ms.push_back(event_ms(start, stop));
  }

  if (options.overlap && tokens >= 2) time_overlap(options, weights, inputs, layer, workspace, tokens, comm, stream, row);

  // Bytes this rank puts on the wire per run (off-rank only): x rows (and ids, weights, scales)
  // out, results back to their owners.
  const hmoe::EpExchangeCounts& exchange = layer.last_exchange();
  const double x_row_bytes = options.fp8_dispatch ? spec.hidden + 4.0 * (spec.hidden / 128) : 2.0 * spec.hidden;
  const double dispatch_row_bytes = x_row_bytes + 8.0;  // + local expert id and weight
  double sent_bytes = 0.0, dispatch_bytes = 0.0;
  for (int peer = 0; peer < options.world_size; ++peer) {
    if (peer == options.rank) continue;
    dispatch_bytes += exchange.sent_rows[peer] * dispatch_row_bytes;
    sent_bytes += exchange.sent_rows[peer] * dispatch_row_bytes + exchange.received_rows[peer] * 2.0 * spec.hidden;
  }
  const double a2a_median_ms = median(a2a_ms);
  const double local_a2a_gbps = a2a_median_ms > 0 ? sent_bytes / (a2a_median_ms * 1e6) : 0.0;
  double local_nccl_gbps = 0.0;
  if (options.world_size > 1) {
    // The same bytes as one EP dispatch, spread evenly over the peers, sent twice (out and back).
    const std::size_t per_peer = static_cast<std::size_t>(
        std::max(1.0, all_reduce({dispatch_bytes}, ncclMax, comm, stream)[0] / (options.world_size - 1)));
    const double uniform_ms = uniform_all_to_all_ms(per_peer, options, comm, stream);
    local_nccl_gbps = per_peer * (options.world_size - 1.0) / (uniform_ms * 1e6);
  }
  // The slowest rank sets the layer's time; bandwidths are the ranks' mean.
  const std::vector<double> slowest =
      all_reduce({median(total_ms), a2a_median_ms, median(experts_ms), median(single_ms)}, ncclMax, comm, stream);
  const std::vector<double> mean = all_reduce({local_a2a_gbps, local_nccl_gbps}, ncclSum, comm, stream);
  row.ep_us = slowest[0] * 1e3;
  row.a2a_us = slowest[1] * 1e3;
  row.experts_us = slowest[2] * 1e3;
  row.single_us = slowest[3] * 1e3;
  row.a2a_gbps = mean[0] / options.world_size;
  row.nccl_gbps = mean[1] / options.world_size;
  return row;
}

int run(const Options& options) {
  std::string no_gpu;
  if (!hmoe::testkit::hopper_gpu_available(&no_gpu)) {
    std::cerr << "ep_moe: no Hopper GPU: " << no_gpu << "\n";
    return 2;
  }
  int devices = 0;
  HMOE_CUDA_CHECK(cudaGetDeviceCount(&devices));
  const int device = options.device >= 0 ? options.device : env_int("LOCAL_RANK", options.rank % devices);
  HMOE_CUDA_CHECK(cudaSetDevice(device));

  const ncclUniqueId id = share_unique_id(options);
  ncclComm_t comm = nullptr;
  EXAMPLE_NCCL(ncclCommInitRank(&comm, options.world_size, id, options.rank));
  // NOTE: initialisation returns once every rank joined, so every rank has read the id by now.
  if (options.rank == 0) std::filesystem::remove(options.id_file);

  int status = 0;
  try {
    hmoe::MoeSpec spec = hmoe::preset(options.preset_name);
    spec.intermediate = options.intermediate;
    if (options.dtype == "fp8-block") {
      spec.weight_dtype = hmoe::WeightDType::kFP8E4M3;
      spec.scheme = hmoe::QuantScheme::kBlock128;
    }
    const hmoe::testkit::Stream stream;
    const hmoe::ep::EpLayerWeights weights =
        hmoe::ep::make_ep_layer_weights(spec, options.rank, options.world_size, /*seed=*/1, stream.get());
    if (options.rank == 0) {
      std::cout << "ep_moe: " << options.preset_name << " with I=" << spec.intermediate << " (E=" << spec.num_experts
                << " k=" << spec.top_k << " H=" << spec.hidden << "), " << options.dtype << " weights, "
                << (options.fp8_dispatch ? "fp8" : "bf16") << " dispatch, R=" << options.world_size << " ranks of "
                << hmoe::testkit::describe(hmoe::testkit::current_device_info()) << "; "
                << spec.num_experts / options.world_size << " experts per rank; median of " << options.iters
                << " runs\n";
      std::printf("%8s %10s %9s %9s %12s %11s %14s %12s %10s %10s %9s\n", "T/rank", "rel_err", "bit-ident", "EP us",
                  "all-to-all us", "experts us", "EP tokens/s", "1-GPU tok/s", "a2a GB/s", "NCCL GB/s", "a2a/NCCL");
    }
    for (int tokens : options.tokens) {
      const Row row = run_token_count(options, weights, tokens, comm, stream.get());
      const bool passed = !options.check || (row.rel_error <= kTolerance && row.bad == 0 &&
                                             row.overlap_rel_error <= kTolerance);
      if (!passed) status = 1;
      if (options.rank != 0) continue;
      const double ep_tokens_per_s = options.world_size * tokens / (row.ep_us * 1e-6);
      const double single_tokens_per_s = tokens / (row.single_us * 1e-6);
      std::printf("%8d %10.2e %8.1f%% %9.1f %12.1f %11.1f %14.0f %12.0f %10.1f %10.1f %8.0f%% %s\n", tokens,
                  row.rel_error, 100.0 * row.bit_identical_fraction, row.ep_us, row.a2a_us, row.experts_us,
                  ep_tokens_per_s, single_tokens_per_s, row.a2a_gbps, row.nccl_gbps,
                  row.nccl_gbps > 0 ? 100.0 * row.a2a_gbps / row.nccl_gbps : 0.0,
                  !options.check ? "" : passed ? "PASS" : "FAIL");
      if (options.overlap && tokens >= 2)
        std::printf("%8s overlap: one batch (top-k entry) %.1f us, two micro-batches %.1f us (%+.1f%%), rel_err %.2e\n",
                    "", row.one_batch_us, row.two_batch_us, 100.0 * (row.two_batch_us / row.one_batch_us - 1.0),
                    row.overlap_rel_error);
    }
  } catch (const std::exception& error) {
    std::cerr << "ep_moe rank " << options.rank << ": " << error.what() << "\n";
    // NOTE: the peers may be inside an exchange with this rank; aborting releases them with an error.
    ncclCommAbort(comm);
    return 1;
  }
  ncclCommDestroy(comm);
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse(argc, argv));
  } catch (const std::exception& error) {
    std::cerr << error.what() << "\n";
    return 1;
  }
}
