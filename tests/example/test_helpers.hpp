#pragma once
// Include first in every test file of the example: it brings in libtorch and doctest in the one
// order that works, and small checks shared by the tests.
//
// Note [glog's CHECK]: a libtorch built with glog (Debian's is) includes <glog/logging.h>, which
// defines CHECK, CHECK_EQ, ... as fatal runtime assertions. Whichever of glog and doctest is
// included last owns the names, so a test could silently abort on its first failure instead of
// reporting it, or fail to compile. libtorch goes first, glog's short names are dropped, then
// doctest defines its own; glog's include guard keeps later torch includes from redefining them.

// clang-format off
#include <torch/torch.h>
#undef CHECK
#undef CHECK_EQ
#undef CHECK_NE
#undef CHECK_LT
#undef CHECK_LE
#undef CHECK_GT
#undef CHECK_GE
#include <doctest/doctest.h>
// clang-format on

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

inline bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// The message of the E that f throws, or a marker that fails every content check.
template <class E, class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "<nothing thrown>";
}

}  // namespace resnet::test
