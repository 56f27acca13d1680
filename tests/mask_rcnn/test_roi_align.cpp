// RoIAlign on feature maps whose bilinear samples can be worked out by hand, its gradient, and
// the choice of pyramid level.

#include "torch_test.hpp"  // first: see its note

#include "roi_align.hpp"

using namespace mask_rcnn;
using mask_rcnn::test::max_abs_diff;
using doctest::Approx;

namespace {

// [1, 1, 4, 4] with value x + 10 y at pixel (x, y): bilinear sampling of a linear function is
// exact, so a bin's average is the value at the bin's centre (in pixel-index coordinates, where
// pixel (x, y)'s centre is (x, y) and image coordinate c is index c - 0.5).
torch::Tensor ramp() {
  return (torch::arange(4).view({1, 4}) + 10 * torch::arange(4).view({4, 1})).to(torch::kFloat).view({1, 1, 4, 4});
}

torch::Tensor roi(std::vector<float> values) { return torch::tensor(values).view({-1, 5}); }

}  // namespace

TEST_CASE("roi_align: bins of a linear map read the value at their centre") {
  // The whole 4x4 map in 2x2 bins: centres at image (1, 1), (3, 1), (1, 3), (3, 3), i.e. index
  // (0.5, 0.5) ... -> 0.5 + 5, 2.5 + 5, 0.5 + 25, 2.5 + 25.
  const auto out = roi_align(ramp(), roi({0, 0, 0, 4, 4}), 2, 1.0, 2);
  REQUIRE(out.sizes() == torch::IntArrayRef{1, 1, 2, 2});
  CHECK(max_abs_diff(out[0][0], torch::tensor({5.5f, 7.5f, 25.5f, 27.5f}).view({2, 2})) < 1e-5);
  // The same box in image pixels of a map at stride 2 (spatial scale 1/2).
  CHECK(max_abs_diff(roi_align(ramp(), roi({0, 0, 0, 8, 8}), 2, 0.5, 2), out) < 1e-5);
  // A box over pixel (1, 2) alone, one bin: its value, 1 + 20.
  CHECK(roi_align(ramp(), roi({0, 1, 2, 2, 3}), 1, 1.0, 3).item<double>() == Approx(21.0));
}

TEST_CASE("roi_align: a sample between four pixels averages them; outside the map it takes the border") {
  auto one = torch::zeros({1, 1, 4, 4});
  one[0][0][1][1] = 1.0;
  // One sample at image (2, 2) = index (1.5, 1.5): a quarter of each of (1,1), (1,2), (2,1), (2,2).
  CHECK(roi_align(one, roi({0, 1, 1, 3, 3}), 1, 1.0, 1).item<double>() == Approx(0.25));
  // At image (1.5, 1.5) = pixel (1, 1)'s centre: the pixel itself.
  CHECK(roi_align(one, roi({0, 1, 1, 2, 2}), 1, 1.0, 1).item<double>() == Approx(1.0));
  // Image (-1, -1) is index (-1.5, -1.5), beyond the map: the value at the corner pixel (0, 0).
  CHECK(roi_align(ramp(), roi({0, -2, -2, 0, 0}), 1, 1.0, 1).item<double>() == Approx(0.0));
  CHECK(roi_align(ramp(), roi({0, 4, 4, 6, 6}), 1, 1.0, 1).item<double>() == Approx(33.0));
}

TEST_CASE("roi_align: boxes of several images, in any order, come back in their order") {
  const auto features = torch::cat({ramp(), ramp() * 2, ramp() * 3});
  const auto rois = roi({2, 0, 0, 4, 4, 0, 0, 0, 4, 4, 2, 1, 2, 2, 3, 1, 0, 0, 4, 4});
  const auto out = roi_align(features, rois, 1, 1.0, 2);
  REQUIRE(out.size(0) == 4);
  // Whole map, one bin: the centre value 1.5 + 15 = 16.5, times the image's factor.
  CHECK(out[0].item<double>() == Approx(3 * 16.5));
  CHECK(out[1].item<double>() == Approx(16.5));
  CHECK(out[2].item<double>() == Approx(3 * 21.0));
  CHECK(out[3].item<double>() == Approx(2 * 16.5));
  CHECK(roi_align(features, torch::zeros({0, 5}), 7, 1.0, 2).sizes() == torch::IntArrayRef{0, 1, 7, 7});
}

TEST_CASE("roi_align: autograd gives the bilinear weights as the gradient") {
  auto features = torch::zeros({1, 1, 4, 4}, torch::requires_grad());
  roi_align(features, roi({0, 1, 1, 3, 3}), 1, 1.0, 1).sum().backward();
  auto expected = torch::zeros({1, 1, 4, 4});
  expected[0][0].narrow(0, 1, 2).narrow(1, 1, 2).fill_(0.25);
  CHECK(max_abs_diff(features.grad(), expected) < 1e-6);

  // Two bins of 2x2 samples over the whole width: every pixel of rows 1-2 weighs 1/8 per bin.
  features.mutable_grad().zero_();
  roi_align(features, roi({0, 0, 1, 4, 3}), 1, 1.0, 2).sum().backward();
  expected.zero_();
  expected[0][0].narrow(0, 1, 2).fill_(0.125);
  CHECK(max_abs_diff(features.grad(), expected) < 1e-6);
}

TEST_CASE("MultiScaleRoIAlign: each box pools from the level its size calls for") {
  const MultiScaleRoIAlign pooler{2, 1, 1, 224.0, 4};
  const auto b = mask_rcnn::test::boxes(
      {{0, 0, 224, 224}, {0, 0, 112, 112}, {0, 0, 56, 56}, {0, 0, 20, 20}, {0, 0, 1000, 1000}, {0, 0, 447, 447}});
  CHECK(mask_rcnn::test::to_vector(pooler.levels(b, 4)) == std::vector<std::int64_t>{4, 3, 2, 2, 5, 4});

  // Four levels, each filled with its level number: a box reads the level it was sent to.
  std::vector<torch::Tensor> features;
  for (int l = 0; l < 4; ++l) features.push_back(torch::full({1, 1, 64 >> l, 64 >> l}, static_cast<float>(l + 2)));
  const auto out = pooler(features, {mask_rcnn::test::boxes({{0, 0, 200, 200}, {0, 0, 30, 30}, {0, 0, 120, 100}})});
  CHECK(max_abs_diff(out.flatten(), torch::tensor({3.0f, 2.0f, 2.0f})) == 0.0);  // 120x100: sqrt 109.5 -> level 2
}
