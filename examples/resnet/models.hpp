#pragma once
// Residual networks for image classification, written against the libtorch C++ frontend.
//
// Two families:
//  - CIFAR-style ResNet-(6n+2) (He et al. 2016, section 4.2): a 3x3 stem, three stages of n basic
//    blocks with 16/32/64 channels, global average pooling. ResNet-20/32/44/56/110 are n = 3..18;
//    ResNet-8 (n = 1) is the quick demo model.
//  - ImageNet-style ResNet-18/34 (basic blocks) and ResNet-50 (bottleneck blocks) with the
//    standard stem (7x7 stride-2 convolution and max-pool), or the small-input stem (3x3 stride 1,
//    no max-pool) for 32 px and smaller images, which the standard stem would shrink to 8 px before
//    the first block. choose_stem() decides between them.

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
  // Batch norm with the statistics of every rank's batch: N ranks with batch b normalize as one
  // process with batch N*b. dtrain::SyncBatchNorm2d built where batch norm builds
  // torch::nn::BatchNorm2d, with the same options; the parameter names stay, so checkpoints load
  // into either model.
  sync_batch,
};

struct ModelOptions {
  std::int64_t in_channels = 3;  // 1 for Fashion-MNIST, 3 for CIFAR-10 and image folders
  std::int64_t num_classes = 10;
  Shortcut shortcut = Shortcut::zero_pad;  // CIFAR-style networks only
  // ImageNet-style networks only: a 3x3 stride-1 stem without max-pool instead of the 7x7 stride-2
  // stem and max-pool, which would shrink a 32 px input to 8 px before the first block. On larger
  // inputs it costs 16x the compute of the standard network (every feature map 4x larger on each
  // side) and is no longer the model the name promises.
  bool small_input_stem = false;
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

// Which stem an ImageNet-style network gets, and why, for the trainer's header line.
struct StemChoice {
  bool small_input_stem = false;
  std::string description;  // e.g. "standard stem (7x7 stride 2 + max-pool)"
};

// `requested` is "auto", "standard" or "small". Auto takes the small-input stem for images of at
// most kSmallStemMaxSide pixels (Fashion-MNIST, CIFAR-10) and the standard stem above. CIFAR-style
// networks always have their own 3x3 stem: the choice does not apply to them (description empty).
// Throws std::invalid_argument for another `requested`.
inline constexpr std::int64_t kSmallStemMaxSide = 32;
StemChoice choose_stem(std::string_view model, std::string_view requested, std::int64_t image_side);

// The names make_model accepts, for usage messages.
std::vector<std::string> model_names();

// "resnet8", "resnet20", "resnet32", "resnet44", "resnet56", "resnet110" (CIFAR-style) and
// "resnet18", "resnet34", "resnet50" (ImageNet-style). Throws std::invalid_argument naming the
// accepted names for anything else.
std::shared_ptr<Classifier> make_model(std::string_view name, const ModelOptions& options);

}  // namespace resnet
