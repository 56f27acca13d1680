#pragma once
// COCO-style average precision and recall for boxes and masks: the twelve numbers pycocotools'
// COCOeval prints (AP@[.5:.95], AP50, AP75, AP small/medium/large, AR@1/10/100, AR
// small/medium/large), computed the same way so the two agree on the same files.
//
// Note [COCO evaluation]
// Per image and category, detections are sorted by score (ties keep file order) and cut to the
// 100 best. For each area range and each IoU threshold 0.50, 0.55, ..., 0.95, every detection in
// turn is matched to the unmatched ground truth with the highest IoU at or above the threshold;
// ground truths outside the area range and crowd regions are "ignored": a detection matched to
// one neither counts as true nor as false positive, and a crowd region can absorb any number of
// detections (its IoU is intersection over the detection's area). Unmatched detections outside
// the area range are ignored too. Over all images, detections are ranked by score; precision is
// made monotone from the right and read at 101 recall points 0, 0.01, ..., 1 (0 beyond the last
// recall reached). AP is the mean over IoU thresholds, recall points and categories with at least
// one non-ignored ground truth; -1 when there is none. A detection's area is its box's width x
// height when it has a box (pycocotools' loadRes does the same for results with "bbox"), which
// decides whether an unmatched detection falls in the small/medium/large range.
// Deviation from pycocotools: a ground-truth annotation with id 0 counts as matched like any
// other (pycocotools stores the matched id and reads 0 as "unmatched").

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "rle.hpp"

namespace mask_rcnn {

enum class IouType { bbox, segm };

struct EvalGroundTruth {
  std::int64_t id = 0;
  std::int64_t image_id = 0;
  std::int64_t category_id = 0;
  std::array<double, 4> bbox{};  // x, y, width, height
  double area = 0;               // the annotation's "area" (decides small/medium/large)
  bool iscrowd = false;
  Rle mask;
};

struct EvalDetection {
  std::int64_t image_id = 0;
  std::int64_t category_id = 0;
  std::array<double, 4> bbox{};
  double score = 0;
  double area = 0;  // see Note [COCO evaluation]
  Rle mask;
};

struct EvalInput {
  std::vector<std::int64_t> image_ids;     // every image evaluated, with or without objects
  std::vector<std::int64_t> category_ids;  // every category evaluated
  std::vector<EvalGroundTruth> ground_truth;
  std::vector<EvalDetection> detections;  // in file order (breaks score ties)
};

// Indices into CocoStats::values, in pycocotools' order.
enum CocoStat : int {
  ap = 0, ap50, ap75, ap_small, ap_medium, ap_large,
  ar1, ar10, ar100, ar_small, ar_medium, ar_large
};

struct CocoStats {
  std::array<double, 12> values{};  // -1 where no ground truth falls in the setting
  double operator[](CocoStat stat) const { return values[static_cast<std::size_t>(stat)]; }
};

CocoStats evaluate(const EvalInput& input, IouType type);

inline const char* to_string(IouType type) { return type == IouType::bbox ? "bbox" : "segm"; }

// The summary table, one row per evaluated type:
//   type |   AP  | AP50  | AP75  |  APs  |  APm  |  APl
//   bbox | 0.712 | 0.951 | 0.843 | 0.601 | 0.772 | -1.000
std::string format_table(const std::vector<std::pair<IouType, CocoStats>>& rows);

// pycocotools' twelve summary lines for one type, in its exact wording.
std::string format_summary(const CocoStats& stats);

}  // namespace mask_rcnn
