#pragma once
// The region proposal network (Ren et al. 2015, with FPN): a small convolutional head on every
// pyramid level scores each anchor as object or not and refines it into a proposal.

#include <torch/torch.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "anchors.hpp"
#include "box_ops.hpp"
#include "detection.hpp"
#include "matcher.hpp"

namespace mask_rcnn {

struct RpnConfig {
  std::vector<double> anchor_sizes = {16, 32, 64, 128, 256};  // P2 .. P6
  std::vector<double> aspect_ratios = {0.5, 1.0, 2.0};
  std::int64_t pre_nms_top_n_train = 1000;  // best anchors kept per level before NMS
  std::int64_t pre_nms_top_n_test = 500;
  std::int64_t post_nms_top_n_train = 500;  // proposals kept per image
  std::int64_t post_nms_top_n_test = 250;
  double nms_threshold = 0.7;
  double foreground_iou = 0.7;
  double background_iou = 0.3;
  std::int64_t batch_per_image = 256;
  double positive_fraction = 0.5;
};

// Shared over levels: 3x3 conv + ReLU, then per anchor an objectness logit and 4 box deltas.
class RpnHeadImpl : public torch::nn::Module {
 public:
  RpnHeadImpl(std::int64_t channels, std::int64_t anchors_per_location);
  // Per level: logits [N, H*W*A] and deltas [N, H*W*A, 4], ordered like AnchorGenerator's.
  std::pair<std::vector<torch::Tensor>, std::vector<torch::Tensor>> forward(
      const std::vector<torch::Tensor>& features);

 private:
  torch::nn::Conv2d conv_{nullptr}, objectness_{nullptr}, deltas_{nullptr};
};
TORCH_MODULE(RpnHead);

class RegionProposalNetworkImpl : public torch::nn::Module {
 public:
  RegionProposalNetworkImpl(const RpnConfig& config, std::int64_t channels);

  struct Output {
    std::vector<torch::Tensor> proposals;  // per image [P_i, 4], detached, best first
    Losses losses;                         // "rpn_objectness", "rpn_box" (training only)
  };
  // features: P2 .. P6 of the batch. With targets (one per image) it also computes the losses.
  Output forward(const std::vector<torch::Tensor>& features,
                 const std::vector<std::pair<std::int64_t, std::int64_t>>& image_sizes,
                 const std::vector<InstanceTargets>* targets = nullptr);

 private:
  std::vector<torch::Tensor> select_proposals(
      const std::vector<torch::Tensor>& anchors, const std::vector<torch::Tensor>& logits,
      const std::vector<torch::Tensor>& deltas,
      const std::vector<std::pair<std::int64_t, std::int64_t>>& image_sizes) const;
  Losses compute_losses(const torch::Tensor& anchors, const torch::Tensor& logits,
                        const torch::Tensor& deltas,
                        const std::vector<InstanceTargets>& targets) const;

  RpnConfig config_;
  AnchorGenerator anchors_;
  BoxCoder coder_;
  Matcher matcher_;
  BalancedSampler sampler_;
  RpnHead head_{nullptr};
};
TORCH_MODULE(RegionProposalNetwork);

// sum over elements of smooth L1 (Huber with slope 1): 0.5 d^2 / beta below beta, |d| - beta / 2
// above.
torch::Tensor smooth_l1_sum(const torch::Tensor& input, const torch::Tensor& target, double beta);

}  // namespace mask_rcnn
