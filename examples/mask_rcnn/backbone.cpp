#include "backbone.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace mask_rcnn {

namespace nn = torch::nn;
namespace F = torch::nn::functional;

nn::GroupNorm group_norm(std::int64_t channels, std::int64_t groups) {
  auto g = std::min(groups, channels);
  while (channels % g != 0) --g;
  return nn::GroupNorm(nn::GroupNormOptions(g, channels));
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
  BasicBlockImpl(std::int64_t in, std::int64_t out, std::int64_t stride, std::int64_t groups)
      : conv1_(register_module("conv1", conv(in, out, 3, stride, false))),
        norm1_(register_module("norm1", group_norm(out, groups))),
        conv2_(register_module("conv2", conv(out, out, 3, 1, false))),
        norm2_(register_module("norm2", group_norm(out, groups))) {
    // The residual branch starts as zero, so every block starts as the identity: deep networks
    // from scratch train from the first step (Goyal et al. 2017).
    nn::init::zeros_(norm2_->weight);
    if (stride != 1 || in != out) {
      shortcut_ = register_module(
          "shortcut", nn::Sequential(conv(in, out, 1, stride, false), group_norm(out, groups)));
    }
  }

  torch::Tensor forward(const torch::Tensor& x) {
    auto y = torch::relu(norm1_(conv1_(x)));
    y = norm2_(conv2_(y));
    return torch::relu(y + (shortcut_ ? shortcut_->forward(x) : x));
  }

 private:
  nn::Conv2d conv1_;
  nn::GroupNorm norm1_;
  nn::Conv2d conv2_;
  nn::GroupNorm norm2_;
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
  stem_ = register_module("stem", nn::Sequential(conv(3, config.stem_width, 3, 2, false),
                                                 group_norm(config.stem_width, config.norm_groups),
                                                 nn::ReLU()));
  std::int64_t in = config.stem_width;
  for (std::size_t s = 0; s < 4; ++s) {
    nn::Sequential stage;
    for (std::int64_t b = 0; b < config.blocks[s]; ++b) {
      stage->push_back(BasicBlock(b == 0 ? in : config.widths[s], config.widths[s], b == 0 ? 2 : 1,
                                  config.norm_groups));
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
