// Run-length masks in COCO's layout, the compressed string form, and polygon rasterization.

#include <doctest/doctest.h>

#include <cstdint>
#include <stdexcept>
#include <vector>

#include "rle.hpp"
#include "support/messages.hpp"

using namespace mask_rcnn;
using dtrain::test::contains;
using dtrain::test::message_of;

namespace {

using Mask = std::vector<std::uint8_t>;

Mask rows(std::initializer_list<std::initializer_list<int>> values) {
  Mask m;
  for (const auto& row : values)
    for (const int v : row) m.push_back(static_cast<std::uint8_t>(v));
  return m;
}

}  // namespace

TEST_CASE("rle: column-major runs that start with zeros, and back") {
  // Columns top to bottom: (0, 1, 0) then (1, 1, 0) -> 0 | 1 | 0 1 1 | 0 -> runs 1, 1, 1, 2, 1.
  const Mask mask = rows({{0, 1}, {1, 1}, {0, 0}});
  const Rle rle = rle_encode(mask, 3, 2);
  CHECK(rle.counts == std::vector<std::uint32_t>{1, 1, 1, 2, 1});
  CHECK(rle_decode(rle) == mask);
  CHECK(rle_area(rle) == 3);
  // Starting inside: the first run of zeros is empty.
  CHECK(rle_encode(rows({{1, 0}}), 1, 2).counts == std::vector<std::uint32_t>{0, 1, 1});
  CHECK(rle_encode(Mask(4, 0), 2, 2).counts == std::vector<std::uint32_t>{4});
  CHECK_THROWS_AS(rle_encode(Mask(3, 0), 2, 2), std::invalid_argument);
}

TEST_CASE("rle: the tight box, also when a run wraps into the next column") {
  CHECK(rle_bbox(rle_encode(rows({{0, 0, 0}, {0, 1, 1}, {0, 1, 0}}), 3, 3)) ==
        std::array<double, 4>{1, 1, 2, 2});
  // Bottom of column 0 and top of column 1 are one run: rows 0 and 2 are both touched.
  CHECK(rle_bbox(rle_encode(rows({{0, 1}, {0, 0}, {1, 0}}), 3, 2)) ==
        std::array<double, 4>{0, 0, 2, 3});
  CHECK(rle_bbox(rle_encode(Mask(6, 0), 2, 3)) == std::array<double, 4>{0, 0, 0, 0});
}

TEST_CASE("rle: compressed strings, worked out by hand") {
  // 1,1,1 as they are; then 2-1 = 1 and 1-1 = 0 (differences of runs two apart).
  CHECK(rle_to_string(Rle{3, 2, {1, 1, 1, 2, 1}}) == "11110");
  // 100 = 4 + 3*32: '0'+(4|0x20) = 'T', then '3'. 5 -> '5'. 97 = 1 + 3*32 -> 'Q', '3'.
  // 2 - 5 = -3: one group 29 (sign bit 0x10 set, nothing follows) -> '0'+29 = 'M'.
  const Rle rle{12, 17, {100, 5, 97, 2}};
  CHECK(rle_to_string(rle) == "T35Q3M");
  CHECK(rle_from_string("T35Q3M", 12, 17) == rle);
  CHECK(rle_from_string("11110", 3, 2).counts == std::vector<std::uint32_t>{1, 1, 1, 2, 1});

  CHECK(contains(message_of<std::invalid_argument>([] { rle_from_string("11~", 3, 2); }),
                 "not in COCO's alphabet"));
  CHECK(contains(message_of<std::invalid_argument>([] { rle_from_string("T", 12, 17); }),
                 "middle of a number"));
  CHECK(contains(message_of<std::invalid_argument>([] { rle_from_string("11110", 3, 3); }),
                 "cover 6 pixels but the mask has 3 x 3"));
  CHECK_THROWS_AS(rle_from_counts({1, 2}, 2, 2), std::invalid_argument);
}

TEST_CASE("rle: union of masks") {
  const Rle a = rle_encode(rows({{1, 0}, {0, 0}}), 2, 2);
  const Rle b = rle_encode(rows({{0, 0}, {0, 1}}), 2, 2);
  const Rle c = rle_encode(rows({{1, 0}, {1, 0}}), 2, 2);
  const std::vector<Rle> all = {a, b, c};
  CHECK(rle_decode(rle_union(all)) == rows({{1, 0}, {1, 1}}));
  const std::vector<Rle> mismatched = {a, Rle{3, 1, {3}}};
  CHECK_THROWS_AS(rle_union(mismatched), std::invalid_argument);
}

TEST_CASE("rle: polygons are rasterized pixel for pixel like the COCO API") {
  // Expected masks and strings from pycocotools 2.0 (mask.frPyObjects, decode, counts).
  const std::vector<double> square = {1, 1, 4, 1, 4, 4, 1, 4};
  const Rle s = rle_from_polygon(square, 6, 6);
  CHECK(rle_decode(s) == rows({{0, 0, 0, 0, 0, 0},
                               {0, 1, 1, 1, 0, 0},
                               {0, 1, 1, 1, 0, 0},
                               {0, 1, 1, 1, 0, 0},
                               {0, 0, 0, 0, 0, 0},
                               {0, 0, 0, 0, 0, 0}}));
  CHECK(rle_to_string(s) == "733000;");

  const std::vector<double> triangle = {0.5, 0.5, 5.5, 0.5, 3, 4.7};
  const Rle t = rle_from_polygon(triangle, 6, 7);
  CHECK(rle_decode(t) == rows({{0, 0, 0, 0, 0, 0, 0},
                               {0, 1, 1, 1, 1, 0, 0},
                               {0, 0, 1, 1, 0, 0, 0},
                               {0, 0, 1, 1, 0, 0, 0},
                               {0, 0, 0, 0, 0, 0, 0},
                               {0, 0, 0, 0, 0, 0, 0}}));
  CHECK(rle_to_string(t) == "7152N00N=");

  // Partly outside the image, fractional vertices: clipped the same way.
  const std::vector<double> outside = {2.3, -1.2, 7.9, 3.1, 1.1, 6.6, -0.4, 2.2};
  const Rle o = rle_from_polygon(outside, 6, 8);
  CHECK(rle_decode(o) == rows({{0, 1, 1, 1, 0, 0, 0, 0},
                               {1, 1, 1, 1, 1, 1, 0, 0},
                               {1, 1, 1, 1, 1, 1, 1, 0},
                               {1, 1, 1, 1, 1, 1, 1, 0},
                               {0, 1, 1, 1, 1, 0, 0, 0},
                               {0, 1, 1, 0, 0, 0, 0, 0}}));
  CHECK(rle_to_string(o) == "132>0C0O2O4");

  const std::vector<double> two_points = {0, 0, 3, 3};
  CHECK(contains(message_of<std::invalid_argument>([&] { rle_from_polygon(two_points, 4, 4); }),
                 "at least 3 points"));
}

TEST_CASE("rle: IoU of masks and boxes, crowd regions by the detection's area") {
  const Rle gt = rle_encode(rows({{1, 1, 0, 0}, {1, 1, 0, 0}}), 2, 4);   // 4 pixels
  const Rle det = rle_encode(rows({{0, 1, 1, 0}, {0, 1, 1, 0}}), 2, 4);  // 4, 2 shared
  CHECK(rle_iou(det, gt, false) == doctest::Approx(2.0 / 6.0));
  CHECK(rle_iou(det, gt, true) == doctest::Approx(2.0 / 4.0));
  const Rle apart = rle_encode(rows({{0, 0, 0, 1}, {0, 0, 0, 1}}), 2, 4);
  CHECK(rle_iou(apart, gt, false) == 0.0);
  CHECK_THROWS_AS(rle_iou(Rle{4, 2, {8}}, gt, false), std::invalid_argument);

  CHECK(box_iou_xywh({0, 0, 10, 10}, {5, 0, 10, 10}, false) == doctest::Approx(50.0 / 150.0));
  CHECK(box_iou_xywh({0, 0, 10, 10}, {5, 0, 10, 10}, true) == doctest::Approx(0.5));
  CHECK(box_iou_xywh({0, 0, 10, 10}, {10, 0, 10, 10}, false) == 0.0);  // touching
}
