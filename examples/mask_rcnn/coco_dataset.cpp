#include "coco_dataset.hpp"

#include <stb_image.h>

#include <algorithm>
#include <cmath>
#include <memory>

namespace mask_rcnn {

namespace F = torch::nn::functional;

CocoDataset::CocoDataset(CocoDatasetOptions options) : options_(std::move(options)) {
  coco_ = read_coco_annotations(options_.annotation_file);
  check_image_files(coco_, options_.image_dir, options_.annotation_file);

  std::vector<CocoCategory> sorted = coco_.categories;
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
  for (const auto& c : sorted) {
    label_of_[c.id] = static_cast<std::int64_t>(categories_.size()) + 1;
    categories_.push_back({c.id, c.name});
  }
  for (std::size_t a = 0; a < coco_.annotations.size(); ++a) {
    annotations_of_[coco_.annotations[a].image_id].push_back(a);
  }
  for (std::size_t i = 0; i < coco_.images.size(); ++i) {
    if (options_.skip_empty) {
      const auto& anns = annotations_of_[coco_.images[i].id];
      const bool any = std::any_of(anns.begin(), anns.end(),
                                   [&](std::size_t a) { return !coco_.annotations[a].iscrowd; });
      if (!any) continue;
    }
    images_.push_back(i);
  }
  if (images_.empty()) {
    throw CocoFormatError(options_.annotation_file.string() + ": no images" +
                          (options_.skip_empty ? " with objects to train on" : ""));
  }
}

double CocoDataset::scale_of(const CocoImage& image) const {
  if (options_.min_size <= 0) return 1.0;
  const auto shorter = static_cast<double>(std::min(image.width, image.height));
  const auto longer = static_cast<double>(std::max(image.width, image.height));
  double scale = static_cast<double>(options_.min_size) / shorter;
  if (options_.max_size > 0 && longer * scale > static_cast<double>(options_.max_size)) {
    scale = static_cast<double>(options_.max_size) / longer;
  }
  return scale;
}

std::pair<std::int64_t, std::int64_t> CocoDataset::image_size(std::int64_t index) const {
  const auto& image = coco_.images[images_.at(static_cast<std::size_t>(index))];
  const double s = scale_of(image);
  return {std::lround(static_cast<double>(image.height) * s),
          std::lround(static_cast<double>(image.width) * s)};
}

DetectionSample CocoDataset::get(std::int64_t index) const {
  const CocoImage& image = coco_.images[images_.at(static_cast<std::size_t>(index))];
  const auto path = options_.image_dir / image.file_name;
  int w = 0, h = 0, channels = 0;
  std::unique_ptr<stbi_uc, void (*)(void*)> pixels(
      stbi_load(path.string().c_str(), &w, &h, &channels, 3), stbi_image_free);
  if (!pixels) {
    throw CocoFormatError(path.string() + ": cannot decode the image (" + stbi_failure_reason() +
                          "; image id " + std::to_string(image.id) + ")");
  }
  if (w != image.width || h != image.height) {
    throw CocoFormatError(path.string() + ": the image is " + std::to_string(w) + "x" +
                          std::to_string(h) + " but " + options_.annotation_file.string() +
                          " says " + std::to_string(image.width) + "x" +
                          std::to_string(image.height) + " (image id " + std::to_string(image.id) + ")");
  }
  const auto [height, width] = image_size(index);
  const double scale = scale_of(image);
  auto resize = [&](const torch::Tensor& t /*[N, C, h, w] float*/) {
    if (height == h && width == w) return t;
    return F::interpolate(t, F::InterpolateFuncOptions()
                                 .size(std::vector<std::int64_t>{height, width})
                                 .mode(torch::kBilinear)
                                 .align_corners(false));
  };

  DetectionSample s;
  s.image_id = image.id;
  s.scale = scale;
  s.original_height = h;
  s.original_width = w;
  const auto rgb = torch::from_blob(pixels.get(), {h, w, 3}, torch::kUInt8);
  s.image = resize(rgb.permute({2, 0, 1}).unsqueeze(0).to(torch::kFloat).div(255.0)).squeeze(0).contiguous();

  std::vector<torch::Tensor> masks;
  std::vector<float> boxes;
  std::vector<std::int64_t> labels;
  const auto found = annotations_of_.find(image.id);
  if (found != annotations_of_.end()) {
    for (const std::size_t a : found->second) {
      const CocoAnnotation& ann = coco_.annotations[a];
      if (ann.iscrowd) continue;  // crowd regions are only for evaluation (ignored there)
      const auto& b = ann.bbox;
      const float x1 = static_cast<float>(std::clamp(b[0] * scale, 0.0, static_cast<double>(width)));
      const float y1 = static_cast<float>(std::clamp(b[1] * scale, 0.0, static_cast<double>(height)));
      const float x2 = static_cast<float>(std::clamp((b[0] + b[2]) * scale, 0.0, static_cast<double>(width)));
      const float y2 = static_cast<float>(std::clamp((b[1] + b[3]) * scale, 0.0, static_cast<double>(height)));
      if (x2 - x1 < 1 || y2 - y1 < 1) continue;
      auto decoded = rle_decode(segmentation_mask(ann.segmentation, image));
      const auto mask = torch::from_blob(decoded.data(), {1, 1, h, w}, torch::kUInt8).to(torch::kFloat);
      masks.push_back((resize(mask)[0][0] >= 0.5).to(torch::kUInt8));
      for (const float v : {x1, y1, x2, y2}) boxes.push_back(v);
      labels.push_back(label_of_.at(ann.category_id));
    }
  }
  const auto n = static_cast<std::int64_t>(labels.size());
  s.targets.boxes = torch::tensor(boxes, torch::kFloat).view({n, 4});
  s.targets.labels = torch::tensor(labels, torch::kLong);
  s.targets.masks = n > 0 ? torch::stack(masks) : torch::zeros({0, height, width}, torch::kUInt8);
  return s;
}

CocoAnnotations CocoDataset::ground_truth(const std::vector<std::int64_t>& indices) const {
  CocoAnnotations gt;
  gt.categories = coco_.categories;
  for (const auto index : indices) {
    const CocoImage& image = coco_.images[images_.at(static_cast<std::size_t>(index))];
    gt.images.push_back(image);
    const auto found = annotations_of_.find(image.id);
    if (found == annotations_of_.end()) continue;
    for (const std::size_t a : found->second) gt.annotations.push_back(coco_.annotations[a]);
  }
  return gt;
}

}  // namespace mask_rcnn
