#pragma once
// COCO's JSON files: instance annotations (the dataset, and the ground_truth.json the trainer
// writes) and results (detections.json), read with the checks a user's own data needs and written
// so that pycocotools reads them unchanged.
//
// Every problem in a file is a CocoFormatError whose message names the file and, for an
// annotation, its id and what is wrong with it, e.g.
//   instances_val.json: annotation id 17: polygon 0 has 2 points; a polygon needs at least 3

#include <array>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "coco_eval.hpp"
#include "rle.hpp"

namespace mask_rcnn {

class CocoFormatError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct CocoImage {
  std::int64_t id = 0;
  std::string file_name;
  std::int64_t width = 0;
  std::int64_t height = 0;
};

struct CocoCategory {
  std::int64_t id = 0;
  std::string name;
};

// A segmentation as the file stores it: polygons, or a run-length encoding with its counts as a
// list (uncompressed, as COCO stores crowd regions) or as a compressed string.
struct Segmentation {
  std::vector<std::vector<double>> polygons;  // each [x0, y0, x1, y1, ...]
  std::optional<Rle> rle;
  bool compressed = false;  // how `rle` was (and will be) written
};

struct CocoAnnotation {
  std::int64_t id = 0;
  std::int64_t image_id = 0;
  std::int64_t category_id = 0;
  std::array<double, 4> bbox{};  // x, y, width, height
  double area = 0;
  bool iscrowd = false;
  Segmentation segmentation;
};

struct CocoAnnotations {
  std::vector<CocoImage> images;
  std::vector<CocoCategory> categories;
  std::vector<CocoAnnotation> annotations;

  // The image with this id; throws std::out_of_range if there is none.
  const CocoImage& image(std::int64_t id) const;
};

// Reads and checks an instances file: it must be JSON with "images", "annotations" and
// "categories"; ids unique; every annotation's image and category listed; bbox four numbers;
// polygons of at least 3 points; RLE sizes equal to the image's. A missing "area" is the mask's.
CocoAnnotations read_coco_annotations(const std::filesystem::path& file);

// Throws CocoFormatError naming the first image of `annotations` that is not a file under
// `image_dir`, its id, and the annotations that refer to it.
void check_image_files(const CocoAnnotations& annotations, const std::filesystem::path& image_dir,
                       const std::filesystem::path& annotation_file);

void write_coco_annotations(const CocoAnnotations& annotations, const std::filesystem::path& file);

// The annotation's mask at its image's size (polygons rasterized and merged as the COCO API does).
Rle segmentation_mask(const Segmentation& segmentation, const CocoImage& image);

// One detection as the trainer writes it: a box, a score and a mask at the original image size.
struct CocoDetection {
  std::int64_t image_id = 0;
  std::int64_t category_id = 0;
  std::array<double, 4> bbox{};  // x, y, width, height
  double score = 0;
  Rle mask;
};

// COCO results JSON: a list of {image_id, category_id, bbox, score, segmentation (compressed RLE)}.
std::string detections_to_json(const std::vector<CocoDetection>& detections);
std::vector<CocoDetection> detections_from_json(const std::string& text);
void write_coco_detections(const std::vector<CocoDetection>& detections,
                           const std::filesystem::path& file);

// Reads a results file against its ground truth the way pycocotools' loadRes does: with a box, a
// detection's area is the box's; without "segmentation" its mask is its box; without "bbox" its
// box and area are its mask's. Throws CocoFormatError naming the file and the result's index for a
// result on an image the ground truth does not list, or a mask of the wrong size.
std::vector<EvalDetection> read_coco_results(const std::filesystem::path& file,
                                             const CocoAnnotations& ground_truth);

// Everything evaluate() needs from a ground truth and results.
EvalInput make_eval_input(const CocoAnnotations& ground_truth,
                          std::vector<EvalDetection> detections);

// Reads both files and evaluates boxes and masks.
std::vector<std::pair<IouType, CocoStats>> evaluate_files(
    const std::filesystem::path& ground_truth_file, const std::filesystem::path& results_file);

// {"bbox": [12 numbers], "segm": [12 numbers]} in pycocotools' order (see CocoStat).
void write_stats_json(const std::vector<std::pair<IouType, CocoStats>>& stats,
                      const std::filesystem::path& file);

}  // namespace mask_rcnn
