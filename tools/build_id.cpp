// The tree this CLI was built from, as cmake/build_id.cmake found it at build time.
#include "cli.hpp"

#include "hmoe_build_id.h"

namespace hmoe::cli {

const char* build_id() { return HMOE_BUILD_ID; }

std::string build_description() { return "hmoe " + version() + " (build " + build_id() + ")"; }

}  // namespace hmoe::cli
