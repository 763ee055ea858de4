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

}  // namespace hmoe::arguments
