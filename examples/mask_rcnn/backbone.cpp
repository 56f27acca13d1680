#include "backbone.hpp"

#include <dtrain/torch/sync_batch_norm.hpp>

#include <algorithm>
#include <stdexcept>
#include <string>

namespace mask_rcnn {

namespace nn = torch::nn;
namespace F = torch::nn::functional;

std::string norm_name(Norm norm) {
  switch (norm) {
    case Norm::group: return "group";
    case Norm::batch: return "batch";
    case Norm::sync_batch: return "syncbn";
  }
  return "group";
}

Norm norm_from_name(const std::string& name) {
  for (const auto norm : {Norm::group, Norm::batch, Norm::sync_batch})
    if (norm_name(norm) == name) return norm;
  throw std::invalid_argument("unknown norm '" + name + "': choose one of group, batch, syncbn");
}

nn::GroupNorm group_norm(std::int64_t channels, std::int64_t groups) {
  auto g = std::min(groups, channels);
  while (channels % g != 0) --g;
  return nn::GroupNorm(nn::GroupNormOptions(g, channels));
}

nn::AnyModule norm_layer(std::int64_t channels, std::int64_t groups, Norm norm) {
  switch (norm) {
    case Norm::batch: return nn::AnyModule(nn::BatchNorm2d(channels));
    case Norm::sync_batch: return nn::AnyModule(dtrain::SyncBatchNorm(channels));
    case Norm::group: break;
  }
  return nn::AnyModule(group_norm(channels, groups));
}

namespace {

nn::Conv2d conv(std::int64_t in, std::int64_t out, std::int64_t kernel, std::int64_t stride,
                bool bias) {
  nn::Conv2d c(nn::Conv2dOptions(in, out, kernel).stride(stride).padding(kernel / 2).bias(bias));
  nn::init::kaiming_normal_(c->weight, 0.0, torch::kFanOut, torch::kReLU);
  if (bias) nn::init::zeros_(c->bias);
  return c;
}

class BasicBlockImpl : public nn::Module {
 public:
  BasicBlockImpl(std::int64_t in, std::int64_t out, std::int64_t stride, std::int64_t groups,
                 Norm norm)
      : conv1_(register_module("conv1", conv(in, out, 3, stride, false))),
        norm1_(norm_layer(out, groups, norm)),
        conv2_(register_module("conv2", conv(out, out, 3, 1, false))),
        norm2_(norm_layer(out, groups, norm)) {
    register_module("norm1", norm1_.ptr());
    register_module("norm2", norm2_.ptr());
    // The residual branch starts as zero, so every block starts as the identity: deep networks
    // from scratch train from the first step (Goyal et al. 2017).
    nn::init::zeros_(norm2_.ptr()->named_parameters(false)["weight"]);
    if (stride != 1 || in != out) {
      nn::Sequential shortcut(conv(in, out, 1, stride, false));
      shortcut->push_back(norm_layer(out, groups, norm));
      shortcut_ = register_module("shortcut", shortcut);
    }
  }

  torch::Tensor forward(const torch::Tensor& x) {
    auto y = torch::relu(norm1_.forward<torch::Tensor>(conv1_(x)));
    y = norm2_.forward<torch::Tensor>(conv2_(y));
    return torch::relu(y + (shortcut_ ? shortcut_->forward(x) : x));
  }

 private:
  nn::Conv2d conv1_;
  nn::AnyModule norm1_;
  nn::Conv2d conv2_;
  nn::AnyModule norm2_;
  nn::Sequential shortcut_{nullptr};
};
TORCH_MODULE(BasicBlock);

nn::Conv2d fpn_conv(std::int64_t in, std::int64_t out, std::int64_t kernel) {
  nn::Conv2d c(nn::Conv2dOptions(in, out, kernel).padding(kernel / 2));
  nn::init::kaiming_uniform_(c->weight, 1.0);
  nn::init::zeros_(c->bias);
  return c;
}

}  // namespace

ResNetFpnImpl::ResNetFpnImpl(const BackboneConfig& config) {
  if (config.widths.size() != 4 || config.blocks.size() != 4) {
    throw std::invalid_argument("ResNetFpn: widths and blocks need one entry per stage C2..C5");
  }
  nn::Sequential stem(conv(3, config.stem_width, 3, 2, false));
  stem->push_back(norm_layer(config.stem_width, config.norm_groups, config.norm));
  stem->push_back(nn::ReLU());
  stem_ = register_module("stem", stem);
  std::int64_t in = config.stem_width;
  for (std::size_t s = 0; s < 4; ++s) {
    nn::Sequential stage;
    for (std::int64_t b = 0; b < config.blocks[s]; ++b) {
      stage->push_back(BasicBlock(b == 0 ? in : config.widths[s], config.widths[s], b == 0 ? 2 : 1,
                                  config.norm_groups, config.norm));
    }
    in = config.widths[s];
    stages_.push_back(register_module("c" + std::to_string(s + 2), stage));
    lateral_.push_back(register_module("fpn_lateral" + std::to_string(s + 2),
                                       fpn_conv(config.widths[s], config.fpn_channels, 1)));
    output_.push_back(register_module("fpn_output" + std::to_string(s + 2),
                                      fpn_conv(config.fpn_channels, config.fpn_channels, 3)));
  }
}

std::vector<torch::Tensor> ResNetFpnImpl::forward(const torch::Tensor& images) {
  std::vector<torch::Tensor> c;
  auto x = stem_->forward(images);
  for (auto& stage : stages_) {
    x = stage->forward(x);
    c.push_back(x);
  }
  std::vector<torch::Tensor> p(5);
  auto top = lateral_[3](c[3]);
  p[3] = output_[3](top);
  for (int l = 2; l >= 0; --l) {
    const auto lateral = lateral_[static_cast<std::size_t>(l)](c[static_cast<std::size_t>(l)]);
    const auto size = std::vector<std::int64_t>{lateral.size(2), lateral.size(3)};
    top = lateral + F::interpolate(top, F::InterpolateFuncOptions().size(size).mode(torch::kNearest));
    p[static_cast<std::size_t>(l)] = output_[static_cast<std::size_t>(l)](top);
  }
  p[4] = F::max_pool2d(p[3], F::MaxPool2dFuncOptions(1).stride(2));
  return p;
}

}  // namespace mask_rcnn
