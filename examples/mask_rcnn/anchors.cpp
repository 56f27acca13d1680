#include "anchors.hpp"

#include <cmath>
#include <stdexcept>
#include <string>

namespace mask_rcnn {

torch::Tensor AnchorGenerator::cell_anchors(std::size_t level) const {
  std::vector<float> boxes;
  for (const double ratio : aspect_ratios) {
    const double w = sizes.at(level) / std::sqrt(ratio), h = sizes.at(level) * std::sqrt(ratio);
    for (const double v : {-w / 2, -h / 2, w / 2, h / 2}) boxes.push_back(static_cast<float>(v));
  }
  return torch::tensor(boxes).view({-1, 4});
}

std::vector<torch::Tensor> AnchorGenerator::operator()(
    const std::vector<std::pair<std::int64_t, std::int64_t>>& feature_sizes,
    const torch::TensorOptions& options) const {
  if (feature_sizes.size() != sizes.size() || sizes.size() != strides.size()) {
    throw std::invalid_argument("AnchorGenerator: " + std::to_string(feature_sizes.size()) +
                                " feature maps for " + std::to_string(sizes.size()) +
                                " anchor sizes and " + std::to_string(strides.size()) + " strides");
  }
  std::vector<torch::Tensor> out;
  for (std::size_t l = 0; l < sizes.size(); ++l) {
    const auto [h, w] = feature_sizes[l];
    const auto stride = static_cast<double>(strides[l]);
    const auto xs = (torch::arange(w, options) + 0.5) * stride;
    const auto ys = (torch::arange(h, options) + 0.5) * stride;
    const auto grid = torch::meshgrid({ys, xs}, "ij");
    const auto cx = grid[1].reshape({-1}), cy = grid[0].reshape({-1});
    const auto shifts = torch::stack({cx, cy, cx, cy}, 1);  // [H*W, 4]
    const auto cell = cell_anchors(l).to(options);          // [A, 4]
    out.push_back((shifts.unsqueeze(1) + cell.unsqueeze(0)).reshape({-1, 4}));
  }
  return out;
}

}  // namespace mask_rcnn
