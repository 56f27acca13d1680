#pragma once
// Anchor boxes of the region proposal network: on every cell of every pyramid level, one box per
// aspect ratio, of that level's size, centred on the cell.

#include <torch/torch.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace mask_rcnn {

struct AnchorGenerator {
  std::vector<double> sizes;          // one per level: the anchors' sqrt(area) in pixels
  std::vector<double> aspect_ratios;  // height / width
  std::vector<std::int64_t> strides;  // one per level: image pixels per feature cell

  std::int64_t per_location() const { return static_cast<std::int64_t>(aspect_ratios.size()); }

  // [A, 4] boxes centred on (0, 0) for one level: width size / sqrt(r), height size * sqrt(r).
  torch::Tensor cell_anchors(std::size_t level) const;

  // One [H_l * W_l * A, 4] tensor per level, ordered (y, x, ratio) to match the RPN head's
  // outputs; feature_sizes holds (H_l, W_l).
  std::vector<torch::Tensor> operator()(
      const std::vector<std::pair<std::int64_t, std::int64_t>>& feature_sizes,
      const torch::TensorOptions& options) const;
};

}  // namespace mask_rcnn
