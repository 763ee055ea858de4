// What `hmoe bench` measured, in the machine-readable forms bench/report.py, bench/plot.py and
// bench/peers.py share (JSON, schema "hmoe-bench/1"; CSV of the rows). docs/BENCHMARKS.md
// describes the fields.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "hmoe/hmoe.hpp"

namespace hmoe::testkit {

inline constexpr const char* kBenchSchema = "hmoe-bench/1";

struct ReportCeilings {
  double copy_gb_per_s = 0.0;
  double read_gb_per_s = 0.0;
  double bandwidth_gb_per_s = 0.0;               // the one the floor uses: the higher of the two
  double bf16_gemm_tflop_per_s = 0.0;
  std::optional<double> fp8_gemm_tflop_per_s;    // measured only by `hmoe bench --ceilings`
};

struct ReportLayer {
  std::string name;            // preset name, or "spec-E8-k2-H4096-I14336" for --spec
  MoeSpec spec;
  std::string dtype = "bf16";
  std::string routing;         // uniform | zipf | extreme
  std::string orientation;     // auto | normal | swap
  int input_sets = 0;
  std::optional<int> moe_layers;  // presets only (testkit/model_layers.hpp)
};

// One measured point of one implementation ("hmoe", "cublas-loop", or a bench/peers.py peer).
struct ReportRow {
  std::string impl;
  int num_tokens = 0;
  int replays = 0;
  double median_us = 0.0;
  double p10_us = 0.0;
  double p90_us = 0.0;
  double tflop_per_s = 0.0;
  double gb_per_s = 0.0;        // hmoe's bytes (same routing) over this implementation's median
  double floor_us = 0.0;
  double percent_of_floor = 0.0;
  double experts_hit = 0.0;
  std::string variant;          // hmoe: "swap 64x8"; peers: what they launch
  std::string variant_source;   // hmoe: "analytic", "tuned:<file>", "forced", "batch-invariant"
  std::string gemm1_kernel;     // hmoe only
  std::string gemm2_kernel;     // hmoe only
  std::optional<double> hmoe_over_peer;  // peers only: hmoe median / this median (< 1: hmoe faster)
  std::vector<std::vector<int>> tokens_per_expert;  // hmoe only: [input set][expert]
};

struct BenchReport {
  std::string command;          // the exact command line
  std::string device;           // testkit::describe(current_device_info())
  int cuda_runtime_version = 0;  // cudaRuntimeGetVersion, e.g. 13000
  int cuda_driver_version = 0;   // cudaDriverGetVersion (the CUDA version the driver supports)
  std::string date_utc;          // ISO 8601
  bool batch_invariant = false;
  std::optional<ReportCeilings> ceilings;
  std::optional<ReportLayer> layer;  // absent for `--ceilings`
  std::vector<ReportRow> rows;
};

std::string to_json(const BenchReport& report);
// One line per row: impl,T,median_us,p10_us,p90_us,tflop_per_s,gb_per_s,floor_us,percent_of_floor,
// experts_hit,hmoe_over_peer,variant,variant_source (header first).
std::string to_csv(const BenchReport& report);
// Writes through a temporary file and a rename, so a reader never sees half a file; throws
// hmoe::Error naming the path when it cannot.
void write_text_file(const std::string& path, const std::string& text);
// The current UTC time as "2026-12-02T15:04:05Z".
std::string utc_now_iso8601();

}  // namespace hmoe::testkit
