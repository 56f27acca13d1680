#pragma once
// A generated instance-segmentation dataset: circles, squares and triangles of random sizes and
// colours on a shaded, noisy background, partly hiding each other, in images of varying sizes.
// Every image is a function of (seed, index) alone, so any process can produce any sample, a set
// of N images is the first N of an endless sequence, and a run is reproducible anywhere.

#include <cstdint>
#include <string>
#include <vector>

#include "dataset.hpp"

namespace mask_rcnn {

struct ShapesOptions {
  std::int64_t count = 1000;
  std::uint64_t seed = 0;
  std::int64_t min_side = 96;      // image sides are multiples of 16 in [min_side, max_side]
  std::int64_t max_side = 160;
  std::int64_t max_objects = 4;    // 1 .. max_objects per image
  double min_object = 0.15;        // object size relative to the image's shorter side
  double max_object = 0.5;
  double min_visible = 0.5;        // share of an object that later objects may not hide
};

// One generated image: pixels row-major RGB, and the visible part of every object.
struct ShapesImage {
  std::int64_t height = 0;
  std::int64_t width = 0;
  std::vector<std::uint8_t> rgb;                 // [height][width][3]
  std::vector<std::int64_t> labels;              // 1 circle, 2 square, 3 triangle
  std::vector<std::vector<std::uint8_t>> masks;  // each [height][width], 1 where visible
};

ShapesImage generate_shapes_image(const ShapesOptions& options, std::int64_t index);

class ShapesDataset final : public DetectionDataset {
 public:
  // Throws DatasetError for options out of range.
  explicit ShapesDataset(ShapesOptions options);

  std::int64_t size() const override { return options_.count; }
  std::pair<std::int64_t, std::int64_t> image_size(std::int64_t index) const override;
  DetectionSample get(std::int64_t index) const override;
  const std::vector<Category>& categories() const override { return categories_; }
  CocoAnnotations ground_truth(const std::vector<std::int64_t>& indices) const override;

  const ShapesOptions& options() const { return options_; }

 private:
  ShapesOptions options_;
  std::vector<Category> categories_;
};

}  // namespace mask_rcnn
