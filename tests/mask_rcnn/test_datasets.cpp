// The generated shapes and the COCO-format loader on a tiny set the test writes.

#include "torch_test.hpp"  // first: see its note

#include <stb_image_write.h>

#include <set>

#include "coco_dataset.hpp"
#include "shapes.hpp"
#include "support/messages.hpp"
#include "support/temp_dir.hpp"

using namespace mask_rcnn;
using dtrain::test::contains;
using dtrain::test::message_of;
using dtrain::test::TempDir;
using dtrain::test::write_text;
using mask_rcnn::test::max_abs_diff;

TEST_CASE("shapes: a sample is a function of (seed, index), and sizes vary") {
  const ShapesDataset a({.count = 50, .seed = 7}), b({.count = 50, .seed = 7}), c({.count = 50, .seed = 8});
  const auto s1 = a.get(3), s2 = b.get(3);
  CHECK(s1.image.equal(s2.image));
  CHECK(s1.targets.masks.equal(s2.targets.masks));
  const auto other = c.get(3).image;
  const bool same = other.sizes() == s1.image.sizes() && other.equal(s1.image);
  CHECK_FALSE(same);

  std::set<std::pair<std::int64_t, std::int64_t>> sizes;
  for (std::int64_t i = 0; i < 50; ++i) {
    const auto [h, w] = a.image_size(i);
    sizes.insert({h, w});
    CHECK(h % 16 == 0);
    CHECK(w % 16 == 0);
    CHECK(h >= 96);
    CHECK(w <= 160);
  }
  CHECK(sizes.size() > 5);  // the bucket sampler has something to sort
}

TEST_CASE("shapes: objects are visible, labelled, and boxed tightly") {
  const ShapesDataset data({.count = 30, .seed = 11});
  for (std::int64_t i = 0; i < 30; ++i) {
    CAPTURE(i);
    const auto s = data.get(i);
    const auto [h, w] = data.image_size(i);
    REQUIRE(s.image.sizes() == torch::IntArrayRef{3, h, w});
    CHECK(s.image.min().item<double>() >= 0.0);
    CHECK(s.image.max().item<double>() <= 1.0);
    const auto n = s.targets.labels.size(0);
    CHECK(n >= 1);
    CHECK(n <= 4);
    CHECK(s.targets.masks.sizes() == torch::IntArrayRef{n, h, w});
    for (std::int64_t k = 0; k < n; ++k) {
      const auto label = s.targets.labels[k].item<std::int64_t>();
      CHECK(label >= 1);
      CHECK(label <= 3);
      const auto mask = s.targets.masks[k];
      CHECK(mask.sum().item<std::int64_t>() >= 15);  // >= half of at least 30 pixels
      const auto ys = mask.any(1).nonzero().flatten(), xs = mask.any(0).nonzero().flatten();
      const auto box = s.targets.boxes[k];
      CHECK(box[0].item<double>() == xs.min().item<double>());
      CHECK(box[1].item<double>() == ys.min().item<double>());
      CHECK(box[2].item<double>() == xs.max().item<double>() + 1);
      CHECK(box[3].item<double>() == ys.max().item<double>() + 1);
    }
    // Visible masks do not overlap: a pixel shows at most one object.
    if (n > 0) CHECK(s.targets.masks.sum(0).max().item<std::int64_t>() <= 1);
  }
}

TEST_CASE("shapes: the ground truth file holds the samples' objects") {
  const ShapesDataset data({.count = 5, .seed = 2});
  const auto gt = data.ground_truth({1, 3});
  REQUIRE(gt.images.size() == 2);
  CHECK(gt.images[1].id == 4);
  CHECK(gt.categories.size() == 3);
  const auto sample = data.get(3);
  std::vector<const CocoAnnotation*> of_image;
  for (const auto& a : gt.annotations)
    if (a.image_id == 4) of_image.push_back(&a);
  REQUIRE(static_cast<std::int64_t>(of_image.size()) == sample.targets.labels.size(0));
  for (std::size_t k = 0; k < of_image.size(); ++k) {
    const auto mask = sample.targets.masks[static_cast<std::int64_t>(k)].contiguous();
    const auto rle = rle_encode({mask.data_ptr<std::uint8_t>(), static_cast<std::size_t>(mask.numel())},
                                mask.size(0), mask.size(1));
    CHECK(*of_image[k]->segmentation.rle == rle);
    CHECK(of_image[k]->category_id == sample.targets.labels[static_cast<std::int64_t>(k)].item<std::int64_t>());
    CHECK(of_image[k]->area == static_cast<double>(rle_area(rle)));
  }
}

namespace {

// Two PNG images (4x6 and 8x8 of known colours) and an instances file: image 1 has a polygon
// object (category 20) and a crowd region, image 2 an RLE object (category 10); image 3 none.
void write_tiny_coco(const TempDir& dir) {
  std::filesystem::create_directories(dir / "images");
  std::vector<std::uint8_t> a(4 * 6 * 3), b(8 * 8 * 3);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<std::uint8_t>(i * 3);
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<std::uint8_t>(255 - i);
  REQUIRE(stbi_write_png((dir / "images" / "a.png").string().c_str(), 6, 4, 3, a.data(), 18));
  REQUIRE(stbi_write_png((dir / "images" / "b.png").string().c_str(), 8, 8, 3, b.data(), 24));
  REQUIRE(stbi_write_png((dir / "images" / "c.png").string().c_str(), 8, 8, 3, b.data(), 24));
  write_text(dir / "instances.json", R"({
    "images": [{"id": 1, "file_name": "a.png", "width": 6, "height": 4},
               {"id": 2, "file_name": "b.png", "width": 8, "height": 8},
               {"id": 3, "file_name": "c.png", "width": 8, "height": 8}],
    "categories": [{"id": 20, "name": "square"}, {"id": 10, "name": "circle"}],
    "annotations": [
      {"id": 5, "image_id": 1, "category_id": 20, "bbox": [1, 1, 3, 2], "area": 6, "iscrowd": 0,
       "segmentation": [[1, 1, 4, 1, 4, 3, 1, 3]]},
      {"id": 6, "image_id": 1, "category_id": 10, "bbox": [0, 0, 1, 1], "area": 1, "iscrowd": 1,
       "segmentation": {"size": [4, 6], "counts": [0, 1, 23]}},
      {"id": 7, "image_id": 2, "category_id": 10, "bbox": [2, 0, 2, 8], "area": 16, "iscrowd": 0,
       "segmentation": {"size": [8, 8], "counts": [16, 16, 32]}}]})");
}

}  // namespace

TEST_CASE("coco dataset: pixels, boxes, masks and labels as the files say") {
  TempDir dir;
  write_tiny_coco(dir);
  const CocoDataset coco({.annotation_file = dir / "instances.json", .image_dir = dir / "images", .min_size = 0});
  REQUIRE(coco.size() == 3);
  // Labels follow the sorted category ids: 10 -> 1, 20 -> 2.
  REQUIRE(coco.categories().size() == 2);
  CHECK(coco.categories()[0].id == 10);
  CHECK(coco.categories()[1].name == "square");

  const auto s = coco.get(0);
  CHECK(s.image_id == 1);
  CHECK(s.image.sizes() == torch::IntArrayRef{3, 4, 6});
  CHECK(s.image[1][2][3].item<double>() == doctest::Approx(((2 * 6 + 3) * 3 + 1) * 3 / 255.0));
  // The crowd region is not a training target.
  REQUIRE(s.targets.labels.size(0) == 1);
  CHECK(s.targets.labels[0].item<std::int64_t>() == 2);
  CHECK(max_abs_diff(s.targets.boxes[0], torch::tensor({1.0f, 1.0f, 4.0f, 3.0f})) == 0.0);
  auto expected = torch::zeros({4, 6}, torch::kUInt8);
  expected.narrow(0, 1, 2).narrow(1, 1, 3).fill_(1);
  CHECK(s.targets.masks[0].equal(expected));

  const auto t = coco.get(1);
  CHECK(t.targets.labels[0].item<std::int64_t>() == 1);
  CHECK(t.targets.masks[0].sum().item<std::int64_t>() == 16);  // columns 2 and 3
  CHECK(t.targets.masks[0].select(1, 2).all().item<bool>());
  CHECK(coco.get(2).targets.labels.size(0) == 0);

  // The ground truth for evaluation keeps everything, crowd regions included.
  const auto gt = coco.ground_truth({0, 1});
  CHECK(gt.images.size() == 2);
  CHECK(gt.annotations.size() == 3);
}

TEST_CASE("coco dataset: resizing scales pixels, boxes and masks; empty images can be skipped") {
  TempDir dir;
  write_tiny_coco(dir);
  const CocoDataset coco({.annotation_file = dir / "instances.json", .image_dir = dir / "images",
                          .min_size = 8, .max_size = 100, .skip_empty = true});
  CHECK(coco.size() == 2);
  CHECK(coco.image_size(0) == std::pair<std::int64_t, std::int64_t>{8, 12});
  const auto s = coco.get(0);
  CHECK(s.scale == 2.0);
  CHECK(s.original_width == 6);
  CHECK(s.image.sizes() == torch::IntArrayRef{3, 8, 12});
  CHECK(max_abs_diff(s.targets.boxes[0], torch::tensor({2.0f, 2.0f, 8.0f, 6.0f})) == 0.0);
  CHECK(s.targets.masks[0].sum().item<std::int64_t>() == 24);  // 6 pixels, each now 2x2
  const CocoDataset capped({.annotation_file = dir / "instances.json", .image_dir = dir / "images",
                            .min_size = 8, .max_size = 9});
  CHECK(capped.image_size(0) == std::pair<std::int64_t, std::int64_t>{6, 9});  // longer side capped
}

TEST_CASE("coco dataset: a missing, undecodable or mis-sized image is named") {
  TempDir dir;
  write_tiny_coco(dir);
  std::filesystem::remove(dir / "images" / "a.png");
  const auto missing = message_of<CocoFormatError>(
      [&] { CocoDataset({.annotation_file = dir / "instances.json", .image_dir = dir / "images"}); });
  CHECK(contains(missing, (dir / "images" / "a.png").string() + ": image file not found (image id 1"));
  CHECK(contains(missing, "annotated by annotation id 5, 6"));

  write_text(dir / "images" / "a.png", "not an image");
  const CocoDataset broken({.annotation_file = dir / "instances.json", .image_dir = dir / "images"});
  CHECK(contains(message_of<CocoFormatError>([&] { broken.get(0); }),
                 (dir / "images" / "a.png").string() + ": cannot decode the image"));
  std::filesystem::copy_file(dir / "images" / "b.png", dir / "images" / "a.png",
                             std::filesystem::copy_options::overwrite_existing);
  CHECK(contains(message_of<CocoFormatError>([&] { broken.get(0); }),
                 "the image is 8x8 but " + (dir / "instances.json").string() + " says 6x4 (image id 1)"));
}
