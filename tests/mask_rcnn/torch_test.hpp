#pragma once
// Include first in every test file that uses libtorch (see Note [glog's CHECK]): libtorch, doctest,
// and the model tests' small helpers.
#include "support/torch_doctest.hpp"

#include <string>
#include <vector>

namespace mask_rcnn::test {

inline torch::Tensor boxes(std::vector<std::vector<float>> rows) {
  std::vector<float> flat;
  for (const auto& r : rows) flat.insert(flat.end(), r.begin(), r.end());
  return torch::tensor(flat).view({static_cast<std::int64_t>(rows.size()), 4});
}

inline std::vector<std::int64_t> to_vector(const torch::Tensor& t) {
  const auto c = t.to(torch::kCPU, torch::kLong).contiguous();
  return {c.data_ptr<std::int64_t>(), c.data_ptr<std::int64_t>() + c.numel()};
}

inline double max_abs_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>();
}

}  // namespace mask_rcnn::test
