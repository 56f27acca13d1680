#pragma once
// The backbone: a ResNet with group normalization, and a feature pyramid (FPN) on top of it.
//
// Note [Group normalization]
// Detection trains on a few images per process (2-4 here, 1-2 per GPU on COCO). Batch norm would
// estimate its statistics from those few images, differently on every rank, and a model trained
// on 2 ranks would not be the model trained on 1 rank with the doubled batch. The usual remedy,
// batch norm frozen at ImageNet statistics, needs a pretrained network; this example trains from
// scratch. Group normalization (Wu & He 2018) normalizes each image on its own, so it behaves the
// same for any batch size and any number of ranks, and it trains detectors from scratch (He et
// al. 2019, "Rethinking ImageNet Pre-training"). Every convolution of the backbone and of the
// mask head is followed by one; the FPN's convolutions have none, as in the FPN paper.

#include <torch/torch.h>

#include <cstdint>
#include <vector>

namespace mask_rcnn {

struct BackboneConfig {
  std::int64_t stem_width = 16;
  std::vector<std::int64_t> widths = {16, 32, 64, 128};  // C2 .. C5
  std::vector<std::int64_t> blocks = {1, 1, 1, 1};       // basic blocks per stage
  std::int64_t fpn_channels = 64;
  std::int64_t norm_groups = 8;  // group normalization groups (at most the channel count)
};

// Strides 4, 8, 16, 32 for C2 .. C5: a 3x3 stride-2 stem, then every stage starts with a stride-2
// basic block. The FPN outputs P2 .. P5 (3x3 convolutions over lateral 1x1 projections plus the
// upsampled coarser level) and P6 (P5 subsampled), all with fpn_channels.
class ResNetFpnImpl : public torch::nn::Module {
 public:
  explicit ResNetFpnImpl(const BackboneConfig& config);

  // images [N, 3, H, W] -> {P2, P3, P4, P5, P6}.
  std::vector<torch::Tensor> forward(const torch::Tensor& images);

  static constexpr std::int64_t first_level = 2;
  static constexpr std::int64_t num_levels = 5;

 private:
  torch::nn::Sequential stem_{nullptr};
  std::vector<torch::nn::Sequential> stages_;
  std::vector<torch::nn::Conv2d> lateral_, output_;
};
TORCH_MODULE(ResNetFpn);

// GroupNorm with min(groups, channels) groups.
torch::nn::GroupNorm group_norm(std::int64_t channels, std::int64_t groups);

}  // namespace mask_rcnn
