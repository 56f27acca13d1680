#pragma once
// Boxes [N, 4] as (x1, y1, x2, y2) in pixels, x2 - x1 the width (no "+1"), as in Detectron2 and
// torchvision: overlaps, clipping, the regression encoding, and non-maximum suppression.

#include <torch/torch.h>

#include <array>
#include <cmath>

namespace mask_rcnn {

torch::Tensor box_area(const torch::Tensor& boxes);

// [N, M] intersection over union of every box of `a` with every box of `b`; 0 where a box is
// empty.
torch::Tensor box_iou(const torch::Tensor& a, const torch::Tensor& b);

// Boxes limited to the image [0, width] x [0, height].
torch::Tensor clip_boxes(const torch::Tensor& boxes, std::int64_t height, std::int64_t width);

// Boxes whose sides are both longer than min_size, as a bool mask [N].
torch::Tensor nonempty_boxes(const torch::Tensor& boxes, double min_size = 0.0);

// The regression targets of Fast R-CNN: a box relative to a reference box as
// (dx, dy, dw, dh) = (wx (x - xr) / wr, wy (y - yr) / hr, ww log(w / wr), wh log(h / hr)) with
// (x, y) the centres. decode() inverts encode(); dw and dh are clamped at log(1000 / 16) so that a
// wild prediction early in training cannot overflow exp().
struct BoxCoder {
  std::array<double, 4> weights = {1.0, 1.0, 1.0, 1.0};
  double clamp = std::log(1000.0 / 16.0);

  // targets and references [N, 4] -> deltas [N, 4].
  torch::Tensor encode(const torch::Tensor& targets, const torch::Tensor& references) const;
  // deltas [N, 4k] (k boxes per reference) and references [N, 4] -> boxes [N, 4k].
  torch::Tensor decode(const torch::Tensor& deltas, const torch::Tensor& references) const;
};

// Greedy non-maximum suppression: walks the boxes from the highest score down, keeps a box unless
// it overlaps a kept one by IoU > iou_threshold. Returns the kept indices [K] (int64) in decreasing
// score order; equal scores keep their input order. Runs on the CPU (boxes on a GPU are copied).
torch::Tensor nms(const torch::Tensor& boxes, const torch::Tensor& scores, double iou_threshold);

// nms() within each group (class or pyramid level) separately: boxes of different groups never
// suppress each other. Same result order as nms().
torch::Tensor batched_nms(const torch::Tensor& boxes, const torch::Tensor& scores,
                          const torch::Tensor& groups, double iou_threshold);

}  // namespace mask_rcnn
