#pragma once
// The backbone: a ResNet with group normalization (or batch norm, --norm), and a feature pyramid
// (FPN) on top of it.
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
//
// Note [Batch norm variants]
// For comparison (docs/mask-rcnn.md), the same convolutions can be followed by batch norm instead:
// plain BatchNorm2d, whose statistics come from each rank's 2 images (and, in the mask head, each
// rank's positive regions), or dtrain::SyncBatchNorm, whose statistics come from every rank's
// batch, as one process with the global batch would compute them. The mask head runs on a
// different number of regions on every rank, often none on some: SyncBatchNorm takes part with an
// empty batch (RoiHeadsImpl::losses calls the head even then), so no rank waits for another.

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

namespace mask_rcnn {

// The normalization after the convolutions of the backbone and the mask head.
enum class Norm { group, batch, sync_batch };

// "group", "batch", "syncbn" (the --norm values), and back; norm_from_name throws
// std::invalid_argument naming the accepted names.
std::string norm_name(Norm norm);
Norm norm_from_name(const std::string& name);

struct BackboneConfig {
  std::int64_t stem_width = 16;
  std::vector<std::int64_t> widths = {16, 32, 64, 128};  // C2 .. C5
  std::vector<std::int64_t> blocks = {1, 1, 1, 1};       // basic blocks per stage
  std::int64_t fpn_channels = 64;
  std::int64_t norm_groups = 8;  // group normalization groups (at most the channel count)
  Norm norm = Norm::group;
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

// The `norm` layer over `channels` (GroupNorm as group_norm makes it, BatchNorm2d, or
// dtrain::SyncBatchNorm), held as an AnyModule so that one member or Sequential slot holds any
// of them under the same parameter names.
torch::nn::AnyModule norm_layer(std::int64_t channels, std::int64_t groups, Norm norm);

}  // namespace mask_rcnn
