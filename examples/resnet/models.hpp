#pragma once
// Residual networks for image classification, written against the libtorch C++ frontend.
//
// Two families:
//  - CIFAR-style ResNet-(6n+2) (He et al. 2016, section 4.2): a 3x3 stem, three stages of n basic
//    blocks with 16/32/64 channels, global average pooling. ResNet-20/32/44/56/110 are n = 3..18;
//    ResNet-8 (n = 1) is the quick demo model.
//  - ImageNet-style ResNet-18/34 (basic blocks) and ResNet-50 (bottleneck blocks), optionally with
//    a 3x3 stride-1 stem and no max-pool so that 28-64 px inputs are not downsampled away.

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace resnet {

// How a residual block matches shapes when it changes channels or resolution.
enum class Shortcut {
  // Option A: subsample and zero-pad the missing channels. Adds no parameters; He et al.'s choice
  // for the CIFAR networks.
  zero_pad,
  // Option B: a strided 1x1 convolution + batch norm. The choice for the ImageNet networks.
  projection,
};

// The normalization after each convolution.
enum class Norm {
  // Batch norm (He et al.'s choice). Statistics come from each rank's own batch, so N ranks with
  // batch b normalize differently from one process with batch N*b.
  batch,
  // Group norm (Wu & He 2018), 8 channels per group. Per-sample statistics: the result does not
  // depend on how the global batch is split across ranks, and small per-rank batches work.
  group,
};

struct ModelOptions {
  std::int64_t in_channels = 3;  // 1 for Fashion-MNIST, 3 for CIFAR-10 and image folders
  std::int64_t num_classes = 10;
  Shortcut shortcut = Shortcut::zero_pad;  // CIFAR-style networks only
  // ImageNet-style networks only: a 3x3 stride-1 stem without max-pool instead of the 7x7 stride-2
  // stem and max-pool, which would shrink a 32 px input to 8 px before the first block.
  bool small_input_stem = true;
  Norm norm = Norm::batch;
};

// Every model maps a [N, C, H, W] float batch to [N, num_classes] logits.
class Classifier : public torch::nn::Module {
 public:
  virtual torch::Tensor forward(torch::Tensor images) = 0;
};

class BasicBlockImpl : public torch::nn::Module {
 public:
  BasicBlockImpl(std::int64_t in_channels, std::int64_t out_channels, std::int64_t stride,
                 Shortcut shortcut, Norm norm = Norm::batch);
  torch::Tensor forward(torch::Tensor x);

 private:
  torch::nn::Conv2d conv1_{nullptr}, conv2_{nullptr};
  torch::nn::Sequential norm1_{nullptr}, norm2_{nullptr};  // one Norm module each
  torch::nn::Sequential projection_{nullptr};
  std::int64_t stride_ = 1;
  std::int64_t pad_channels_ = 0;  // zero_pad shortcut: channels added on each side
};
TORCH_MODULE(BasicBlock);

class BottleneckImpl : public torch::nn::Module {
 public:
  static constexpr std::int64_t expansion = 4;
  BottleneckImpl(std::int64_t in_channels, std::int64_t width, std::int64_t stride,
                 Norm norm = Norm::batch);
  torch::Tensor forward(torch::Tensor x);

 private:
  torch::nn::Conv2d conv1_{nullptr}, conv2_{nullptr}, conv3_{nullptr};
  torch::nn::Sequential norm1_{nullptr}, norm2_{nullptr}, norm3_{nullptr};
  torch::nn::Sequential projection_{nullptr};
};
TORCH_MODULE(Bottleneck);

// ResNet-(6n+2) for 32x32-class inputs.
class CifarResNet : public Classifier {
 public:
  CifarResNet(std::int64_t depth, const ModelOptions& options);
  torch::Tensor forward(torch::Tensor images) override;

 private:
  torch::nn::Sequential features_{nullptr};
  torch::nn::Linear fc_{nullptr};
};

class ImageNetResNet : public Classifier {
 public:
  enum class Block { basic, bottleneck };
  ImageNetResNet(Block block, std::vector<std::int64_t> blocks_per_stage,
                 const ModelOptions& options);
  torch::Tensor forward(torch::Tensor images) override;

 private:
  torch::nn::Sequential features_{nullptr};
  torch::nn::Linear fc_{nullptr};
};

// The names make_model accepts, for usage messages.
std::vector<std::string> model_names();

// "resnet8", "resnet20", "resnet32", "resnet44", "resnet56", "resnet110" (CIFAR-style) and
// "resnet18", "resnet34", "resnet50" (ImageNet-style). Throws std::invalid_argument naming the
// accepted names for anything else.
std::shared_ptr<Classifier> make_model(std::string_view name, const ModelOptions& options);

}  // namespace resnet
