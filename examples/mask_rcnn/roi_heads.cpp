#include "roi_heads.hpp"

#include "backbone.hpp"
#include "rpn.hpp"

namespace mask_rcnn {

namespace nn = torch::nn;

namespace {

nn::Linear linear(std::int64_t in, std::int64_t out, double std = 0.0) {
  nn::Linear l(in, out);
  if (std > 0) {
    nn::init::normal_(l->weight, 0.0, std);
  } else {
    nn::init::kaiming_uniform_(l->weight, 1.0);
  }
  nn::init::zeros_(l->bias);
  return l;
}

// Split sizes of a per-image list, for cutting a concatenated result back into images.
std::vector<std::int64_t> counts_of(const std::vector<torch::Tensor>& per_image) {
  std::vector<std::int64_t> counts;
  for (const auto& t : per_image) counts.push_back(t.size(0));
  return counts;
}

}  // namespace

RoiHeadsImpl::RoiHeadsImpl(const RoiHeadsConfig& config, std::int64_t channels)
    : config_(config),
      coder_{{10.0, 10.0, 5.0, 5.0}},
      matcher_{config.foreground_iou, config.foreground_iou, false},
      sampler_{config.batch_per_image, config.positive_fraction},
      box_pooler_{2, 7, config.sampling_ratio, config.canonical_box_size, 4},
      mask_pooler_{2, 14, config.sampling_ratio, config.canonical_box_size, 4} {
  const auto k = config.num_classes;
  fc1_ = register_module("fc1", linear(channels * 7 * 7, config.box_head_dim));
  fc2_ = register_module("fc2", linear(config.box_head_dim, config.box_head_dim));
  class_logits_ = register_module("class_logits", linear(config.box_head_dim, k + 1, 0.01));
  box_deltas_ = register_module("box_deltas", linear(config.box_head_dim, 4 * k, 0.001));

  nn::Sequential convs;
  std::int64_t in = channels;
  for (std::int64_t i = 0; i < config.mask_head_convs; ++i) {
    nn::Conv2d c(nn::Conv2dOptions(in, config.mask_head_channels, 3).padding(1).bias(false));
    nn::init::kaiming_normal_(c->weight, 0.0, torch::kFanOut, torch::kReLU);
    convs->push_back(c);
    convs->push_back(norm_layer(config.mask_head_channels, config.norm_groups, config.norm));
    convs->push_back(nn::ReLU());
    in = config.mask_head_channels;
  }
  mask_convs_ = register_module("mask_convs", convs);
  mask_upsample_ = register_module(
      "mask_upsample", nn::ConvTranspose2d(nn::ConvTranspose2dOptions(in, in, 2).stride(2)));
  nn::init::kaiming_normal_(mask_upsample_->weight, 0.0, torch::kFanOut, torch::kReLU);
  nn::init::zeros_(mask_upsample_->bias);
  mask_logits_ = register_module("mask_logits", nn::Conv2d(nn::Conv2dOptions(in, k, 1)));
  nn::init::normal_(mask_logits_->weight, 0.0, 0.001);
  nn::init::zeros_(mask_logits_->bias);
}

std::pair<torch::Tensor, torch::Tensor> RoiHeadsImpl::box_head(
    const std::vector<torch::Tensor>& features, const std::vector<torch::Tensor>& boxes) {
  auto x = box_pooler_(features, boxes).flatten(1);
  x = torch::relu(fc2_(torch::relu(fc1_(x))));
  return {class_logits_(x), box_deltas_(x)};
}

torch::Tensor RoiHeadsImpl::mask_head(const std::vector<torch::Tensor>& features,
                                      const std::vector<torch::Tensor>& boxes) {
  auto x = mask_convs_->forward(mask_pooler_(features, boxes));
  return mask_logits_(torch::relu(mask_upsample_(x)));
}

Losses RoiHeadsImpl::losses(const std::vector<torch::Tensor>& features,
                            const std::vector<torch::Tensor>& proposals,
                            const std::vector<InstanceTargets>& targets) {
  std::vector<torch::Tensor> sampled_boxes, sampled_labels, positive_boxes, positive_labels,
      regression_targets, mask_targets;
  for (std::size_t i = 0; i < targets.size(); ++i) {
    torch::NoGradGuard no_grad;
    const auto& gt = targets[i];
    const auto candidates = torch::cat({proposals[i], gt.boxes.to(proposals[i].dtype())});
    const auto matches = matcher_(box_iou(gt.boxes, candidates));
    const auto labels =
        gt.boxes.size(0) == 0
            ? torch::zeros_like(matches)
            : torch::where(matches >= 0, gt.labels.index_select(0, matches.clamp_min(0)),
                           torch::zeros_like(matches));
    const auto [positive, negative] = sampler_(labels, gt.sampling_seed ^ 0x524f49ULL);
    const auto sampled = torch::cat({positive, negative});
    sampled_boxes.push_back(candidates.index_select(0, sampled));
    sampled_labels.push_back(labels.index_select(0, sampled));

    const auto boxes = candidates.index_select(0, positive);
    const auto matched = matches.index_select(0, positive);
    positive_boxes.push_back(boxes);
    positive_labels.push_back(labels.index_select(0, positive));
    regression_targets.push_back(coder_.encode(gt.boxes.index_select(0, matched), boxes));
    // The ground-truth mask seen through the proposal's box, at the head's 28x28 resolution.
    const auto rois = torch::cat({matched.unsqueeze(1).to(boxes.dtype()), boxes}, 1);
    const auto masks = gt.masks.to(boxes.dtype()).unsqueeze(1);
    mask_targets.push_back(
        masks.size(0) == 0 ? torch::zeros({0, mask_size, mask_size}, boxes.options())
                           : (roi_align(masks, rois, mask_size, 1.0, 2).squeeze(1) >= 0.5).to(boxes.dtype()));
  }

  const auto [logits, deltas] = box_head(features, sampled_boxes);
  const auto labels = torch::cat(sampled_labels);
  const auto total = static_cast<double>(labels.size(0));
  const auto box_class = torch::nn::functional::cross_entropy(
      logits, labels, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));

  // Rows of the positives in the concatenated samples: each image's block starts with them.
  std::vector<torch::Tensor> rows;
  std::int64_t offset = 0;
  for (std::size_t i = 0; i < sampled_labels.size(); ++i) {
    rows.push_back(torch::arange(offset, offset + positive_labels[i].size(0), labels.options()));
    offset += sampled_labels[i].size(0);
  }
  const auto positive_rows = torch::cat(rows);
  const auto classes = torch::cat(positive_labels) - 1;
  const auto k = config_.num_classes;
  const auto predicted = deltas.view({-1, k, 4}).index_select(0, positive_rows);
  const auto chosen = predicted.gather(1, classes.view({-1, 1, 1}).expand({-1, 1, 4})).squeeze(1);
  const auto box_regression = smooth_l1_sum(chosen, torch::cat(regression_targets), 1.0 / 9.0);

  Losses out{{"box_class", {box_class, total}}, {"box_regression", {box_regression, total}}};
  const auto num_positive = classes.size(0);
  if (num_positive == 0 && config_.norm != Norm::sync_batch) {
    out["mask"] = {torch::zeros({}, logits.options()), 0.0};
    return out;
  }
  if (num_positive == 0) {
    // Note [Batch norm variants]: the head's collectives run on every rank, this one with an empty
    // batch, and the zero loss keeps its backward (and that backward's collectives) in the graph.
    out["mask"] = {mask_head(features, positive_boxes).sum() * 0.0, 0.0};
    return out;
  }
  const auto mask_logits = mask_head(features, positive_boxes);
  const auto own_class =
      mask_logits.gather(1, classes.view({-1, 1, 1, 1}).expand({-1, 1, mask_size, mask_size})).squeeze(1);
  const auto mask = torch::binary_cross_entropy_with_logits(own_class, torch::cat(mask_targets), {},
                                                            {}, at::Reduction::Sum);
  out["mask"] = {mask, static_cast<double>(num_positive * mask_size * mask_size)};
  return out;
}

std::vector<Detections> RoiHeadsImpl::detect(
    const std::vector<torch::Tensor>& features, const std::vector<torch::Tensor>& proposals,
    const std::vector<std::pair<std::int64_t, std::int64_t>>& image_sizes) {
  const auto k = config_.num_classes;
  const auto [logits, deltas] = box_head(features, proposals);
  const auto probabilities = torch::softmax(logits, 1).slice(1, 1, k + 1);  // drop background
  const auto decoded = coder_.decode(deltas, torch::cat(proposals)).view({-1, k, 4});
  const auto per_image_scores = probabilities.split_with_sizes(counts_of(proposals));
  const auto per_image_boxes = decoded.split_with_sizes(counts_of(proposals));

  std::vector<Detections> out;
  std::vector<torch::Tensor> kept_boxes;
  for (std::size_t i = 0; i < proposals.size(); ++i) {
    const auto [height, width] = image_sizes[i];
    const auto r = per_image_scores[i].size(0);
    auto boxes = clip_boxes(per_image_boxes[i].reshape({-1, 4}), height, width);
    auto scores = per_image_scores[i].reshape({-1});
    auto labels = torch::arange(1, k + 1, torch::TensorOptions().dtype(torch::kLong).device(scores.device()))
                      .repeat({r});
    const auto keep = (scores > config_.score_threshold).logical_and(nonempty_boxes(boxes, 1e-2));
    const auto index = keep.nonzero().flatten();
    boxes = boxes.index_select(0, index);
    scores = scores.index_select(0, index);
    labels = labels.index_select(0, index);
    auto kept = batched_nms(boxes, scores, labels, config_.nms_threshold);
    kept = kept.narrow(0, 0, std::min(config_.detections_per_image, kept.size(0)));
    Detections d;
    d.boxes = boxes.index_select(0, kept);
    d.scores = scores.index_select(0, kept);
    d.labels = labels.index_select(0, kept);
    kept_boxes.push_back(d.boxes);
    out.push_back(std::move(d));
  }

  std::int64_t total = 0;
  for (const auto& b : kept_boxes) total += b.size(0);
  if (total == 0) {
    for (auto& d : out) d.masks = torch::zeros({0, mask_size, mask_size}, logits.options());
    return out;
  }
  const auto mask_logits = mask_head(features, kept_boxes);
  std::vector<torch::Tensor> labels;
  for (const auto& d : out) labels.push_back(d.labels);
  const auto own_class = mask_logits.gather(
      1, (torch::cat(labels) - 1).view({-1, 1, 1, 1}).expand({-1, 1, mask_size, mask_size}));
  const auto masks = torch::sigmoid(own_class.squeeze(1)).split_with_sizes(counts_of(kept_boxes));
  for (std::size_t i = 0; i < out.size(); ++i) out[i].masks = masks[i];
  return out;
}

}  // namespace mask_rcnn
