#include "rpn.hpp"

#include <algorithm>

#include "backbone.hpp"

namespace mask_rcnn {

namespace nn = torch::nn;

torch::Tensor smooth_l1_sum(const torch::Tensor& input, const torch::Tensor& target, double beta) {
  const auto d = (input - target).abs();
  return torch::where(d < beta, 0.5 * d * d / beta, d - 0.5 * beta).sum();
}

RpnHeadImpl::RpnHeadImpl(std::int64_t channels, std::int64_t anchors_per_location) {
  conv_ = register_module("conv", nn::Conv2d(nn::Conv2dOptions(channels, channels, 3).padding(1)));
  objectness_ = register_module("objectness",
                                nn::Conv2d(nn::Conv2dOptions(channels, anchors_per_location, 1)));
  deltas_ = register_module("deltas",
                            nn::Conv2d(nn::Conv2dOptions(channels, 4 * anchors_per_location, 1)));
  for (auto* c : {&conv_, &objectness_, &deltas_}) {
    nn::init::normal_((*c)->weight, 0.0, 0.01);
    nn::init::zeros_((*c)->bias);
  }
}

std::pair<std::vector<torch::Tensor>, std::vector<torch::Tensor>> RpnHeadImpl::forward(
    const std::vector<torch::Tensor>& features) {
  std::vector<torch::Tensor> logits, deltas;
  for (const auto& f : features) {
    const auto t = torch::relu(conv_(f));
    const auto n = f.size(0);
    // [N, A, H, W] -> [N, H, W, A] -> [N, H*W*A]: (y, x, anchor) order, like the anchors.
    logits.push_back(objectness_(t).permute({0, 2, 3, 1}).reshape({n, -1}));
    const auto d = deltas_(t);
    deltas.push_back(d.view({n, -1, 4, d.size(2), d.size(3)}).permute({0, 3, 4, 1, 2}).reshape({n, -1, 4}));
  }
  return {logits, deltas};
}

RegionProposalNetworkImpl::RegionProposalNetworkImpl(const RpnConfig& config, std::int64_t channels)
    : config_(config),
      anchors_{config.anchor_sizes, config.aspect_ratios, {4, 8, 16, 32, 64}},
      coder_{},
      matcher_{config.foreground_iou, config.background_iou, /*allow_low_quality_matches=*/true},
      sampler_{config.batch_per_image, config.positive_fraction} {
  head_ = register_module("head", RpnHead(channels, anchors_.per_location()));
}

RegionProposalNetworkImpl::Output RegionProposalNetworkImpl::forward(
    const std::vector<torch::Tensor>& features,
    const std::vector<std::pair<std::int64_t, std::int64_t>>& image_sizes,
    const std::vector<InstanceTargets>* targets) {
  std::vector<std::pair<std::int64_t, std::int64_t>> feature_sizes;
  for (const auto& f : features) feature_sizes.emplace_back(f.size(2), f.size(3));
  const auto anchors = anchors_(feature_sizes, features[0].options());
  auto [logits, deltas] = head_->forward(features);

  Output out;
  {
    torch::NoGradGuard no_grad;
    std::vector<torch::Tensor> detached_logits, detached_deltas;
    for (std::size_t l = 0; l < logits.size(); ++l) {
      detached_logits.push_back(logits[l].detach());
      detached_deltas.push_back(deltas[l].detach());
    }
    out.proposals = select_proposals(anchors, detached_logits, detached_deltas, image_sizes);
  }
  if (targets) out.losses = compute_losses(torch::cat(anchors), torch::cat(logits, 1), torch::cat(deltas, 1), *targets);
  return out;
}

std::vector<torch::Tensor> RegionProposalNetworkImpl::select_proposals(
    const std::vector<torch::Tensor>& anchors, const std::vector<torch::Tensor>& logits,
    const std::vector<torch::Tensor>& deltas,
    const std::vector<std::pair<std::int64_t, std::int64_t>>& image_sizes) const {
  const bool training = is_training();
  const auto pre_nms = training ? config_.pre_nms_top_n_train : config_.pre_nms_top_n_test;
  const auto post_nms = training ? config_.post_nms_top_n_train : config_.post_nms_top_n_test;
  const auto n = static_cast<std::int64_t>(image_sizes.size());

  // Per level, the best anchors of every image at once: [N, k] scores and [N, k, 4] boxes.
  std::vector<torch::Tensor> level_scores, level_boxes, level_ids;
  for (std::size_t l = 0; l < logits.size(); ++l) {
    const auto k = std::min(pre_nms, logits[l].size(1));
    const auto [scores, index] = logits[l].topk(k, 1);
    const auto chosen_deltas = deltas[l].gather(1, index.unsqueeze(2).expand({n, k, 4}));
    const auto chosen_anchors = anchors[l].index_select(0, index.reshape({-1}));
    level_boxes.push_back(coder_.decode(chosen_deltas.reshape({-1, 4}), chosen_anchors).view({n, k, 4}));
    level_scores.push_back(scores);
    level_ids.push_back(torch::full({k}, static_cast<std::int64_t>(l), index.options()));
  }
  const auto all_scores = torch::cat(level_scores, 1), all_boxes = torch::cat(level_boxes, 1);
  const auto all_ids = torch::cat(level_ids);

  std::vector<torch::Tensor> proposals;
  for (std::int64_t i = 0; i < n; ++i) {
    const auto [height, width] = image_sizes[static_cast<std::size_t>(i)];
    auto boxes = clip_boxes(all_boxes[i], height, width);
    const auto keep = nonempty_boxes(boxes, 1e-3).nonzero().flatten();
    boxes = boxes.index_select(0, keep);
    const auto kept = batched_nms(boxes, all_scores[i].index_select(0, keep),
                                  all_ids.index_select(0, keep), config_.nms_threshold);
    proposals.push_back(boxes.index_select(0, kept.narrow(0, 0, std::min(post_nms, kept.size(0)))));
  }
  return proposals;
}

Losses RegionProposalNetworkImpl::compute_losses(const torch::Tensor& anchors,
                                                 const torch::Tensor& logits,
                                                 const torch::Tensor& deltas,
                                                 const std::vector<InstanceTargets>& targets) const {
  auto objectness = torch::zeros({}, logits.options());
  auto box = torch::zeros({}, logits.options());
  double count = 0;
  for (std::size_t i = 0; i < targets.size(); ++i) {
    const auto& gt = targets[i].boxes;
    torch::Tensor labels, matches;
    {
      torch::NoGradGuard no_grad;
      matches = matcher_(box_iou(gt, anchors));
      labels = torch::where(matches >= 0, torch::ones_like(matches),
                            torch::where(matches == Matcher::below_low, torch::zeros_like(matches),
                                         torch::full_like(matches, -1)));
    }
    const auto [positive, negative] = sampler_(labels, targets[i].sampling_seed ^ 0x52504eULL);
    const auto sampled = torch::cat({positive, negative});
    const auto target = torch::cat({torch::ones({positive.size(0)}, logits.options()),
                                    torch::zeros({negative.size(0)}, logits.options())});
    const auto image = static_cast<std::int64_t>(i);
    objectness = objectness + torch::binary_cross_entropy_with_logits(
                                  logits[image].index_select(0, sampled), target, {}, {},
                                  at::Reduction::Sum);
    if (positive.size(0) > 0) {
      const auto matched = gt.index_select(0, matches.index_select(0, positive));
      const auto regression = coder_.encode(matched, anchors.index_select(0, positive));
      box = box + smooth_l1_sum(deltas[image].index_select(0, positive), regression, 1.0 / 9.0);
    } else {
      box = box + 0.0 * deltas[image].sum();  // keeps every head parameter in the graph
    }
    count += static_cast<double>(sampled.size(0));
  }
  return {{"rpn_objectness", {objectness, count}}, {"rpn_box", {box, count}}};
}

}  // namespace mask_rcnn
