#include "box_ops.hpp"

#include <algorithm>
#include <vector>

namespace mask_rcnn {

torch::Tensor box_area(const torch::Tensor& boxes) {
  return (boxes.select(1, 2) - boxes.select(1, 0)) * (boxes.select(1, 3) - boxes.select(1, 1));
}

torch::Tensor box_iou(const torch::Tensor& a, const torch::Tensor& b) {
  const auto area_a = box_area(a).unsqueeze(1);
  const auto area_b = box_area(b).unsqueeze(0);
  const auto top_left = torch::max(a.slice(1, 0, 2).unsqueeze(1), b.slice(1, 0, 2).unsqueeze(0));
  const auto bottom_right = torch::min(a.slice(1, 2, 4).unsqueeze(1), b.slice(1, 2, 4).unsqueeze(0));
  const auto wh = (bottom_right - top_left).clamp_min(0);
  const auto intersection = wh.select(2, 0) * wh.select(2, 1);
  const auto union_area = area_a + area_b - intersection;
  return torch::where(union_area > 0, intersection / union_area.clamp_min(1e-12),
                      torch::zeros_like(intersection));
}

torch::Tensor clip_boxes(const torch::Tensor& boxes, std::int64_t height, std::int64_t width) {
  const auto w = static_cast<double>(width), h = static_cast<double>(height);
  return torch::stack({boxes.select(1, 0).clamp(0, w), boxes.select(1, 1).clamp(0, h),
                       boxes.select(1, 2).clamp(0, w), boxes.select(1, 3).clamp(0, h)},
                      1);
}

torch::Tensor nonempty_boxes(const torch::Tensor& boxes, double min_size) {
  const auto w = boxes.select(1, 2) - boxes.select(1, 0);
  const auto h = boxes.select(1, 3) - boxes.select(1, 1);
  return (w > min_size).logical_and(h > min_size);
}

torch::Tensor BoxCoder::encode(const torch::Tensor& targets, const torch::Tensor& references) const {
  const auto rw = references.select(1, 2) - references.select(1, 0);
  const auto rh = references.select(1, 3) - references.select(1, 1);
  const auto rx = references.select(1, 0) + 0.5 * rw;
  const auto ry = references.select(1, 1) + 0.5 * rh;
  const auto tw = targets.select(1, 2) - targets.select(1, 0);
  const auto th = targets.select(1, 3) - targets.select(1, 1);
  const auto tx = targets.select(1, 0) + 0.5 * tw;
  const auto ty = targets.select(1, 1) + 0.5 * th;
  return torch::stack({weights[0] * (tx - rx) / rw, weights[1] * (ty - ry) / rh,
                       weights[2] * torch::log(tw / rw), weights[3] * torch::log(th / rh)},
                      1);
}

torch::Tensor BoxCoder::decode(const torch::Tensor& deltas, const torch::Tensor& references) const {
  const auto refs = references.to(deltas.scalar_type());
  const auto rw = (refs.select(1, 2) - refs.select(1, 0)).unsqueeze(1);
  const auto rh = (refs.select(1, 3) - refs.select(1, 1)).unsqueeze(1);
  const auto rx = refs.select(1, 0).unsqueeze(1) + 0.5 * rw;
  const auto ry = refs.select(1, 1).unsqueeze(1) + 0.5 * rh;
  const auto d = deltas.reshape({deltas.size(0), -1, 4});
  const auto dx = d.select(2, 0) / weights[0];
  const auto dy = d.select(2, 1) / weights[1];
  const auto dw = (d.select(2, 2) / weights[2]).clamp_max(clamp);
  const auto dh = (d.select(2, 3) / weights[3]).clamp_max(clamp);
  const auto cx = dx * rw + rx, cy = dy * rh + ry;
  const auto w = torch::exp(dw) * rw, h = torch::exp(dh) * rh;
  return torch::stack({cx - 0.5 * w, cy - 0.5 * h, cx + 0.5 * w, cy + 0.5 * h}, 2)
      .reshape({deltas.size(0), -1});
}

namespace {

torch::Tensor greedy_nms(const torch::Tensor& boxes, const torch::Tensor& scores,
                         const torch::Tensor* groups, double iou_threshold) {
  const auto n = boxes.size(0);
  if (n == 0) return torch::empty({0}, torch::kLong);
  const auto b = boxes.detach().to(torch::kCPU, torch::kFloat).contiguous();
  const auto order = std::get<1>(
      scores.detach().to(torch::kCPU, torch::kFloat).sort(/*stable=*/true, 0, /*descending=*/true));
  const auto g = groups ? groups->to(torch::kCPU, torch::kLong).contiguous() : torch::Tensor();
  const auto* box = b.data_ptr<float>();
  const auto* index = order.data_ptr<std::int64_t>();
  const auto* group = groups ? g.data_ptr<std::int64_t>() : nullptr;

  std::vector<char> suppressed(static_cast<std::size_t>(n), 0);
  std::vector<std::int64_t> keep;
  for (std::int64_t a = 0; a < n; ++a) {
    const auto i = index[a];
    if (suppressed[static_cast<std::size_t>(i)]) continue;
    keep.push_back(i);
    const float* bi = box + 4 * i;
    const float area_i = (bi[2] - bi[0]) * (bi[3] - bi[1]);
    for (std::int64_t c = a + 1; c < n; ++c) {
      const auto j = index[c];
      if (suppressed[static_cast<std::size_t>(j)] || (group && group[i] != group[j])) continue;
      const float* bj = box + 4 * j;
      const float w = std::max(0.0f, std::min(bi[2], bj[2]) - std::max(bi[0], bj[0]));
      const float h = std::max(0.0f, std::min(bi[3], bj[3]) - std::max(bi[1], bj[1]));
      const float intersection = w * h;
      const float union_area = area_i + (bj[2] - bj[0]) * (bj[3] - bj[1]) - intersection;
      if (union_area > 0 && intersection / union_area > iou_threshold) {
        suppressed[static_cast<std::size_t>(j)] = 1;
      }
    }
  }
  return torch::tensor(keep, torch::kLong).to(boxes.device());
}

}  // namespace

torch::Tensor nms(const torch::Tensor& boxes, const torch::Tensor& scores, double iou_threshold) {
  return greedy_nms(boxes, scores, nullptr, iou_threshold);
}

torch::Tensor batched_nms(const torch::Tensor& boxes, const torch::Tensor& scores,
                          const torch::Tensor& groups, double iou_threshold) {
  return greedy_nms(boxes, scores, &groups, iou_threshold);
}

}  // namespace mask_rcnn
