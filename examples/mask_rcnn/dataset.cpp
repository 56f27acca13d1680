#include "dataset.hpp"

namespace mask_rcnn {

DetectionSample flip_horizontal(DetectionSample sample) {
  const auto w = static_cast<double>(sample.image.size(2));
  sample.image = sample.image.flip({2});
  if (sample.targets.masks.defined()) sample.targets.masks = sample.targets.masks.flip({2});
  if (sample.targets.boxes.defined() && sample.targets.boxes.size(0) > 0) {
    const auto& b = sample.targets.boxes;
    sample.targets.boxes = torch::stack({w - b.select(1, 2), b.select(1, 1), w - b.select(1, 0), b.select(1, 3)}, 1);
  }
  return sample;
}

}  // namespace mask_rcnn
