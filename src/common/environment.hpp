// The A/B switches hmoe reads from the environment (HMOE_PDL, HMOE_SCATTER_X, ...): each is on
// unless the variable is set to exactly "0".
#pragma once

#include <cstdlib>
#include <cstring>

namespace hmoe {

inline bool environment_switch_on(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr || std::strcmp(value, "0") != 0;
}

}  // namespace hmoe
