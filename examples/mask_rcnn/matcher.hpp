#pragma once
// Assigning anchors and proposals to ground-truth objects, and choosing which of them train.

#include <torch/torch.h>

#include <cstdint>
#include <utility>

namespace mask_rcnn {

// Matches each candidate (anchor or proposal) to the ground-truth box it overlaps most:
//   IoU >= high           -> that box's index
//   low <= IoU < high     -> between (neither foreground nor background: not trained on)
//   IoU < low             -> below_low (background)
// With allow_low_quality_matches, every ground-truth box also claims the candidates that overlap
// it most (ties included), even below `high`, so that no object is left without a candidate
// (the RPN's rule: a small or oddly shaped object may have no anchor at 0.7).
struct Matcher {
  static constexpr std::int64_t below_low = -1;
  static constexpr std::int64_t between = -2;

  double high = 0.5;
  double low = 0.5;
  bool allow_low_quality_matches = false;

  // quality [G, N] (IoU of G ground-truth boxes with N candidates) -> [N] int64: a ground-truth
  // index, below_low or between. With G = 0 every candidate is below_low.
  torch::Tensor operator()(const torch::Tensor& quality) const;
};

// Picks a fixed number of training examples per image with at most a given share of positives:
// up to per_image * positive_fraction positives at random, the rest negatives at random.
struct BalancedSampler {
  std::int64_t per_image = 256;
  double positive_fraction = 0.5;

  // labels [N]: 1 positive, 0 negative, -1 ignored. Returns (positive indices, negative indices),
  // int64 on the labels' device, each in increasing index order. `seed` fixes the choice, so an
  // image is sampled the same way whichever process and batch it is in.
  std::pair<torch::Tensor, torch::Tensor> operator()(const torch::Tensor& labels,
                                                     std::uint64_t seed) const;
};

}  // namespace mask_rcnn
