#pragma once
// Include first in every test file of the example (see Note [glog's CHECK]): libtorch, doctest,
// and small checks shared by the tests.
#include "support/torch_doctest.hpp"

#include "support/messages.hpp"

#include <string>

namespace resnet::test {

// "2x3x4": compares and prints readably in a CHECK.
inline std::string shape_of(const torch::Tensor& tensor) {
  std::string text;
  for (const auto size : tensor.sizes()) {
    if (!text.empty()) text += 'x';
    text += std::to_string(size);
  }
  return text;
}

inline std::string dtype_of(const torch::Tensor& tensor) {
  return std::string(c10::toString(tensor.scalar_type()));
}

}  // namespace resnet::test
