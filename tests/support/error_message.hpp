#pragma once
// The message of the InvalidArgumentError a call throws, for tests that check what an error names.
#include <string>

#include "dtrain/core/error.hpp"
#include "support/messages.hpp"

namespace dtrain::test {

inline std::string message_of(const auto& call) {
  return message_of<dtrain::InvalidArgumentError>(call);
}

}  // namespace dtrain::test
