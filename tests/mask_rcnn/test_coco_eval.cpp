// COCO average precision and recall on cases small enough to work out by hand. (The agreement
// with pycocotools on larger files is pycocotools_agreement.py.)

#include <doctest/doctest.h>

#include <array>
#include <string>
#include <vector>

#include "coco_eval.hpp"
#include "support/messages.hpp"

using namespace mask_rcnn;
using doctest::Approx;

namespace {

// 200 x 200 images; objects are axis-aligned rectangles (box and mask agree).
constexpr std::int64_t side = 200;

Rle rectangle(double x, double y, double w, double h) {
  std::vector<std::uint8_t> m(side * side, 0);
  for (auto r = static_cast<std::int64_t>(y); r < static_cast<std::int64_t>(y + h); ++r)
    for (auto c = static_cast<std::int64_t>(x); c < static_cast<std::int64_t>(x + w); ++c)
      m[static_cast<std::size_t>(r * side + c)] = 1;
  return rle_encode(m, side, side);
}

struct Case {
  EvalInput input;
  std::int64_t next_id = 1;

  Case(std::vector<std::int64_t> images = {1}, std::vector<std::int64_t> categories = {1}) {
    input.image_ids = std::move(images);
    input.category_ids = std::move(categories);
  }
  void gt(double x, double y, double w, double h, std::int64_t image = 1, std::int64_t category = 1,
          bool crowd = false) {
    input.ground_truth.push_back(
        {next_id++, image, category, {x, y, w, h}, w * h, crowd, rectangle(x, y, w, h)});
  }
  void det(double x, double y, double w, double h, double score, std::int64_t image = 1,
           std::int64_t category = 1) {
    input.detections.push_back({image, category, {x, y, w, h}, score, w * h, rectangle(x, y, w, h)});
  }
  CocoStats bbox() const { return evaluate(input, IouType::bbox); }
  CocoStats segm() const { return evaluate(input, IouType::segm); }
};

}  // namespace

// Precision is tp / (tp + fp + 2^-52), as in pycocotools: "1" is 1 - 2e-16.
TEST_CASE("coco eval: one object found exactly scores 1 everywhere it is counted") {
  Case c;
  c.gt(10, 10, 50, 50);  // area 2500: medium
  c.det(10, 10, 50, 50, 0.9);
  for (const CocoStats& s : {c.bbox(), c.segm()}) {
    CHECK(s[ap] == Approx(1.0));
    CHECK(s[ap50] == Approx(1.0));
    CHECK(s[ap75] == Approx(1.0));
    CHECK(s[ap_medium] == Approx(1.0));
    CHECK(s[ap_small] == -1.0);  // no ground truth of that size
    CHECK(s[ap_large] == -1.0);
    CHECK(s[ar1] == 1.0);
    CHECK(s[ar100] == 1.0);
  }
}

TEST_CASE("coco eval: a better-scored false positive halves the precision") {
  // Ranked: FP (0.9), TP (0.8). Precision 0, 1/2 -> made monotone: 1/2, 1/2; recall reaches 1.
  Case c;
  c.gt(10, 10, 50, 50);
  c.det(120, 120, 50, 50, 0.9);
  c.det(10, 10, 50, 50, 0.8);
  CHECK(c.bbox()[ap] == Approx(0.5));
  CHECK(c.segm()[ap] == Approx(0.5));
  CHECK(c.bbox()[ar1] == 0.0);  // the best detection alone finds nothing
  CHECK(c.bbox()[ar10] == 1.0);
}

TEST_CASE("coco eval: IoU 0.62 counts at thresholds 0.50, 0.55 and 0.60 only") {
  Case c;
  c.gt(0, 0, 100, 100);
  c.det(0, 0, 100, 62, 0.5);
  const CocoStats s = c.bbox();
  CHECK(s[ap50] == Approx(1.0));
  CHECK(s[ap75] == 0.0);
  CHECK(s[ap] == Approx(0.3));
  CHECK(s[ar100] == Approx(0.3));
  CHECK(c.segm()[ap] == Approx(0.3));  // the masks overlap the same 6200 of 10000 pixels
}

TEST_CASE("coco eval: half the objects found, at the top of the ranking") {
  // Two objects, one found (score 0.9) and nothing else: precision 1 up to recall 1/2, then 0.
  // 51 of the 101 recall points (0 .. 0.50) read precision 1.
  Case c;
  c.gt(10, 10, 50, 50);
  c.gt(100, 100, 50, 50);
  c.det(10, 10, 50, 50, 0.9);
  CHECK(c.bbox()[ap] == Approx(51.0 / 101.0));
  CHECK(c.bbox()[ar100] == Approx(0.5));
}

TEST_CASE("coco eval: crowd regions absorb detections without counting them") {
  Case c;
  c.gt(0, 0, 100, 100, 1, 1, /*crowd=*/true);
  c.gt(150, 150, 40, 40);
  // Three detections inside the crowd region (IoU = intersection / detection area = 1), scored
  // above the one true positive: ignored, so precision stays 1.
  c.det(10, 10, 20, 20, 0.99);
  c.det(40, 40, 20, 20, 0.98);
  c.det(60, 10, 30, 30, 0.97);
  c.det(150, 150, 40, 40, 0.5);
  CHECK(c.bbox()[ap] == Approx(1.0));
  CHECK(c.segm()[ap] == Approx(1.0));
}

TEST_CASE("coco eval: object sizes decide small, medium and large; matched ground truth is found once") {
  Case c;
  c.gt(0, 0, 10, 10);      // 100: small
  c.gt(50, 50, 100, 100);  // 10000: large
  c.det(0, 0, 10, 10, 0.9);
  c.det(0, 0, 10, 10, 0.8);  // a duplicate: a false positive, ranked after the match
  c.det(50, 50, 100, 100, 0.7);
  const CocoStats s = c.bbox();
  CHECK(s[ap_small] == Approx(1.0));
  CHECK(s[ap_medium] == -1.0);
  // Large objects only: the small detections are unmatched and outside the range, so ignored.
  CHECK(s[ap_large] == Approx(1.0));
  // All sizes: TP, FP, TP -> precision 1, 1/2, 2/3 -> monotone 1, 2/3, 2/3. Recall 1/2 at the
  // first, 1 at the third: points 0 .. 0.50 read 1, points 0.51 .. 1 read 2/3.
  CHECK(s[ap] == Approx((51.0 + 50.0 * 2.0 / 3.0) / 101.0));
}

TEST_CASE("coco eval: categories are scored apart and averaged; no ground truth means not counted") {
  Case c({1, 2}, {1, 2, 3});
  c.gt(10, 10, 50, 50, 1, 1);
  c.gt(10, 10, 50, 50, 2, 2);
  c.det(10, 10, 50, 50, 0.9, 1, 1);   // category 1: found
  c.det(10, 10, 50, 50, 0.9, 2, 1);   // wrong category on image 2: a category-1 false positive
  c.det(10, 10, 50, 50, 0.9, 2, 3);   // category 3 has no ground truth: not counted at all
  // Category 1: TP and FP at the same score, TP first (file order) -> AP 1. Category 2: nothing
  // found -> 0. Mean over categories 1 and 2.
  CHECK(c.bbox()[ap] == Approx(0.5));
}

TEST_CASE("coco eval: only the 100 best detections of an image count") {
  Case c;
  c.gt(10, 10, 50, 50);
  for (int i = 0; i < 100; ++i) c.det(150, 150, 10, 10, 0.9);  // false positives
  c.det(10, 10, 50, 50, 0.5);                                 // 101st: cut
  CHECK(c.bbox()[ap] == 0.0);
  CHECK(c.bbox()[ar100] == 0.0);
}

TEST_CASE("coco eval: nothing to score gives -1, as pycocotools does") {
  Case c;
  c.det(10, 10, 50, 50, 0.9);
  CHECK(c.bbox()[ap] == -1.0);
  CHECK(c.bbox()[ar100] == -1.0);
}

TEST_CASE("coco eval: the table and pycocotools' summary lines") {
  Case c;
  c.gt(10, 10, 50, 50);
  c.det(10, 10, 50, 50, 0.9);
  const auto table = format_table({{IouType::bbox, c.bbox()}, {IouType::segm, c.segm()}});
  CHECK(table ==
        "type |   AP   |  AP50  |  AP75  |  APs   |  APm   |  APl\n"
        "bbox |  1.000 |  1.000 |  1.000 | -1.000 |  1.000 | -1.000\n"
        "segm |  1.000 |  1.000 |  1.000 | -1.000 |  1.000 | -1.000\n");
  const auto summary = format_summary(c.bbox());
  CHECK(dtrain::test::contains(
      summary, " Average Precision  (AP) @[ IoU=0.50:0.95 | area=   all | maxDets=100 ] = 1.000\n"));
  CHECK(dtrain::test::contains(
      summary, " Average Recall     (AR) @[ IoU=0.50:0.95 | area= large | maxDets=100 ] = -1.000\n"));
}
