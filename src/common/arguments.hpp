// Checks every entry point shares for the device pointers it is given: present, aligned, and not
// overlapping what the call writes. Each failure is an hmoe::Error naming the argument and its value.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <sstream>
#include <string>
#include <string_view>

#include "hmoe/hmoe.hpp"

namespace hmoe::arguments {

inline std::string describe(const void* pointer) {
  std::ostringstream text;
  text << pointer;
  return text.str();
}

inline void require_alignment(const void* pointer, const char* name, std::size_t alignment) {
  if (reinterpret_cast<std::uintptr_t>(pointer) % alignment != 0)
    throw Error(std::string("hmoe: ") + name + " = " + describe(pointer) + " is not " + std::to_string(alignment) +
                "-byte aligned");
}

inline void require_pointer(const void* pointer, const char* name, std::size_t alignment) {
  if (pointer == nullptr) throw Error(std::string("hmoe: ") + name + " is null: expected a device pointer");
  require_alignment(pointer, name, alignment);
}

// A device buffer a call reads or writes, for the overlap checks.
struct Buffer {
  const char* name;
  const void* data;
  std::size_t bytes;
};

inline bool overlap(const Buffer& a, const Buffer& b) {
  if (a.data == nullptr || b.data == nullptr || a.bytes == 0 || b.bytes == 0) return false;
  const auto a_begin = reinterpret_cast<std::uintptr_t>(a.data), b_begin = reinterpret_cast<std::uintptr_t>(b.data);
  return a_begin < b_begin + b.bytes && b_begin < a_begin + a.bytes;
}

// list[0] (the workspace) and list[1] (the output, named out_name) are written: neither may overlap
// any other buffer, except that the output may be the input named x_name exactly (in place: the
// call reads all of x before it writes the output rows).
inline void require_disjoint(std::initializer_list<Buffer> list, std::string_view out_name, std::string_view x_name) {
  const Buffer* buffers = list.begin();   // NOTE: no heap allocation on the per-run path
  for (std::size_t i = 0; i < 2 && i < list.size(); ++i) {
    for (std::size_t j = i + 1; j < list.size(); ++j) {
      const Buffer& a = buffers[i];
      const Buffer& b = buffers[j];
      if (!overlap(a, b)) continue;
      const bool in_place = a.name == out_name && b.name == x_name && a.data == b.data && a.bytes == b.bytes;
      if (in_place) continue;
      throw Error(std::string("hmoe: ") + a.name + " = " + describe(a.data) + " (" + std::to_string(a.bytes) +
                  " bytes) overlaps " + b.name + " = " + describe(b.data) + " (" + std::to_string(b.bytes) +
                  " bytes): expected disjoint device buffers");
    }
  }
}

// The names one entry point gives its FP8 arguments in messages ("RunArgs.weights.w13_scale", ...):
// string literals, so a call that passes builds no string.
struct Fp8ArgumentNames {
  const char* args;             // "RunArgs"
  const char* w13_scale;        // "RunArgs.weights.w13_scale"
  const char* w2_scale;
  const char* act_scale;
  const char* intermediate_act_scale;
};

// FP8 layers need both weight scales; bf16 layers take none; static activation scales exist for
// fp8-tensor only.
inline void require_fp8_arguments(const MoeSpec& spec, const Weights& weights, const float* act_scale,
                                  const float* intermediate_act_scale, const Fp8ArgumentNames& names) {
  if (spec.weight_dtype == WeightDType::kFP8E4M3) {
    require_pointer(weights.w13_scale, names.w13_scale, 4);
    require_pointer(weights.w2_scale, names.w2_scale, 4);
  } else if (weights.w13_scale != nullptr || weights.w2_scale != nullptr) {
    throw Error(std::string("hmoe: ") + names.args +
                ".weights.w13_scale/w2_scale are set for a bf16 layer: expected nullptr (FP8 only)");
  }
  if (spec.scheme != QuantScheme::kPerTensor && (act_scale != nullptr || intermediate_act_scale != nullptr))
    throw Error(std::string("hmoe: ") + names.args + ".act_scale/intermediate_act_scale are set for scheme " +
                to_string(spec.scheme) + ": expected nullptr (static activation scales exist for fp8-tensor only)");
  require_alignment(act_scale, names.act_scale, 4);
  require_alignment(intermediate_act_scale, names.intermediate_act_scale, 4);
}

}  // namespace hmoe::arguments
