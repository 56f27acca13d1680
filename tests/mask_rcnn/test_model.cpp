// The model's parts put together: shapes through the backbone, anchors, batching, mask pasting,
// the losses (and that they add up over images, which distributed training relies on), inference,
// and checkpoints.

#include "torch_test.hpp"  // first: see its note

#include <cmath>

#include "anchors.hpp"
#include "detection.hpp"
#include "model.hpp"
#include "shapes.hpp"
#include "support/messages.hpp"
#include "support/temp_dir.hpp"

using namespace mask_rcnn;
using mask_rcnn::test::max_abs_diff;
using mask_rcnn::test::to_vector;
using doctest::Approx;

namespace {

std::vector<InstanceTargets> targets_of(const std::vector<DetectionSample>& samples) {
  std::vector<InstanceTargets> out;
  for (std::size_t i = 0; i < samples.size(); ++i) {
    auto t = samples[i].targets;
    t.sampling_seed = 1000 + i;
    out.push_back(t);
  }
  return out;
}

ImageBatch batch_of(const std::vector<DetectionSample>& samples) {
  std::vector<torch::Tensor> images;
  for (const auto& s : samples) images.push_back(s.image);
  return make_batch(images);
}

}  // namespace

TEST_CASE("backbone: five pyramid levels at strides 4 to 64 (sizes rounded up)") {
  torch::manual_seed(0);
  ResNetFpn backbone(BackboneConfig{});
  const auto p = backbone->forward(torch::rand({2, 3, 64, 96}));
  REQUIRE(p.size() == 5);
  for (std::size_t l = 0; l < 5; ++l) {
    CAPTURE(l);
    CHECK(p[l].size(0) == 2);
    CHECK(p[l].size(1) == 64);
    const auto stride = std::int64_t{1} << (l + 2);
    CHECK(p[l].size(2) == (64 + stride - 1) / stride);
    CHECK(p[l].size(3) == (96 + stride - 1) / stride);  // P6 of a 3-wide P5 is 2 wide
  }
}

TEST_CASE("anchors: one box per ratio, centred on every cell") {
  const AnchorGenerator gen{{32.0, 64.0}, {0.5, 1.0, 2.0}, {4, 8}};
  const auto cell = gen.cell_anchors(0);
  // Ratio 1: a 32x32 square; ratio 2 (height / width): 32/sqrt 2 wide, 32 sqrt 2 high.
  CHECK(max_abs_diff(cell[1], torch::tensor({-16.0f, -16.0f, 16.0f, 16.0f})) < 1e-5);
  const float w = 32.0f / std::sqrt(2.0f), h = 32.0f * std::sqrt(2.0f);
  CHECK(max_abs_diff(cell[2], torch::tensor({-w / 2, -h / 2, w / 2, h / 2})) < 1e-4);
  const auto all = gen({{2, 3}, {1, 2}}, torch::TensorOptions());
  REQUIRE(all.size() == 2);
  CHECK(all[0].size(0) == 2 * 3 * 3);
  // (y, x, ratio) order: the 4th cell (y 1, x 0) is centred at (2, 6); its square anchor:
  CHECK(max_abs_diff(all[0][3 * 3 + 1], torch::tensor({2.0f - 16, 6.0f - 16, 2.0f + 16, 6.0f + 16})) < 1e-5);
  CHECK(max_abs_diff(all[1][3 + 1], torch::tensor({12.0f - 32, 4.0f - 32, 12.0f + 32, 4.0f + 32})) < 1e-5);
}

TEST_CASE("make_batch: normalized, padded to a multiple of 32 at the bottom and right") {
  const auto batch = make_batch({torch::full({3, 20, 30}, 0.5f), torch::full({3, 40, 10}, 0.5f)});
  CHECK(batch.images.sizes() == torch::IntArrayRef{2, 3, 64, 32});
  CHECK(batch.sizes == std::vector<std::pair<std::int64_t, std::int64_t>>{{20, 30}, {40, 10}});
  CHECK(batch.images[0][0][19][29].item<double>() == Approx((0.5 - 0.485) / 0.229).epsilon(1e-5));
  CHECK(batch.images[0][0][20][0].item<double>() == 0.0);
  CHECK(batch.images[1][2][0][10].item<double>() == 0.0);
}

TEST_CASE("paste_masks: a box's mask lands on the pixels whose centres are inside the box") {
  const auto full = torch::ones({1, 28, 28});
  const auto pasted = paste_masks(full, mask_rcnn::test::boxes({{2, 3, 6, 8}}), 10, 10);
  auto expected = torch::zeros({10, 10}, torch::kBool);
  expected.narrow(0, 3, 5).narrow(1, 2, 4).fill_(true);
  CHECK(pasted[0].equal(expected));
  // The left half of the mask on: columns 2 and 3 of the 4 the box covers.
  auto half = torch::zeros({1, 28, 28});
  half[0].narrow(1, 0, 14).fill_(1);
  const auto left = paste_masks(half, mask_rcnn::test::boxes({{2, 3, 6, 8}}), 10, 10);
  expected.narrow(1, 4, 2).fill_(false);
  CHECK(left[0].equal(expected));
  // An empty box pastes nothing.
  CHECK(paste_masks(full, mask_rcnn::test::boxes({{5, 5, 5, 9}}), 10, 10).sum().item<std::int64_t>() == 0);
}

TEST_CASE("model: losses on generated shapes are finite and every parameter gets a gradient") {
  torch::manual_seed(1);
  MaskRcnn model(preset_config("tiny", 3));
  const ShapesDataset data({.count = 4, .seed = 3});
  const std::vector<DetectionSample> samples = {data.get(0), data.get(1)};
  model->train();
  const auto losses = model->losses(batch_of(samples), targets_of(samples));
  for (const char* name : {"rpn_objectness", "rpn_box", "box_class", "box_regression", "mask"}) {
    CAPTURE(name);
    REQUIRE(losses.count(name) == 1);
    CHECK(std::isfinite(losses.at(name).sum.item<double>()));
    CHECK(losses.at(name).count > 0);
  }
  // The RPN samples 256 anchors per image, the box head 128 proposals.
  CHECK(losses.at("rpn_objectness").count == 512);
  CHECK(losses.at("box_class").count == 256);
  torch::Tensor total = torch::zeros({});
  for (const auto& [name, term] : losses) total = total + term.sum / term.count;
  total.backward();
  for (const auto& p : model->named_parameters()) {
    CAPTURE(p.key());
    CHECK(p.value().grad().defined());
  }
}

TEST_CASE("model: a batch's loss sums and counts are those of its images added up") {
  // What makes gradients averaged over ranks equal those of one process with every image: see
  // Note [Losses over the global batch]. Images of one size, so padding is the same.
  torch::manual_seed(2);
  MaskRcnn model(preset_config("tiny", 3));
  model->train();
  const ShapesDataset data({.count = 3, .seed = 5, .min_side = 96, .max_side = 96});
  const std::vector<DetectionSample> both = {data.get(0), data.get(1)};
  auto targets = targets_of(both);
  const auto together = model->losses(batch_of(both), targets);
  const auto first = model->losses(batch_of({both[0]}), {targets[0]});
  const auto second = model->losses(batch_of({both[1]}), {targets[1]});
  for (const auto& [name, term] : together) {
    CAPTURE(name);
    CHECK(term.count == first.at(name).count + second.at(name).count);
    const double sum = first.at(name).sum.item<double>() + second.at(name).sum.item<double>();
    CHECK(term.sum.item<double>() == Approx(sum).epsilon(1e-4));
  }
}

TEST_CASE("model: inference returns at most 100 detections per image, best first") {
  torch::manual_seed(3);
  MaskRcnn model(preset_config("tiny", 3));
  model->eval();
  torch::NoGradGuard no_grad;
  const ShapesDataset data({.count = 2, .seed = 1});
  const auto detections = model->detect(batch_of({data.get(0), data.get(1)}));
  REQUIRE(detections.size() == 2);
  for (const auto& d : detections) {
    const auto n = d.boxes.size(0);
    CHECK(n <= 100);
    CHECK(d.scores.size(0) == n);
    CHECK(d.labels.size(0) == n);
    CHECK(d.masks.sizes() == torch::IntArrayRef{n, 28, 28});
    if (n > 1) CHECK((d.scores.slice(0, 1) <= d.scores.slice(0, 0, n - 1)).all().item<bool>());
    if (n > 0) {
      CHECK(d.labels.min().item<std::int64_t>() >= 1);
      CHECK(d.labels.max().item<std::int64_t>() <= 3);
      CHECK(d.scores.min().item<double>() > 0.05);
    }
  }
}

TEST_CASE("checkpoint: weights and the model's description round-trip") {
  dtrain::test::TempDir dir;
  torch::manual_seed(4);
  MaskRcnn model(preset_config("tiny", 2));
  const CheckpointInfo info{"tiny", {7, 9}, {"cat", "dog"}, 123};
  save_checkpoint(dir / "model.pt", model, info);
  CHECK_FALSE(std::filesystem::exists(dir / "model.pt.tmp"));
  CheckpointInfo read;
  auto loaded = load_checkpoint(dir / "model.pt", read);
  CHECK(read.preset == "tiny");
  CHECK(read.category_ids == std::vector<std::int64_t>{7, 9});
  CHECK(read.category_names == std::vector<std::string>{"cat", "dog"});
  CHECK(read.iterations == 123);
  CHECK(read.norm == Norm::group);
  const auto a = model->named_parameters(), b = loaded->named_parameters();
  REQUIRE(a.size() == b.size());
  for (const auto& p : a) CHECK(p.value().equal(b[p.key()]));

  // A batch-norm model comes back as one, with its running statistics; group norm's parameter
  // names are kept, so the two differ only by the buffers.
  torch::manual_seed(4);
  MaskRcnn batch_norm(preset_config("tiny", 2, Norm::batch));
  CHECK(batch_norm->named_parameters().keys() == a.keys());
  CHECK(model->named_buffers().is_empty());
  auto buffers = batch_norm->named_buffers();
  CHECK_FALSE(buffers.is_empty());
  for (auto& item : buffers) item.value().fill_(3);
  save_checkpoint(dir / "batch.pt", batch_norm, {"tiny", {7, 9}, {"cat", "dog"}, 5, Norm::batch});
  auto batch_loaded = load_checkpoint(dir / "batch.pt", read);
  CHECK(read.norm == Norm::batch);
  for (const auto& item : batch_loaded->named_buffers())
    CHECK(item.value().equal(buffers[item.key()]));
  CHECK(dtrain::test::contains(
      dtrain::test::message_of<std::invalid_argument>([] { norm_from_name("layer"); }),
      "unknown norm 'layer': choose one of group, batch, syncbn"));

  dtrain::test::write_text(dir / "junk.pt", "not a checkpoint");
  CHECK(dtrain::test::contains(
      dtrain::test::message_of<std::runtime_error>([&] { load_checkpoint(dir / "junk.pt", read); }),
      "junk.pt: not a Mask R-CNN checkpoint"));
  CHECK(dtrain::test::contains(
      dtrain::test::message_of<std::invalid_argument>([] { preset_config("resnet50", 3); }),
      "unknown model 'resnet50': choose one of tiny, small, resnet18, resnet34"));
}
