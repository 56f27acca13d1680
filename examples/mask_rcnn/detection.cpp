#include "detection.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace mask_rcnn {

namespace F = torch::nn::functional;

ImageBatch make_batch(const std::vector<torch::Tensor>& images, std::int64_t size_divisibility) {
  if (images.empty()) throw std::invalid_argument("make_batch: no images");
  std::int64_t height = 0, width = 0;
  ImageBatch batch;
  for (const auto& image : images) {
    if (image.dim() != 3 || image.size(0) != 3) {
      throw std::invalid_argument("make_batch: images must be [3, H, W]");
    }
    batch.sizes.emplace_back(image.size(1), image.size(2));
    height = std::max(height, image.size(1));
    width = std::max(width, image.size(2));
  }
  auto round_up = [&](std::int64_t v) {
    return (v + size_divisibility - 1) / size_divisibility * size_divisibility;
  };
  const auto options = images[0].options().dtype(torch::kFloat);
  batch.images = torch::zeros({static_cast<std::int64_t>(images.size()), 3, round_up(height),
                               round_up(width)},
                              options);
  // ImageNet's channel statistics: any fixed normalization will do for training from scratch.
  const auto mean = torch::tensor({0.485f, 0.456f, 0.406f}, options).view({3, 1, 1});
  const auto std = torch::tensor({0.229f, 0.224f, 0.225f}, options).view({3, 1, 1});
  for (std::size_t i = 0; i < images.size(); ++i) {
    const auto [h, w] = batch.sizes[i];
    batch.images[static_cast<std::int64_t>(i)].narrow(1, 0, h).narrow(2, 0, w).copy_(
        (images[i].to(options) - mean) / std);
  }
  return batch;
}

torch::Tensor paste_masks(const torch::Tensor& masks, const torch::Tensor& boxes,
                          std::int64_t height, std::int64_t width, double threshold) {
  const auto n = masks.size(0);
  auto out = torch::zeros({n, height, width}, torch::kBool);
  const auto b = boxes.detach().to(torch::kCPU, torch::kFloat).contiguous();
  const auto m = masks.detach().to(torch::kCPU, torch::kFloat);
  const auto options =
      F::GridSampleFuncOptions().mode(torch::kBilinear).padding_mode(torch::kZeros).align_corners(false);
  const auto* box = b.data_ptr<float>();
  for (std::int64_t i = 0; i < n; ++i) {
    const double x1 = box[4 * i], y1 = box[4 * i + 1], x2 = box[4 * i + 2], y2 = box[4 * i + 3];
    if (!(x2 > x1) || !(y2 > y1)) continue;
    const auto x0 = std::clamp<std::int64_t>(static_cast<std::int64_t>(std::floor(x1)), 0, width);
    const auto x_end = std::clamp<std::int64_t>(static_cast<std::int64_t>(std::ceil(x2)), 0, width);
    const auto y0 = std::clamp<std::int64_t>(static_cast<std::int64_t>(std::floor(y1)), 0, height);
    const auto y_end = std::clamp<std::int64_t>(static_cast<std::int64_t>(std::ceil(y2)), 0, height);
    if (x_end <= x0 || y_end <= y0) continue;
    // Pixel centres, as positions across the box: -1 at its left/top edge, 1 at its right/bottom.
    const auto xs = (torch::arange(x0, x_end, torch::kFloat) + 0.5 - x1) / (x2 - x1) * 2 - 1;
    const auto ys = (torch::arange(y0, y_end, torch::kFloat) + 0.5 - y1) / (y2 - y1) * 2 - 1;
    const auto h = ys.size(0), w = xs.size(0);
    const auto grid =
        torch::stack({xs.view({1, w}).expand({h, w}), ys.view({h, 1}).expand({h, w})}, 2).unsqueeze(0);
    const auto sampled = F::grid_sample(m[i].view({1, 1, m.size(1), m.size(2)}), grid, options);
    out[i].narrow(0, y0, h).narrow(1, x0, w).copy_(sampled.view({h, w}) >= threshold);
  }
  return out;
}

}  // namespace mask_rcnn
