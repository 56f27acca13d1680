// COCO instances and results files: what is read from them, and a clear error naming the file and
// the annotation for every kind of bad input.

#include <doctest/doctest.h>

#include <string>

#include "coco_format.hpp"
#include "support/messages.hpp"
#include "support/temp_dir.hpp"

using namespace mask_rcnn;
using dtrain::test::contains;
using dtrain::test::message_of;
using dtrain::test::TempDir;
using dtrain::test::write_text;

namespace {

// Two images and two categories; annotation 1 a polygon, 2 an uncompressed-RLE crowd region,
// 3 a compressed RLE with no "area" or "bbox" (computed from the mask).
std::string instances(const std::string& annotation_override = "") {
  const std::string annotations = annotation_override.empty() ? R"([
    {"id": 1, "image_id": 10, "category_id": 5, "bbox": [1, 1, 3, 3], "area": 9, "iscrowd": 0,
     "segmentation": [[1, 1, 4, 1, 4, 4, 1, 4]]},
    {"id": 2, "image_id": 10, "category_id": 6, "bbox": [0, 0, 2, 1], "area": 2, "iscrowd": 1,
     "segmentation": {"size": [6, 6], "counts": [0, 1, 5, 1, 29]}},
    {"id": 3, "image_id": 11, "category_id": 5,
     "segmentation": {"size": [3, 2], "counts": "11110"}}])"
                                                                : annotation_override;
  return R"({"images": [{"id": 10, "file_name": "a.png", "width": 6, "height": 6},
                        {"id": 11, "file_name": "sub/b.jpg", "width": 2, "height": 3}],
             "categories": [{"id": 5, "name": "circle"}, {"id": 6, "name": "square"}],
             "annotations": )" +
         annotations + "}";
}

std::string load_error(const TempDir& dir, const std::string& text) {
  write_text(dir / "instances.json", text);
  return message_of<CocoFormatError>([&] { read_coco_annotations(dir / "instances.json"); });
}

std::string annotation_error(const TempDir& dir, const std::string& annotation) {
  return load_error(dir, instances("[" + annotation + "]"));
}

}  // namespace

TEST_CASE("coco format: polygons, uncompressed and compressed RLE, crowd flags, computed area") {
  TempDir dir;
  write_text(dir / "instances.json", instances());
  const CocoAnnotations coco = read_coco_annotations(dir / "instances.json");
  REQUIRE(coco.images.size() == 2);
  CHECK(coco.images[1].file_name == "sub/b.jpg");
  CHECK(coco.image(11).height == 3);
  REQUIRE(coco.categories.size() == 2);
  CHECK(coco.categories[0].name == "circle");
  REQUIRE(coco.annotations.size() == 3);

  const auto& polygon = coco.annotations[0];
  CHECK_FALSE(polygon.iscrowd);
  CHECK(polygon.segmentation.polygons.size() == 1);
  CHECK(rle_area(segmentation_mask(polygon.segmentation, coco.image(10))) == 9);

  const auto& crowd = coco.annotations[1];
  CHECK(crowd.iscrowd);
  REQUIRE(crowd.segmentation.rle);
  CHECK_FALSE(crowd.segmentation.compressed);
  CHECK(rle_area(*crowd.segmentation.rle) == 2);  // pixels (0,0) and (1,0)

  const auto& compressed = coco.annotations[2];
  REQUIRE(compressed.segmentation.rle);
  CHECK(compressed.segmentation.compressed);
  CHECK(compressed.area == 3);
  CHECK(compressed.bbox == std::array<double, 4>{0, 0, 2, 2});

  // Written and read back: the same annotations, each segmentation in its own form.
  write_coco_annotations(coco, dir / "copy.json");
  const CocoAnnotations again = read_coco_annotations(dir / "copy.json");
  REQUIRE(again.annotations.size() == 3);
  CHECK(again.annotations[0].segmentation.polygons == polygon.segmentation.polygons);
  CHECK(*again.annotations[1].segmentation.rle == *crowd.segmentation.rle);
  CHECK_FALSE(again.annotations[1].segmentation.compressed);
  CHECK(again.annotations[2].segmentation.compressed);
  CHECK(again.annotations[2].area == 3);
}

TEST_CASE("coco format: malformed JSON names the file and where parsing stopped") {
  TempDir dir;
  const auto message = load_error(dir, R"({"images": [}")");
  CHECK(contains(message, (dir / "instances.json").string()));
  CHECK(contains(message, "not valid JSON at byte 13"));

  CHECK(contains(message_of<CocoFormatError>([&] { read_coco_annotations(dir / "missing.json"); }),
                 "missing.json: cannot open the file"));
  CHECK(contains(load_error(dir, R"({"images": [], "categories": []})"),
                 "the top level: has no \"annotations\""));
  CHECK(contains(load_error(dir, "[1, 2]"), "must be a JSON object"));
}

TEST_CASE("coco format: a polygon with too few points names the annotation") {
  TempDir dir;
  const auto message = annotation_error(
      dir, R"({"id": 17, "image_id": 10, "category_id": 5, "segmentation": [[1, 1, 4, 4]]})");
  CHECK(contains(message, (dir / "instances.json").string() + ": annotation id 17: polygon 0 has 2 "
                          "points; a polygon needs at least 3 points"));
  CHECK(contains(annotation_error(dir, R"({"id": 18, "image_id": 10, "category_id": 5,
                                   "segmentation": [[1, 1, 4, 4, 5]]})"),
                 "annotation id 18: polygon 0 has 5 numbers"));
  CHECK(contains(annotation_error(dir, R"({"id": 19, "image_id": 10, "category_id": 5,
                                   "segmentation": []})"),
                 "annotation id 19: \"segmentation\" is an empty list"));
}

TEST_CASE("coco format: an annotation on an unknown image or category names both ids") {
  TempDir dir;
  CHECK(contains(annotation_error(dir, R"({"id": 7, "image_id": 99, "category_id": 5,
                                   "segmentation": [[1, 1, 4, 1, 4, 4]]})"),
                 "annotation id 7: refers to image_id 99, which is not in \"images\""));
  CHECK(contains(annotation_error(dir, R"({"id": 8, "image_id": 10, "category_id": 42,
                                   "segmentation": [[1, 1, 4, 1, 4, 4]]})"),
                 "annotation id 8: refers to category_id 42, which is not in \"categories\""));
}

TEST_CASE("coco format: bad RLE, boxes, ids and duplicates are named") {
  TempDir dir;
  CHECK(contains(annotation_error(dir, R"({"id": 4, "image_id": 10, "category_id": 5,
                                   "segmentation": {"size": [5, 6], "counts": [30]}})"),
                 "annotation id 4: RLE size [5, 6] differs from image 10's height and width [6, 6]"));
  CHECK(contains(annotation_error(dir, R"({"id": 4, "image_id": 10, "category_id": 5,
                                   "segmentation": {"size": [6, 6], "counts": [30]}})"),
                 "annotation id 4: RLE counts: the runs cover 30 pixels but the mask has 6 x 6"));
  CHECK(contains(annotation_error(dir, R"({"id": 4, "image_id": 10, "category_id": 5,
                                   "segmentation": {"size": [6, 6], "counts": "!!"}})"),
                 "annotation id 4: compressed RLE counts contain '!'"));
  CHECK(contains(annotation_error(dir, R"({"id": 5, "image_id": 10, "category_id": 5, "bbox": [1, 2],
                                   "segmentation": [[1, 1, 4, 1, 4, 4]]})"),
                 "annotation id 5: \"bbox\" must be [x, y, width, height]"));
  CHECK(contains(annotation_error(dir, R"({"id": "x", "image_id": 10, "category_id": 5,
                                   "segmentation": [[1, 1, 4, 1, 4, 4]]})"),
                 "annotation 0: \"id\" must be an integer, got \"x\""));
  CHECK(contains(annotation_error(dir, R"({"id": 6, "image_id": 10, "category_id": 5,
                                   "segmentation": [[1, 1, 4, 1, 4, 4]]},
                                  {"id": 6, "image_id": 10, "category_id": 5,
                                   "segmentation": [[1, 1, 4, 1, 4, 4]]})"),
                 "annotation id 6: appears twice in annotations"));
  CHECK(contains(annotation_error(dir, R"({"id": 9, "image_id": 10, "category_id": 5})"),
                 "annotation id 9: has no \"segmentation\""));
}

TEST_CASE("coco format: a missing image file names the file, the image and its annotations") {
  TempDir dir;
  write_text(dir / "instances.json", instances());
  const CocoAnnotations coco = read_coco_annotations(dir / "instances.json");
  std::filesystem::create_directories(dir / "images");
  write_text(dir / "images" / "a.png", "");
  const auto message = message_of<CocoFormatError>(
      [&] { check_image_files(coco, dir / "images", dir / "instances.json"); });
  CHECK(contains(message, (dir / "images" / "sub/b.jpg").string() + ": image file not found"));
  CHECK(contains(message, "image id 11 in " + (dir / "instances.json").string()));
  CHECK(contains(message, "annotated by annotation id 3"));
  std::filesystem::create_directories(dir / "images" / "sub");
  write_text(dir / "images" / "sub" / "b.jpg", "");
  CHECK_NOTHROW(check_image_files(coco, dir / "images", dir / "instances.json"));
}

TEST_CASE("coco format: results are read the way pycocotools' loadRes reads them") {
  TempDir dir;
  write_text(dir / "instances.json", instances());
  const CocoAnnotations gt = read_coco_annotations(dir / "instances.json");

  // With boxes: the area is the box's; a result without a mask gets its box as mask.
  std::vector<CocoDetection> detections = {
      {10, 5, {1, 1, 3, 3}, 0.9, rle_from_polygon(std::vector<double>{1, 1, 4, 1, 4, 4}, 6, 6)}};
  write_coco_detections(detections, dir / "results.json");
  auto read = read_coco_results(dir / "results.json", gt);
  REQUIRE(read.size() == 1);
  CHECK(read[0].area == 9);
  CHECK(read[0].mask == detections[0].mask);
  CHECK(detections_from_json(detections_to_json(detections))[0].mask == detections[0].mask);

  write_text(dir / "boxes.json", R"([{"image_id": 10, "category_id": 5, "bbox": [1, 1, 3, 3], "score": 1}])");
  read = read_coco_results(dir / "boxes.json", gt);
  REQUIRE(read.size() == 1);
  CHECK(rle_area(read[0].mask) == 9);

  // Masks only: box and area from the mask.
  write_text(dir / "masks.json", R"([{"image_id": 11, "category_id": 5, "score": 0.5,
                                      "segmentation": {"size": [3, 2], "counts": "11110"}}])");
  read = read_coco_results(dir / "masks.json", gt);
  REQUIRE(read.size() == 1);
  CHECK(read[0].area == 3);
  CHECK(read[0].bbox == std::array<double, 4>{0, 0, 2, 2});

  write_text(dir / "bad.json", R"([{"image_id": 12, "category_id": 5, "bbox": [0, 0, 1, 1], "score": 1}])");
  CHECK(contains(message_of<CocoFormatError>([&] { read_coco_results(dir / "bad.json", gt); }),
                 "bad.json: result 0: is on image_id 12, which the ground truth does not list"));
  write_text(dir / "size.json", R"([{"image_id": 11, "category_id": 5, "bbox": [0, 0, 1, 1], "score": 1,
                                     "segmentation": {"size": [6, 6], "counts": "<"}}])");
  CHECK(contains(message_of<CocoFormatError>([&] { read_coco_results(dir / "size.json", gt); }),
                 "size.json: result 0: RLE size [6, 6] differs from image 11's"));
}
