#pragma once
// The second stage of Mask R-CNN: for each proposal, a class and a refined box (box head), and
// for each object a 28x28 mask (mask head), pooled from the pyramid with RoIAlign.

#include <torch/torch.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "backbone.hpp"
#include "box_ops.hpp"
#include "detection.hpp"
#include "matcher.hpp"
#include "roi_align.hpp"

namespace mask_rcnn {

struct RoiHeadsConfig {
  std::int64_t num_classes = 3;  // without the background
  double canonical_box_size = 112;  // see MultiScaleRoIAlign
  std::int64_t sampling_ratio = 2;  // RoIAlign samples per bin and side
  std::int64_t box_head_dim = 256;  // two fully connected layers of this width
  std::int64_t mask_head_channels = 64;
  std::int64_t mask_head_convs = 4;
  std::int64_t norm_groups = 8;
  Norm norm = Norm::group;  // after each mask head convolution (Note [Batch norm variants])
  double foreground_iou = 0.5;
  std::int64_t batch_per_image = 128;
  double positive_fraction = 0.25;
  double score_threshold = 0.05;
  double nms_threshold = 0.5;
  std::int64_t detections_per_image = 100;
};

class RoiHeadsImpl : public torch::nn::Module {
 public:
  RoiHeadsImpl(const RoiHeadsConfig& config, std::int64_t channels);

  static constexpr std::int64_t mask_size = 28;

  // features: P2 .. P5. Losses "box_class", "box_regression", "mask" on sampled proposals, the
  // ground-truth boxes added to each image's proposals.
  Losses losses(const std::vector<torch::Tensor>& features,
                const std::vector<torch::Tensor>& proposals,
                const std::vector<InstanceTargets>& targets);

  std::vector<Detections> detect(const std::vector<torch::Tensor>& features,
                                 const std::vector<torch::Tensor>& proposals,
                                 const std::vector<std::pair<std::int64_t, std::int64_t>>& image_sizes);

 private:
  // [R, 256, 7, 7] pooled features -> class logits [R, K + 1], deltas [R, 4K].
  std::pair<torch::Tensor, torch::Tensor> box_head(const std::vector<torch::Tensor>& features,
                                                   const std::vector<torch::Tensor>& boxes);
  // Mask logits [R, K, 28, 28].
  torch::Tensor mask_head(const std::vector<torch::Tensor>& features,
                          const std::vector<torch::Tensor>& boxes);

  RoiHeadsConfig config_;
  BoxCoder coder_;
  Matcher matcher_;
  BalancedSampler sampler_;
  MultiScaleRoIAlign box_pooler_, mask_pooler_;
  torch::nn::Linear fc1_{nullptr}, fc2_{nullptr}, class_logits_{nullptr}, box_deltas_{nullptr};
  torch::nn::Sequential mask_convs_{nullptr};
  torch::nn::ConvTranspose2d mask_upsample_{nullptr};
  torch::nn::Conv2d mask_logits_{nullptr};
};
TORCH_MODULE(RoiHeads);

}  // namespace mask_rcnn
