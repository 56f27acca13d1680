#pragma once
// Binary masks as COCO stores them: run-length encoded in column-major order, in the compressed
// string form of COCO's JSON files, and rasterized from polygons exactly as the COCO API does.
// No libtorch here: the evaluation and the annotation files need none.
//
// Note [COCO mask layout]
// A mask of height h and width w is read column by column (x outer, y inner: pixel (x, y) is
// element x * h + y). `counts` alternates runs of 0s and 1s and always starts with a run of 0s,
// which may be empty. Scoring tools (pycocotools, the COCO server) read masks in this layout, so
// ground_truth.json and detections.json store them this way, and the evaluation computes areas
// and overlaps on the runs directly.

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace mask_rcnn {

struct Rle {
  std::int64_t height = 0;
  std::int64_t width = 0;
  std::vector<std::uint32_t> counts;  // see Note [COCO mask layout]

  friend bool operator==(const Rle&, const Rle&) = default;
};

// `mask` is row-major [height][width], nonzero = inside.
Rle rle_encode(std::span<const std::uint8_t> mask, std::int64_t height, std::int64_t width);

// Row-major [height][width] of 0/1.
std::vector<std::uint8_t> rle_decode(const Rle& rle);

// Pixels inside.
std::uint64_t rle_area(const Rle& rle);

// The tight box of the pixels inside as COCO writes it, [x, y, width, height] in whole pixels;
// all zeros for an empty mask.
std::array<double, 4> rle_bbox(const Rle& rle);

// Pixels inside any of the masks, which must all have the same size (an empty list gives an
// empty 0x0 mask).
Rle rle_union(std::span<const Rle> masks);

// The compressed "counts" string of COCO's JSON (6 bits per character, differences of runs two
// apart), and back. rle_from_string throws std::invalid_argument for a character outside the
// alphabet or runs that do not add up to height * width.
std::string rle_to_string(const Rle& rle);
Rle rle_from_string(std::string_view counts, std::int64_t height, std::int64_t width);

// Checks that uncompressed counts add up to height * width; throws std::invalid_argument if not.
Rle rle_from_counts(std::vector<std::uint32_t> counts, std::int64_t height, std::int64_t width);

// One polygon [x0, y0, x1, y1, ...] (at least three points) rasterized as the COCO API does: the
// outline is traced on a 5x finer grid and a pixel is inside when its centre lies inside the
// traced outline. Matching that rasterization bit for bit is what lets the evaluation agree with
// pycocotools on polygon annotations.
Rle rle_from_polygon(std::span<const double> xy, std::int64_t height, std::int64_t width);

// Intersection over union of two masks of the same size. With `crowd`, the union is the area of
// `detection` alone (a detection inside a crowd region counts as covered), as COCO scores crowds.
// 0 when they do not overlap.
double rle_iou(const Rle& detection, const Rle& ground_truth, bool crowd);

// The same for boxes [x, y, width, height].
double box_iou_xywh(const std::array<double, 4>& detection,
                    const std::array<double, 4>& ground_truth, bool crowd);

}  // namespace mask_rcnn
