// Box overlaps, the regression encoding and NMS on cases worked out by hand.

#include "torch_test.hpp"  // first: see its note

#include <cmath>

#include "box_ops.hpp"

using namespace mask_rcnn;
using mask_rcnn::test::boxes;
using mask_rcnn::test::max_abs_diff;
using mask_rcnn::test::to_vector;
using doctest::Approx;

TEST_CASE("box_iou: overlaps of a few boxes") {
  const auto a = boxes({{0, 0, 2, 2}, {0, 0, 10, 10}});
  const auto b = boxes({{1, 1, 3, 3}, {20, 20, 30, 30}, {0, 0, 10, 10}, {5, 5, 5, 8}});
  const auto iou = box_iou(a, b);
  REQUIRE(iou.sizes() == torch::IntArrayRef{2, 4});
  CHECK(iou[0][0].item<double>() == Approx(1.0 / 7.0));  // 1 shared of 4 + 4 - 1
  CHECK(iou[0][1].item<double>() == 0.0);
  CHECK(iou[0][2].item<double>() == Approx(4.0 / 100.0));
  CHECK(iou[1][2].item<double>() == Approx(1.0));
  CHECK(iou[1][3].item<double>() == 0.0);  // an empty box overlaps nothing
  CHECK(box_area(a)[1].item<double>() == 100.0);
}

TEST_CASE("clip_boxes and nonempty_boxes") {
  const auto clipped = clip_boxes(boxes({{-5, 2, 8, 30}}), 20, 6);
  CHECK(max_abs_diff(clipped, boxes({{0, 2, 6, 20}})) == 0.0);
  const auto keep = nonempty_boxes(boxes({{0, 0, 1, 1}, {0, 0, 0, 5}, {2, 2, 2.5, 3}}), 0.6);
  CHECK(to_vector(keep) == std::vector<std::int64_t>{1, 0, 0});
}

TEST_CASE("BoxCoder: offsets relative to the reference, scaled by the weights") {
  const BoxCoder plain{{1, 1, 1, 1}};
  const auto reference = boxes({{0, 0, 10, 10}, {0, 0, 10, 10}});
  const auto target = boxes({{2, 2, 12, 12}, {0, 0, 20, 10}});
  // Centre moved by 2 px on a 10 px box: 0.2; width doubled: log 2.
  const auto d = plain.encode(target, reference);
  CHECK(max_abs_diff(d, torch::tensor({0.2f, 0.2f, 0.0f, 0.0f, 0.5f, 0.0f, std::log(2.0f), 0.0f}).view({2, 4})) < 1e-6);
  const BoxCoder weighted{{10, 10, 5, 5}};
  CHECK(max_abs_diff(weighted.encode(target, reference)[0], torch::tensor({2.0f, 2.0f, 0.0f, 0.0f})) < 1e-5);
}

TEST_CASE("BoxCoder: decode inverts encode, and clamps huge size changes") {
  torch::manual_seed(3);
  const auto xy = torch::rand({50, 2}) * 100;
  const auto reference = torch::cat({xy, xy + 1 + torch::rand({50, 2}) * 50}, 1);
  const auto xy2 = torch::rand({50, 2}) * 100;
  const auto target = torch::cat({xy2, xy2 + 1 + torch::rand({50, 2}) * 50}, 1);
  for (const BoxCoder coder : {BoxCoder{{1, 1, 1, 1}}, BoxCoder{{10, 10, 5, 5}}}) {
    const auto round_trip = coder.decode(coder.encode(target, reference), reference);
    CHECK(max_abs_diff(round_trip, target) < 1e-3);
  }
  // Several boxes per reference ([N, 4k]) decode independently.
  const BoxCoder coder;
  const auto two = coder.decode(torch::zeros({1, 8}), boxes({{0, 0, 4, 2}}));
  CHECK(max_abs_diff(two, torch::tensor({0.0f, 0.0f, 4.0f, 2.0f, 0.0f, 0.0f, 4.0f, 2.0f}).view({1, 8})) == 0.0);
  // dw = 100 would be e^100 times wider; the clamp stops at 1000/16.
  const auto wide = coder.decode(torch::tensor({0.0f, 0.0f, 100.0f, 0.0f}).view({1, 4}), boxes({{0, 0, 16, 16}}));
  CHECK((wide[0][2] - wide[0][0]).item<double>() == Approx(1000.0).epsilon(1e-4));
}

TEST_CASE("nms: keeps the best box of each overlapping cluster") {
  // A and D overlap by 90/110 = 0.818, A and B by 0.818, D and B by 81/119 = 0.681; C is apart.
  const auto b = boxes({{0, 0, 10, 10}, {1, 0, 11, 10}, {20, 20, 30, 30}, {0, 1, 10, 11}});
  const auto scores = torch::tensor({0.9f, 0.8f, 0.7f, 0.85f});
  CHECK(to_vector(nms(b, scores, 0.5)) == std::vector<std::int64_t>{0, 2});
  // At 0.85 nothing overlaps enough: every box, by decreasing score.
  CHECK(to_vector(nms(b, scores, 0.85)) == std::vector<std::int64_t>{0, 3, 1, 2});
  // D first at 0.7: D suppresses A (0.818) but not B (0.681), and A, suppressed, no longer
  // suppresses B.
  CHECK(to_vector(nms(b, torch::tensor({0.9f, 0.8f, 0.7f, 0.95f}), 0.7)) ==
        std::vector<std::int64_t>{3, 1, 2});
  // Equal scores: input order decides.
  CHECK(to_vector(nms(boxes({{0, 0, 5, 5}, {0, 0, 5, 5}}), torch::tensor({0.5f, 0.5f}), 0.5)) ==
        std::vector<std::int64_t>{0});
  CHECK(nms(torch::zeros({0, 4}), torch::zeros({0}), 0.5).numel() == 0);
}

TEST_CASE("batched_nms: boxes of different groups never suppress each other") {
  const auto b = boxes({{0, 0, 10, 10}, {1, 0, 11, 10}, {0, 0, 10, 10}});
  const auto scores = torch::tensor({0.9f, 0.8f, 0.7f});
  CHECK(to_vector(batched_nms(b, scores, torch::tensor({0L, 1L, 0L}), 0.5)) ==
        std::vector<std::int64_t>{0, 1});
  CHECK(to_vector(batched_nms(b, scores, torch::tensor({0L, 1L, 2L}), 0.5)) ==
        std::vector<std::int64_t>{0, 1, 2});
}
