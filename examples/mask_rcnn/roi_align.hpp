#pragma once
// RoIAlign (He et al. 2017) built on grid_sample, so autograd provides the backward pass and no
// custom kernel is needed.
//
// Note [RoIAlign with grid_sample]
// A box (x1, y1, x2, y2) in image pixels covers (x1 s, y1 s) .. (x2 s, y2 s) on a feature map of
// scale s (1/4 for stride 4). It is cut into output_size x output_size bins; each bin averages
// sampling_ratio x sampling_ratio bilinear samples at the centres of its sub-bins. That is
// torchvision's roi_align with aligned=True: a feature pixel's value sits at its centre, so
// continuous coordinate c falls on pixel c - 0.5. grid_sample with align_corners=False uses the
// same convention (normalized -1 .. 1 spans the map's outer edges), so the sample at continuous
// coordinate c is requested at 2 c / W - 1. Samples beyond the map take the border value
// (padding_mode=border); torchvision does the same within one pixel of the map and returns 0
// further out, which proposals clipped to the image never reach. Every box of one image on one
// level is sampled by a single grid_sample call: the boxes' grids are stacked along the height.

#include <torch/torch.h>

#include <cstdint>
#include <vector>

namespace mask_rcnn {

// features [N, C, H, W]; rois [R, 5] = (batch index, x1, y1, x2, y2) in image pixels.
// Returns [R, C, output_size, output_size].
torch::Tensor roi_align(const torch::Tensor& features, const torch::Tensor& rois,
                        std::int64_t output_size, double spatial_scale,
                        std::int64_t sampling_ratio = 2);

// RoIAlign over a feature pyramid: each box is pooled from the level that suits its size,
// level = floor(canonical_level + log2(sqrt(area) / canonical_size)) clamped to the pyramid
// (FPN, Lin et al. 2017, eq. 1; canonical 224 px -> level 4 for ImageNet-sized objects).
struct MultiScaleRoIAlign {
  std::int64_t first_level = 2;  // features[0] is P2 (stride 4)
  std::int64_t output_size = 7;
  std::int64_t sampling_ratio = 2;
  double canonical_size = 224.0;
  std::int64_t canonical_level = 4;

  // The pyramid level of each box [R, 4].
  torch::Tensor levels(const torch::Tensor& boxes, std::int64_t num_levels) const;

  // features: P2, P3, ... each [N, C, H_l, W_l] with stride 2^level; boxes: one [R_i, 4] per
  // image. Returns [sum R_i, C, output_size, output_size] in the boxes' order.
  torch::Tensor operator()(const std::vector<torch::Tensor>& features,
                           const std::vector<torch::Tensor>& boxes) const;
};

}  // namespace mask_rcnn
