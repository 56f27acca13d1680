#pragma once
// How far two trained copies of a model are apart, and how far training moved them: the check
// that a distributed run trained the same weights as a single-process one.

#include <algorithm>
#include <string>

#include "support/torch_doctest.hpp"

namespace dtrain::test {

struct ParameterDrift {
  double worst = 0.0;  // largest |a - b|, relative to max(1, max |a|) of its tensor
  double moved = 0.0;  // largest |a - initial|: training did change the weights
};

using Parameters = torch::OrderedDict<std::string, torch::Tensor>;

inline ParameterDrift parameter_drift(const Parameters& a, const Parameters& b,
                                      const Parameters& initial) {
  REQUIRE(a.size() == b.size());
  ParameterDrift drift;
  for (const auto& item : a) {
    CAPTURE(item.key());
    const auto& x = item.value();
    const auto& y = b[item.key()];
    REQUIRE(x.sizes() == y.sizes());
    const double scale = std::max(1.0, x.abs().max().item<double>());
    drift.worst = std::max(drift.worst, (x - y).abs().max().item<double>() / scale);
    drift.moved = std::max(drift.moved, (x - initial[item.key()]).abs().max().item<double>());
  }
  return drift;
}

}  // namespace dtrain::test
