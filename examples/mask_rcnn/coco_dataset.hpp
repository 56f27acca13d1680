#pragma once
// A COCO-format dataset: an instances JSON file and a folder of images (COCO 2017 itself, or a
// user's own data in its format). Images are read and resized when a sample is asked for, so a
// dataset of any size starts at once.

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "dataset.hpp"

namespace mask_rcnn {

struct CocoDatasetOptions {
  std::filesystem::path annotation_file;  // e.g. annotations/instances_train2017.json
  std::filesystem::path image_dir;        // e.g. train2017/
  std::int64_t min_size = 800;   // the shorter side is resized to this ...
  std::int64_t max_size = 1333;  // ... unless the longer side would exceed this
  bool skip_empty = false;       // leave out images without objects (for training)
};

class CocoDataset final : public DetectionDataset {
 public:
  // Reads the annotations and checks that every image file exists; throws CocoFormatError
  // naming the file and the annotation id when something is wrong.
  explicit CocoDataset(CocoDatasetOptions options);

  std::int64_t size() const override { return static_cast<std::int64_t>(images_.size()); }
  std::pair<std::int64_t, std::int64_t> image_size(std::int64_t index) const override;
  // Throws CocoFormatError naming the file if the image does not decode or its size differs from
  // the one in the annotations.
  DetectionSample get(std::int64_t index) const override;
  const std::vector<Category>& categories() const override { return categories_; }
  CocoAnnotations ground_truth(const std::vector<std::int64_t>& indices) const override;

 private:
  double scale_of(const CocoImage& image) const;

  CocoDatasetOptions options_;
  CocoAnnotations coco_;
  std::vector<std::size_t> images_;                      // indices into coco_.images
  std::map<std::int64_t, std::vector<std::size_t>> annotations_of_;  // image id -> annotations
  std::map<std::int64_t, std::int64_t> label_of_;        // category id -> 1 .. K
  std::vector<Category> categories_;
};

}  // namespace mask_rcnn
