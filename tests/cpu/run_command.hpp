// Runs a shell command (the built `hmoe` CLI, cuobjdump) and captures its exit status and its
// stdout and stderr together, for the CPU tests that drive binaries.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace hmoe::test {

struct CommandResult {
  int exit_code = -1;   // -1 when the command could not start or did not exit normally
  std::string output;   // stdout and stderr together
};

inline CommandResult run_command(const std::string& command) {
  CommandResult result;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return result;
  char buffer[4096];
  std::size_t read = 0;
  while ((read = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) result.output.append(buffer, read);
  const int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

// The built CLI (HMOE_CLI_PATH, defined by CMake for the CPU tests) with these arguments.
inline CommandResult run_cli(const std::string& arguments) {
  return run_command(std::string("'") + HMOE_CLI_PATH + "' " + arguments);
}

inline bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace hmoe::test
