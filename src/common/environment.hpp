// The A/B switches hmoe reads from the environment (HMOE_PDL, HMOE_SCATTER_X, ...): each is on
// unless the variable is set to exactly "0"; opt-in ones (HMOE_STATIC_REQUANT) are off unless it is
// exactly "1".
#pragma once

#include <cstdlib>
#include <cstring>

namespace hmoe {

inline bool environment_switch_on(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr || std::strcmp(value, "0") != 0;
}

inline bool environment_opt_in(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && std::strcmp(value, "1") == 0;
}

}  // namespace hmoe
