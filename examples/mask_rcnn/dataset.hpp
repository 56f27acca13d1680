#pragma once
// The interface between a source of annotated images (generated shapes, a COCO-format folder) and
// the trainer.

#include <torch/torch.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "coco_format.hpp"
#include "detection.hpp"

namespace mask_rcnn {

// A dataset that cannot be used: a file missing or malformed, an option out of range. The
// message names the file (and the annotation) and what to do.
class DatasetError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct Category {
  std::int64_t id = 0;  // the dataset's category id; the model's label for it is its index + 1
  std::string name;
};

struct DetectionSample {
  std::int64_t image_id = 0;
  torch::Tensor image;  // [3, H, W] float32 RGB in [0, 1], at the size the network sees
  InstanceTargets targets;
  double scale = 1.0;  // network pixels per original pixel
  std::int64_t original_height = 0;
  std::int64_t original_width = 0;
};

class DetectionDataset {
 public:
  virtual ~DetectionDataset() = default;

  virtual std::int64_t size() const = 0;
  // (height, width) the network will see for sample `index`, known without loading the image:
  // what the bucket sampler sorts by.
  virtual std::pair<std::int64_t, std::int64_t> image_size(std::int64_t index) const = 0;
  virtual DetectionSample get(std::int64_t index) const = 0;
  virtual const std::vector<Category>& categories() const = 0;
  // The annotations of these samples, as a COCO instances file holds them (original sizes, every
  // object including crowd regions): what the evaluation scores against.
  virtual CocoAnnotations ground_truth(const std::vector<std::int64_t>& indices) const = 0;
};

// The sample mirrored left to right (image, boxes and masks).
DetectionSample flip_horizontal(DetectionSample sample);

}  // namespace mask_rcnn
