// JSON and CSV renderings of a BenchReport, and the atomic file write both go through.
#include "testkit/bench_report.hpp"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>

#include "dispatch/json.hpp"

namespace hmoe::testkit {
namespace {

using dispatch::json_quote;

std::string number(double value) {
  if (!std::isfinite(value)) return "null";
  char text[64];
  std::snprintf(text, sizeof(text), "%.6g", value);
  return text;
}

std::string optional_number(const std::optional<double>& value) { return value ? number(*value) : "null"; }

std::string csv_field(const std::string& text) {
  if (text.find_first_of(",\"\n") == std::string::npos) return text;
  std::string quoted = "\"";
  for (char c : text) quoted += c == '"' ? std::string("\"\"") : std::string(1, c);
  return quoted + "\"";
}

std::string ceilings_json(const ReportCeilings& ceilings) {
  return "{\"copy_gb_per_s\": " + number(ceilings.copy_gb_per_s) +
         ", \"read_gb_per_s\": " + number(ceilings.read_gb_per_s) +
         ", \"bandwidth_gb_per_s\": " + number(ceilings.bandwidth_gb_per_s) +
         ", \"bf16_gemm_tflop_per_s\": " + number(ceilings.bf16_gemm_tflop_per_s) +
         ", \"fp8_gemm_tflop_per_s\": " + optional_number(ceilings.fp8_gemm_tflop_per_s) + "}";
}

std::string layer_json(const ReportLayer& layer) {
  const MoeSpec& spec = layer.spec;
  return "{\"name\": " + json_quote(layer.name) + ", \"E\": " + std::to_string(spec.num_experts) +
         ", \"k\": " + std::to_string(spec.top_k) + ", \"H\": " + std::to_string(spec.hidden) +
         ", \"I\": " + std::to_string(spec.intermediate) + ", \"dtype\": " + json_quote(layer.dtype) +
         ", \"routing_function\": " + json_quote(to_string(spec.routing.function)) +
         ", \"renormalize\": " + (spec.routing.renormalize ? "true" : "false") +
         ", \"routing\": " + json_quote(layer.routing) + ", \"orientation\": " + json_quote(layer.orientation) +
         ", \"input_sets\": " + std::to_string(layer.input_sets) +
         ", \"batch_invariant\": " + (spec.batch_invariant ? "true" : "false") +
         ", \"moe_layers\": " + (layer.moe_layers ? std::to_string(*layer.moe_layers) : "null") + "}";
}

std::string load_json(const std::vector<std::vector<int>>& loads) {
  std::string text = "[";
  for (std::size_t set = 0; set < loads.size(); ++set) {
    text += set == 0 ? "[" : ", [";
    for (std::size_t expert = 0; expert < loads[set].size(); ++expert)
      text += (expert == 0 ? "" : ",") + std::to_string(loads[set][expert]);
    text += "]";
  }
  return text + "]";
}

std::string row_json(const ReportRow& row) {
  return "{\"impl\": " + json_quote(row.impl) + ", \"T\": " + std::to_string(row.num_tokens) +
         ", \"replays\": " + std::to_string(row.replays) + ", \"median_us\": " + number(row.median_us) +
         ", \"p10_us\": " + number(row.p10_us) + ", \"p90_us\": " + number(row.p90_us) +
         ", \"tflop_per_s\": " + number(row.tflop_per_s) + ", \"gb_per_s\": " + number(row.gb_per_s) +
         ", \"floor_us\": " + number(row.floor_us) + ", \"percent_of_floor\": " + number(row.percent_of_floor) +
         ", \"experts_hit\": " + number(row.experts_hit) + ", \"variant\": " + json_quote(row.variant) +
         ", \"variant_source\": " + json_quote(row.variant_source) + ", \"gemm1\": " + json_quote(row.gemm1_kernel) +
         ", \"gemm2\": " + json_quote(row.gemm2_kernel) +
         ", \"hmoe_over_peer\": " + optional_number(row.hmoe_over_peer) +
         ", \"tokens_per_expert\": " + load_json(row.tokens_per_expert) + "}";
}

}  // namespace

std::string to_json(const BenchReport& report) {
  std::string text = "{\n  \"schema\": " + json_quote(kBenchSchema) + ",\n  \"command\": " + json_quote(report.command) +
                     ",\n  \"device\": " + json_quote(report.device) +
                     ",\n  \"cuda_runtime_version\": " + std::to_string(report.cuda_runtime_version) +
                     ",\n  \"cuda_driver_version\": " + std::to_string(report.cuda_driver_version) +
                     ",\n  \"date_utc\": " + json_quote(report.date_utc) +
                     ",\n  \"batch_invariant\": " + (report.batch_invariant ? "true" : "false") +
                     ",\n  \"ceilings\": " + (report.ceilings ? ceilings_json(*report.ceilings) : "null") +
                     ",\n  \"layer\": " + (report.layer ? layer_json(*report.layer) : "null") + ",\n  \"rows\": [";
  for (std::size_t index = 0; index < report.rows.size(); ++index)
    text += (index == 0 ? "\n    " : ",\n    ") + row_json(report.rows[index]);
  return text + (report.rows.empty() ? "]\n}\n" : "\n  ]\n}\n");
}

std::string to_csv(const BenchReport& report) {
  std::string text =
      "impl,T,median_us,p10_us,p90_us,tflop_per_s,gb_per_s,floor_us,percent_of_floor,experts_hit,hmoe_over_peer,"
      "variant,variant_source\n";
  for (const ReportRow& row : report.rows) {
    const std::string ratio = row.hmoe_over_peer ? number(*row.hmoe_over_peer) : "";
    text += csv_field(row.impl) + "," + std::to_string(row.num_tokens) + "," + number(row.median_us) + "," +
            number(row.p10_us) + "," + number(row.p90_us) + "," + number(row.tflop_per_s) + "," +
            number(row.gb_per_s) + "," + number(row.floor_us) + "," + number(row.percent_of_floor) + "," +
            number(row.experts_hit) + "," + ratio + "," + csv_field(row.variant) + "," +
            csv_field(row.variant_source) + "\n";
  }
  return text;
}

void write_text_file(const std::string& path, const std::string& text) {
  namespace fs = std::filesystem;
  const std::string temporary = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream file(temporary, std::ios::binary | std::ios::trunc);
    file << text;
    file.flush();
    if (!file) throw Error("hmoe: cannot write " + temporary);
  }
  std::error_code error;
  fs::rename(temporary, path, error);
  if (error) {
    fs::remove(temporary, error);
    throw Error("hmoe: cannot rename " + temporary + " to " + path + " (" + error.message() + ")");
  }
}

std::string utc_now_iso8601() {
  const std::time_t now = std::time(nullptr);
  std::tm parts{};
  gmtime_r(&now, &parts);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%SZ", &parts);
  return text;
}

}  // namespace hmoe::testkit
