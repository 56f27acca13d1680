#include "model.hpp"

#include <nlohmann/json.hpp>

#include <stdexcept>

namespace mask_rcnn {

std::vector<std::string> preset_names() { return {"tiny", "small", "resnet18", "resnet34"}; }

MaskRcnnConfig preset_config(const std::string& preset, std::int64_t num_classes, Norm norm) {
  MaskRcnnConfig c;
  c.preset = preset;
  c.roi_heads.num_classes = num_classes;
  c.backbone.norm = norm;
  c.roi_heads.norm = norm;
  if (preset == "tiny") return c;  // the defaults of the config structs
  if (preset == "small") {
    c.backbone.stem_width = 32;
    c.backbone.widths = {32, 64, 128, 256};
    c.backbone.fpn_channels = 128;
    c.roi_heads.box_head_dim = 512;
    c.roi_heads.mask_head_channels = 128;
    return c;
  }
  if (preset == "resnet18" || preset == "resnet34") {
    c.backbone.stem_width = 64;
    c.backbone.widths = {64, 128, 256, 512};
    c.backbone.blocks = preset == "resnet18" ? std::vector<std::int64_t>{2, 2, 2, 2}
                                             : std::vector<std::int64_t>{3, 4, 6, 3};
    c.backbone.fpn_channels = 256;
    c.backbone.norm_groups = 32;
    c.rpn.anchor_sizes = {32, 64, 128, 256, 512};
    c.rpn.pre_nms_top_n_train = 2000;
    c.rpn.pre_nms_top_n_test = 1000;
    c.rpn.post_nms_top_n_train = 1000;
    c.rpn.post_nms_top_n_test = 1000;
    c.roi_heads.canonical_box_size = 224;
    c.roi_heads.box_head_dim = 1024;
    c.roi_heads.mask_head_channels = 256;
    c.roi_heads.norm_groups = 32;
    c.roi_heads.batch_per_image = 512;
    return c;
  }
  std::string accepted;
  for (const auto& name : preset_names()) accepted += (accepted.empty() ? "" : ", ") + name;
  throw std::invalid_argument("unknown model '" + preset + "': choose one of " + accepted);
}

MaskRcnnImpl::MaskRcnnImpl(const MaskRcnnConfig& config) : config_(config) {
  const auto channels = config.backbone.fpn_channels;
  backbone_ = register_module("backbone", ResNetFpn(config.backbone));
  rpn_ = register_module("rpn", RegionProposalNetwork(config.rpn, channels));
  roi_heads_ = register_module("roi_heads", RoiHeads(config.roi_heads, channels));
}

namespace {

// P2 .. P5: the box and mask heads do not pool from P6, which only the RPN uses.
std::vector<torch::Tensor> roi_levels(const std::vector<torch::Tensor>& pyramid) {
  return {pyramid.begin(), pyramid.begin() + 4};
}

}  // namespace

Losses MaskRcnnImpl::losses(const ImageBatch& batch, const std::vector<InstanceTargets>& targets) {
  const auto pyramid = backbone_->forward(batch.images);
  auto rpn = rpn_->forward(pyramid, batch.sizes, &targets);
  auto losses = roi_heads_->losses(roi_levels(pyramid), rpn.proposals, targets);
  losses.insert(rpn.losses.begin(), rpn.losses.end());
  return losses;
}

std::vector<Detections> MaskRcnnImpl::detect(const ImageBatch& batch) {
  const auto pyramid = backbone_->forward(batch.images);
  const auto rpn = rpn_->forward(pyramid, batch.sizes);
  return roi_heads_->detect(roi_levels(pyramid), rpn.proposals, batch.sizes);
}

namespace {
constexpr const char* info_key = "mask_rcnn_checkpoint";
}

void save_checkpoint(const std::filesystem::path& file, MaskRcnn& model, const CheckpointInfo& info) {
  const nlohmann::json meta = {{"format", 1},
                               {"preset", info.preset},
                               {"norm", norm_name(info.norm)},
                               {"category_ids", info.category_ids},
                               {"category_names", info.category_names},
                               {"iterations", info.iterations}};
  torch::serialize::OutputArchive archive;
  archive.write(info_key, c10::IValue(meta.dump()));
  model->save(archive);
  if (file.has_parent_path()) std::filesystem::create_directories(file.parent_path());
  const auto tmp = std::filesystem::path(file.string() + ".tmp");
  archive.save_to(tmp.string());
  std::filesystem::rename(tmp, file);
}

MaskRcnn load_checkpoint(const std::filesystem::path& file, CheckpointInfo& info) {
  if (!std::filesystem::is_regular_file(file)) {
    throw std::runtime_error(file.string() + ": checkpoint not found");
  }
  torch::serialize::InputArchive archive;
  c10::IValue meta;
  try {
    archive.load_from(file.string());
    if (!archive.try_read(info_key, meta) || !meta.isString()) {
      throw std::runtime_error("no model description");
    }
  } catch (const std::exception& e) {
    throw std::runtime_error(file.string() + ": not a Mask R-CNN checkpoint written by this program (" +
                             std::string(e.what()).substr(0, 200) + ")");
  }
  const auto json = nlohmann::json::parse(meta.toStringRef());
  info.preset = json.at("preset").get<std::string>();
  info.category_ids = json.at("category_ids").get<std::vector<std::int64_t>>();
  info.category_names = json.at("category_names").get<std::vector<std::string>>();
  info.iterations = json.at("iterations").get<std::int64_t>();
  info.norm = norm_from_name(json.value("norm", "group"));
  MaskRcnn model(preset_config(info.preset, static_cast<std::int64_t>(info.category_ids.size()),
                               info.norm));
  model->load(archive);
  return model;
}

}  // namespace mask_rcnn
