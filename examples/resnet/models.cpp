#include "models.hpp"

#include <dtrain/torch.hpp>

#include <algorithm>
#include <stdexcept>
#include <utility>

namespace resnet {
namespace {

namespace F = torch::nn::functional;

torch::nn::Conv2d conv3x3(std::int64_t in, std::int64_t out, std::int64_t stride) {
  return torch::nn::Conv2d(
      torch::nn::Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(false));
}

torch::nn::Conv2d conv1x1(std::int64_t in, std::int64_t out, std::int64_t stride) {
  return torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 1).stride(stride).bias(false));
}

// A Sequential of one module, so blocks hold any kind behind one type.
torch::nn::Sequential norm_layer(std::int64_t channels, Norm norm) {
  if (norm == Norm::group) {
    const auto groups = std::max<std::int64_t>(1, channels / 8);
    return torch::nn::Sequential(
        torch::nn::GroupNorm(torch::nn::GroupNormOptions(groups, channels)));
  }
  const auto options = torch::nn::BatchNorm2dOptions(channels);
  // dtrain: synchronized batch norm is the same line with dtrain's type.
  if (norm == Norm::sync_batch) return torch::nn::Sequential(dtrain::SyncBatchNorm2d(options));
  return torch::nn::Sequential(torch::nn::BatchNorm2d(options));
}

torch::nn::Sequential projection(std::int64_t in, std::int64_t out, std::int64_t stride,
                                 Norm norm) {
  auto layers = torch::nn::Sequential(conv1x1(in, out, stride));
  layers->extend(*norm_layer(out, norm));
  return layers;
}

// He et al. initialise convolutions for ReLU networks with fan-out scaling; batch norm starts as
// the identity (libtorch's default).
void init_weights(torch::nn::Module& model) {
  torch::NoGradGuard no_grad;
  for (auto& module : model.modules(/*include_self=*/false)) {
    if (auto* conv = module->as<torch::nn::Conv2d>()) {
      torch::nn::init::kaiming_normal_(conv->weight, 0.0, torch::kFanOut, torch::kReLU);
    }
  }
}

torch::nn::Sequential classifier_head() {
  return torch::nn::Sequential(torch::nn::AdaptiveAvgPool2d(1), torch::nn::Flatten());
}

}  // namespace

BasicBlockImpl::BasicBlockImpl(std::int64_t in_channels, std::int64_t out_channels,
                               std::int64_t stride, Shortcut shortcut, Norm norm)
    : stride_(stride) {
  conv1_ = register_module("conv1", conv3x3(in_channels, out_channels, stride));
  norm1_ = register_module("norm1", norm_layer(out_channels, norm));
  conv2_ = register_module("conv2", conv3x3(out_channels, out_channels, 1));
  norm2_ = register_module("norm2", norm_layer(out_channels, norm));
  if (stride != 1 || in_channels != out_channels) {
    if (shortcut == Shortcut::projection) {
      projection_ =
          register_module("shortcut", projection(in_channels, out_channels, stride, norm));
    } else {
      if (out_channels < in_channels) {
        throw std::invalid_argument("a zero-padding shortcut cannot reduce channels (" +
                                    std::to_string(in_channels) + " -> " +
                                    std::to_string(out_channels) + ")");
      }
      pad_channels_ = out_channels - in_channels;
    }
  }
}

torch::Tensor BasicBlockImpl::forward(torch::Tensor x) {
  auto out = torch::relu(norm1_->forward(conv1_(x)));
  out = norm2_->forward(conv2_(out));
  torch::Tensor identity = x;
  if (projection_) {
    identity = projection_->forward(x);
  } else if (stride_ != 1 || pad_channels_ != 0) {
    using torch::indexing::Slice;
    identity = x.index({Slice(), Slice(), Slice(0, torch::indexing::None, stride_),
                        Slice(0, torch::indexing::None, stride_)});
    const auto front = pad_channels_ / 2;
    identity = F::pad(identity, F::PadFuncOptions({0, 0, 0, 0, front, pad_channels_ - front}));
  }
  return torch::relu(out + identity);
}

BottleneckImpl::BottleneckImpl(std::int64_t in_channels, std::int64_t width, std::int64_t stride,
                               Norm norm) {
  const auto out_channels = width * expansion;
  conv1_ = register_module("conv1", conv1x1(in_channels, width, 1));
  norm1_ = register_module("norm1", norm_layer(width, norm));
  // The stride sits on the 3x3 convolution (the "ResNet v1.5" placement torchvision uses).
  conv2_ = register_module("conv2", conv3x3(width, width, stride));
  norm2_ = register_module("norm2", norm_layer(width, norm));
  conv3_ = register_module("conv3", conv1x1(width, out_channels, 1));
  norm3_ = register_module("norm3", norm_layer(out_channels, norm));
  if (stride != 1 || in_channels != out_channels) {
    projection_ =
        register_module("shortcut", projection(in_channels, out_channels, stride, norm));
  }
}

torch::Tensor BottleneckImpl::forward(torch::Tensor x) {
  auto out = torch::relu(norm1_->forward(conv1_(x)));
  out = torch::relu(norm2_->forward(conv2_(out)));
  out = norm3_->forward(conv3_(out));
  return torch::relu(out + (projection_ ? projection_->forward(x) : x));
}

CifarResNet::CifarResNet(std::int64_t depth, const ModelOptions& options) {
  if (depth < 8 || (depth - 2) % 6 != 0) {
    throw std::invalid_argument("CIFAR-style ResNet depth must be 6n+2 with n >= 1, got " +
                                std::to_string(depth));
  }
  const auto blocks_per_stage = (depth - 2) / 6;
  torch::nn::Sequential features(conv3x3(options.in_channels, 16, 1));
  features->extend(*norm_layer(16, options.norm));
  features->push_back(torch::nn::ReLU());
  std::int64_t channels = 16;
  for (const std::int64_t width : {16, 32, 64}) {
    for (std::int64_t i = 0; i < blocks_per_stage; ++i) {
      const std::int64_t stride = (i == 0 && width != 16) ? 2 : 1;
      features->push_back(BasicBlock(channels, width, stride, options.shortcut, options.norm));
      channels = width;
    }
  }
  features->extend(*classifier_head());
  features_ = register_module("features", features);
  fc_ = register_module("fc", torch::nn::Linear(channels, options.num_classes));
  init_weights(*this);
}

torch::Tensor CifarResNet::forward(torch::Tensor images) { return fc_(features_->forward(images)); }

ImageNetResNet::ImageNetResNet(Block block, std::vector<std::int64_t> blocks_per_stage,
                               const ModelOptions& options) {
  torch::nn::Sequential features;
  if (options.small_input_stem) {
    features->push_back(conv3x3(options.in_channels, 64, 1));
    features->extend(*norm_layer(64, options.norm));
    features->push_back(torch::nn::ReLU());
  } else {
    features->push_back(torch::nn::Conv2d(
        torch::nn::Conv2dOptions(options.in_channels, 64, 7).stride(2).padding(3).bias(false)));
    features->extend(*norm_layer(64, options.norm));
    features->push_back(torch::nn::ReLU());
    features->push_back(torch::nn::MaxPool2d(torch::nn::MaxPool2dOptions(3).stride(2).padding(1)));
  }
  std::int64_t channels = 64;
  std::int64_t width = 64;
  for (std::size_t stage = 0; stage < blocks_per_stage.size(); ++stage, width *= 2) {
    for (std::int64_t i = 0; i < blocks_per_stage[stage]; ++i) {
      const std::int64_t stride = (i == 0 && stage > 0) ? 2 : 1;
      if (block == Block::basic) {
        features->push_back(
            BasicBlock(channels, width, stride, Shortcut::projection, options.norm));
        channels = width;
      } else {
        features->push_back(Bottleneck(channels, width, stride, options.norm));
        channels = width * BottleneckImpl::expansion;
      }
    }
  }
  features->extend(*classifier_head());
  features_ = register_module("features", features);
  fc_ = register_module("fc", torch::nn::Linear(channels, options.num_classes));
  init_weights(*this);
}

torch::Tensor ImageNetResNet::forward(torch::Tensor images) {
  return fc_(features_->forward(images));
}

StemChoice choose_stem(std::string_view model, std::string_view requested,
                       std::int64_t image_side) {
  if (requested != "auto" && requested != "standard" && requested != "small") {
    throw std::invalid_argument("stem must be auto, standard or small, got '" +
                                std::string(requested) + "'");
  }
  if (model != "resnet18" && model != "resnet34" && model != "resnet50") return {};
  const bool small =
      requested == "small" || (requested == "auto" && image_side <= kSmallStemMaxSide);
  std::string description = small ? "small-input stem (3x3 stride 1, no max-pool)"
                                   : "standard stem (7x7 stride 2 + max-pool)";
  if (requested == "auto") {
    description += small ? ", for " + std::to_string(image_side) + " px images (<= " +
                               std::to_string(kSmallStemMaxSide) + " px; --stem to choose)"
                         : ", for " + std::to_string(image_side) + " px images (--stem to choose)";
  } else {
    description += ", chosen by --stem";
  }
  return {small, description};
}

std::vector<std::string> model_names() {
  return {"resnet8",   "resnet20", "resnet32", "resnet44", "resnet56",
          "resnet110", "resnet18", "resnet34", "resnet50"};
}

std::shared_ptr<Classifier> make_model(std::string_view name, const ModelOptions& options) {
  if (options.in_channels < 1 || options.num_classes < 2) {
    throw std::invalid_argument("model options need in_channels >= 1 and num_classes >= 2, got " +
                                std::to_string(options.in_channels) + " and " +
                                std::to_string(options.num_classes));
  }
  using Block = ImageNetResNet::Block;
  using Stages = std::vector<std::int64_t>;
  if (name == "resnet18") {
    return std::make_shared<ImageNetResNet>(Block::basic, Stages{2, 2, 2, 2}, options);
  }
  if (name == "resnet34") {
    return std::make_shared<ImageNetResNet>(Block::basic, Stages{3, 4, 6, 3}, options);
  }
  if (name == "resnet50") {
    return std::make_shared<ImageNetResNet>(Block::bottleneck, Stages{3, 4, 6, 3}, options);
  }
  for (const std::int64_t depth : {8, 20, 32, 44, 56, 110}) {
    if (name == "resnet" + std::to_string(depth)) {
      return std::make_shared<CifarResNet>(depth, options);
    }
  }
  std::string accepted;
  for (const auto& known : model_names()) accepted += (accepted.empty() ? "" : ", ") + known;
  throw std::invalid_argument("unknown model '" + std::string(name) + "'; accepted: " + accepted);
}

}  // namespace resnet
