#pragma once
// The message of the InvalidArgumentError a call throws, for tests that check what an error names.
#include <string>

#include "dtrain/core/error.hpp"

namespace dtrain::test {

inline std::string message_of(const auto& call) {
  try {
    call();
  } catch (const dtrain::InvalidArgumentError& e) {
    return e.what();
  }
  return "no exception";
}

}  // namespace dtrain::test
