#pragma once
// Runs a shell command, as the tests of the example trainers start them, and keeps what it printed.

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

#include <doctest/doctest.h>

namespace dtrain::test {

struct CommandResult {
  int exit_code = -1;  // -1: ended by a signal
  std::string output;  // stdout and stderr
};

inline CommandResult run_command(const std::string& command) {
  CommandResult result;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  REQUIRE(pipe != nullptr);
  std::array<char, 4096> buffer{};
  while (const auto n = std::fread(buffer.data(), 1, buffer.size(), pipe)) {
    result.output.append(buffer.data(), n);
  }
  const int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

}  // namespace dtrain::test
