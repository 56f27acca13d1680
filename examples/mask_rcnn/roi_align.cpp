#include "roi_align.hpp"

#include <cmath>

namespace mask_rcnn {

namespace F = torch::nn::functional;

torch::Tensor roi_align(const torch::Tensor& features, const torch::Tensor& rois,
                        std::int64_t output_size, double spatial_scale,
                        std::int64_t sampling_ratio) {
  const auto R = rois.size(0), C = features.size(1);
  const auto H = features.size(2), W = features.size(3);
  if (R == 0) return torch::zeros({0, C, output_size, output_size}, features.options());

  // See Note [RoIAlign with grid_sample]: sample k of g along a side sits at (k + 0.5) / g of it.
  const auto g = output_size * sampling_ratio;
  const auto r = rois.to(features.scalar_type());
  const auto steps = (torch::arange(g, features.options()) + 0.5) / static_cast<double>(g);
  auto along = [&](int lo, int hi, std::int64_t size) {
    const auto start = r.select(1, lo).unsqueeze(1) * spatial_scale;
    const auto length = (r.select(1, hi) - r.select(1, lo)).unsqueeze(1) * spatial_scale;
    return 2.0 * (start + length * steps.unsqueeze(0)) / static_cast<double>(size) - 1.0;  // [R, g]
  };
  const auto gx = along(1, 3, W), gy = along(2, 4, H);
  const auto grid = torch::stack({gx.unsqueeze(1).expand({R, g, g}), gy.unsqueeze(2).expand({R, g, g})}, 3);

  const auto batch = rois.select(1, 0).to(torch::kCPU, torch::kLong);
  const auto options =
      F::GridSampleFuncOptions().mode(torch::kBilinear).padding_mode(torch::kBorder).align_corners(false);
  std::vector<torch::Tensor> parts, order;
  for (std::int64_t b = 0; b < features.size(0); ++b) {
    const auto index = (batch == b).nonzero().flatten();
    const auto n = index.size(0);
    if (n == 0) continue;
    const auto on_device = index.to(features.device());
    const auto image_grid = grid.index_select(0, on_device).reshape({1, n * g, g, 2});
    const auto sampled = F::grid_sample(features.narrow(0, b, 1), image_grid, options);  // [1,C,n*g,g]
    // Averaging the sub-bins on the stacked grids never mixes two boxes (each spans g rows, a
    // multiple of the sampling ratio), and pools before the layout changes to [n, C, ...].
    const auto pooled = sampling_ratio > 1 ? torch::avg_pool2d(sampled, sampling_ratio) : sampled;
    parts.push_back(pooled.view({C, n, output_size, output_size}).permute({1, 0, 2, 3}));
    order.push_back(on_device);
  }
  const auto pooled = torch::cat(parts);  // contiguous, boxes grouped by image
  if (parts.size() == 1) return pooled;     // one image: already in the boxes' order
  return torch::zeros({R, C, output_size, output_size}, features.options())
      .index_copy(0, torch::cat(order), pooled);
}

torch::Tensor MultiScaleRoIAlign::levels(const torch::Tensor& boxes, std::int64_t num_levels) const {
  const auto w = boxes.select(1, 2) - boxes.select(1, 0);
  const auto h = boxes.select(1, 3) - boxes.select(1, 1);
  const auto size = torch::sqrt((w * h).clamp_min(0));
  const auto level = torch::floor(static_cast<double>(canonical_level) +
                                  torch::log2(size / canonical_size + 1e-6));
  return level.clamp(static_cast<double>(first_level), static_cast<double>(first_level + num_levels - 1))
      .to(torch::kLong);
}

torch::Tensor MultiScaleRoIAlign::operator()(const std::vector<torch::Tensor>& features,
                                             const std::vector<torch::Tensor>& boxes) const {
  std::vector<torch::Tensor> with_index;
  for (std::size_t i = 0; i < boxes.size(); ++i) {
    const auto b = boxes[i].to(features[0].scalar_type());
    with_index.push_back(torch::cat({torch::full({b.size(0), 1}, static_cast<double>(i), b.options()), b}, 1));
  }
  const auto rois = torch::cat(with_index);
  const auto num_levels = static_cast<std::int64_t>(features.size());
  auto scale_of = [&](std::int64_t l) { return std::ldexp(1.0, -static_cast<int>(first_level + l)); };
  if (num_levels == 1) return roi_align(features[0], rois, output_size, scale_of(0), sampling_ratio);

  const auto level = levels(rois.slice(1, 1, 5), num_levels) - first_level;
  std::vector<torch::Tensor> parts, order;
  for (std::int64_t l = 0; l < num_levels; ++l) {
    const auto index = (level == l).nonzero().flatten();
    if (index.size(0) == 0) continue;
    parts.push_back(roi_align(features[static_cast<std::size_t>(l)], rois.index_select(0, index),
                              output_size, scale_of(l), sampling_ratio));
    order.push_back(index);
  }
  const auto C = features[0].size(1);
  if (parts.empty()) return torch::zeros({0, C, output_size, output_size}, features[0].options());
  return torch::zeros({rois.size(0), C, output_size, output_size}, features[0].options())
      .index_copy(0, torch::cat(order), torch::cat(parts));
}

}  // namespace mask_rcnn
