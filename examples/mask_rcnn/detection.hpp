#pragma once
// What flows between the data, the model and the evaluation: images batched for the network,
// the objects an image holds, the model's losses and its detections.

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace mask_rcnn {

// The objects in one image, in the pixels the network sees.
struct InstanceTargets {
  torch::Tensor boxes;   // [N, 4] float32 (x1, y1, x2, y2)
  torch::Tensor labels;  // [N] int64, 1 .. num_classes (0 is background)
  torch::Tensor masks;   // [N, H, W] uint8, 1 inside
  // Fixes which anchors and proposals of this image train (see BalancedSampler), so that the
  // same image at the same step is sampled alike on any rank and in any batch.
  std::uint64_t sampling_seed = 0;
};

// Note [Losses over the global batch]
// Each loss is a sum over examples (sampled anchors, sampled proposals, mask pixels) divided by
// how many examples there were. A process only sees its own share of the batch, so the model
// returns the sum and the count separately; the trainer divides by the count averaged over the
// ranks. Gradients averaged over the ranks are then exactly the gradients of the loss over the
// whole global batch, as one process with every image would compute them.
struct LossTerm {
  torch::Tensor sum;  // scalar
  double count = 0;   // examples summed over (>= 0)
};
using Losses = std::map<std::string, LossTerm>;

// Images of one batch, normalized and zero-padded at the bottom and right to a common size that
// is a multiple of size_divisibility.
struct ImageBatch {
  torch::Tensor images;                                    // [N, 3, H, W]
  std::vector<std::pair<std::int64_t, std::int64_t>> sizes;  // each image's (height, width)
};

// images: [3, H_i, W_i] float32 RGB in [0, 1] (any device; the batch is on the first's).
ImageBatch make_batch(const std::vector<torch::Tensor>& images, std::int64_t size_divisibility = 32);

// One image's detections, best first, in the pixels the network saw.
struct Detections {
  torch::Tensor boxes;   // [D, 4]
  torch::Tensor scores;  // [D]
  torch::Tensor labels;  // [D] int64, 1 .. num_classes
  torch::Tensor masks;   // [D, M, M] probabilities of the detected class over the box
};

// Pastes each box's M x M mask probabilities into an image of height x width (bilinearly
// resampled over the box, 0 outside it) and thresholds them: [D, height, width] bool on the CPU.
// boxes [D, 4] are in that image's pixels.
torch::Tensor paste_masks(const torch::Tensor& masks, const torch::Tensor& boxes,
                          std::int64_t height, std::int64_t width, double threshold = 0.5);

}  // namespace mask_rcnn
