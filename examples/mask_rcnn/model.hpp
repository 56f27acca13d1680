#pragma once
// Mask R-CNN (He et al. 2017): ResNet-FPN backbone, region proposal network, box head and mask
// head, built from the pieces in this folder, and its checkpoints.

#include <torch/torch.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "backbone.hpp"
#include "detection.hpp"
#include "roi_heads.hpp"
#include "rpn.hpp"

namespace mask_rcnn {

struct MaskRcnnConfig {
  std::string preset;
  BackboneConfig backbone;
  RpnConfig rpn;
  RoiHeadsConfig roi_heads;
};

// The presets, smallest first:
//   tiny      16-128 channels, one block per stage, 64-channel FPN, anchors 16-256 px: the
//             generated shapes on a CPU in minutes
//   small     32-256 channels, 128-channel FPN, otherwise as tiny
//   resnet18  ResNet-18 widths and depth (64-512, two blocks per stage), 256-channel FPN, anchors
//             32-512 px, Detectron's sampling sizes: COCO-sized images on GPUs
//   resnet34  ResNet-34 depth (3, 4, 6, 3 blocks), as resnet18 otherwise
std::vector<std::string> preset_names();
// Throws std::invalid_argument naming the accepted presets.
MaskRcnnConfig preset_config(const std::string& preset, std::int64_t num_classes,
                             Norm norm = Norm::group);

class MaskRcnnImpl : public torch::nn::Module {
 public:
  explicit MaskRcnnImpl(const MaskRcnnConfig& config);

  // Training: one target per image. See Note [Losses over the global batch].
  Losses losses(const ImageBatch& batch, const std::vector<InstanceTargets>& targets);

  // Inference (call eval() first; no gradients needed).
  std::vector<Detections> detect(const ImageBatch& batch);

  const MaskRcnnConfig& config() const { return config_; }

 private:
  MaskRcnnConfig config_;
  ResNetFpn backbone_{nullptr};
  RegionProposalNetwork rpn_{nullptr};
  RoiHeads roi_heads_{nullptr};
};
TORCH_MODULE(MaskRcnn);

// What a checkpoint records besides the weights, so that evaluation can rebuild the model and map
// its classes back to the dataset's category ids.
struct CheckpointInfo {
  std::string preset;
  std::vector<std::int64_t> category_ids;  // label i + 1 is category_ids[i]
  std::vector<std::string> category_names;
  std::int64_t iterations = 0;
  Norm norm = Norm::group;  // checkpoints written before the option existed have group norm
};

// Writes the file next to its destination and renames it, so an interrupted run never leaves a
// truncated checkpoint.
void save_checkpoint(const std::filesystem::path& file, MaskRcnn& model, const CheckpointInfo& info);
// Builds the model the checkpoint describes and loads its weights. Throws std::runtime_error
// naming the file if it is not a checkpoint of this program.
MaskRcnn load_checkpoint(const std::filesystem::path& file, CheckpointInfo& info);

}  // namespace mask_rcnn
