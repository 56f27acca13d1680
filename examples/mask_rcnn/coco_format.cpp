#include "coco_format.hpp"

#include <nlohmann/json.hpp>

#include <fstream>
#include <map>
#include <set>
#include <sstream>

namespace mask_rcnn {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

[[noreturn]] void fail(const fs::path& file, const std::string& what) {
  throw CocoFormatError(file.string() + ": " + what);
}

json parse_file(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) fail(file, "cannot open the file (does it exist and is it readable?)");
  try {
    return json::parse(in);
  } catch (const json::parse_error& e) {
    // e.byte is the offset of the first character that did not parse.
    fail(file, "not valid JSON at byte " + std::to_string(e.byte) + ": " + e.what());
  }
}

void write_file(const fs::path& file, const json& document) {
  if (file.has_parent_path()) fs::create_directories(file.parent_path());
  // Written next to the target and renamed, so a reader never sees half a file.
  const fs::path tmp = file.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) fail(tmp, "cannot create the file");
    out << document.dump() << '\n';
    if (!out.flush()) fail(tmp, "cannot write the file (disk full?)");
  }
  fs::rename(tmp, file);
}

// `where` names the element for messages: "image 3", "annotation id 17", "result 5".
struct Reader {
  const fs::path& file;
  std::string where;

  [[noreturn]] void fail(const std::string& what) const {
    mask_rcnn::fail(file, where + ": " + what);
  }

  const json& field(const json& object, const char* key) const {
    if (!object.is_object()) fail("is not a JSON object");
    const auto it = object.find(key);
    if (it == object.end()) fail(std::string("has no \"") + key + "\"");
    return *it;
  }

  std::int64_t integer(const json& value, const char* key) const {
    if (value.is_number_integer()) return value.get<std::int64_t>();
    if (value.is_number_float()) {
      const double d = value.get<double>();
      if (d == static_cast<double>(static_cast<std::int64_t>(d))) return static_cast<std::int64_t>(d);
    }
    fail(std::string("\"") + key + "\" must be an integer, got " + value.dump());
  }

  double number(const json& value, const char* key) const {
    if (!value.is_number()) fail(std::string("\"") + key + "\" must be a number, got " + value.dump());
    return value.get<double>();
  }

  std::int64_t integer_field(const json& object, const char* key) const {
    return integer(field(object, key), key);
  }

  std::array<double, 4> box(const json& value) const {
    if (!value.is_array() || value.size() != 4) {
      fail("\"bbox\" must be [x, y, width, height], got " + value.dump());
    }
    std::array<double, 4> b{};
    for (std::size_t i = 0; i < 4; ++i) b[i] = number(value[i], "bbox");
    if (b[2] < 0 || b[3] < 0) fail("\"bbox\" has a negative width or height: " + value.dump());
    return b;
  }

  Segmentation segmentation(const json& value, const CocoImage& image) const {
    Segmentation s;
    if (value.is_array()) {
      if (value.empty()) fail("\"segmentation\" is an empty list of polygons");
      for (std::size_t p = 0; p < value.size(); ++p) {
        const json& polygon = value[p];
        if (!polygon.is_array()) {
          fail("polygon " + std::to_string(p) + " of \"segmentation\" is not a list of numbers");
        }
        if (polygon.size() < 6 || polygon.size() % 2 != 0) {
          fail("polygon " + std::to_string(p) + " has " +
               (polygon.size() % 2 == 0 ? std::to_string(polygon.size() / 2) + " points"
                                        : std::to_string(polygon.size()) + " numbers") +
               "; a polygon needs at least 3 points, as x, y pairs");
        }
        std::vector<double> xy;
        for (const auto& v : polygon) xy.push_back(number(v, "segmentation"));
        s.polygons.push_back(std::move(xy));
      }
      return s;
    }
    if (!value.is_object()) {
      fail("\"segmentation\" must be a list of polygons or an RLE object {\"counts\", \"size\"}");
    }
    const json& size = field(value, "size");
    if (!size.is_array() || size.size() != 2) fail("RLE \"size\" must be [height, width]");
    const auto h = integer(size[0], "size"), w = integer(size[1], "size");
    if (h != image.height || w != image.width) {
      fail("RLE size [" + std::to_string(h) + ", " + std::to_string(w) + "] differs from image " +
           std::to_string(image.id) + "'s height and width [" + std::to_string(image.height) +
           ", " + std::to_string(image.width) + "]");
    }
    const json& counts = field(value, "counts");
    try {
      if (counts.is_string()) {
        s.rle = rle_from_string(counts.get<std::string>(), h, w);
        s.compressed = true;
      } else if (counts.is_array()) {
        std::vector<std::uint32_t> runs;
        for (const auto& c : counts) {
          const auto run = integer(c, "counts");
          if (run < 0 || run > UINT32_MAX) fail("RLE \"counts\" holds " + c.dump());
          runs.push_back(static_cast<std::uint32_t>(run));
        }
        s.rle = rle_from_counts(std::move(runs), h, w);
      } else {
        fail("RLE \"counts\" must be a list of run lengths or a compressed string");
      }
    } catch (const std::invalid_argument& e) {
      fail(e.what());
    }
    return s;
  }
};

json segmentation_json(const Segmentation& s) {
  if (!s.rle) return s.polygons;
  json counts = s.compressed ? json(rle_to_string(*s.rle)) : json(s.rle->counts);
  return {{"size", {s.rle->height, s.rle->width}}, {"counts", std::move(counts)}};
}

json rle_json(const Rle& rle) {
  return {{"size", {rle.height, rle.width}}, {"counts", rle_to_string(rle)}};
}

json detection_json(const CocoDetection& d) {
  return {{"image_id", d.image_id},
          {"category_id", d.category_id},
          {"bbox", d.bbox},
          {"score", d.score},
          {"segmentation", rle_json(d.mask)}};
}

}  // namespace

const CocoImage& CocoAnnotations::image(std::int64_t id) const {
  for (const auto& image : images) {
    if (image.id == id) return image;
  }
  throw std::out_of_range("no image with id " + std::to_string(id));
}

CocoAnnotations read_coco_annotations(const fs::path& file) {
  const json document = parse_file(file);
  Reader top{file, "the top level"};
  if (!document.is_object()) top.fail("must be a JSON object with images, annotations, categories");
  for (const char* key : {"images", "annotations", "categories"}) {
    if (!top.field(document, key).is_array()) top.fail(std::string("\"") + key + "\" must be a list");
  }

  CocoAnnotations out;
  std::map<std::int64_t, std::size_t> image_at;
  const json& images = document["images"];
  for (std::size_t i = 0; i < images.size(); ++i) {
    Reader r{file, "image " + std::to_string(i)};
    CocoImage image;
    image.id = r.integer_field(images[i], "id");
    r.where = "image id " + std::to_string(image.id);
    const json& name = r.field(images[i], "file_name");
    if (!name.is_string()) r.fail("\"file_name\" must be a string");
    image.file_name = name.get<std::string>();
    image.width = r.integer_field(images[i], "width");
    image.height = r.integer_field(images[i], "height");
    if (image.width <= 0 || image.height <= 0) r.fail("width and height must be positive");
    if (!image_at.emplace(image.id, out.images.size()).second) r.fail("appears twice in images");
    out.images.push_back(std::move(image));
  }

  std::set<std::int64_t> category_ids;
  const json& categories = document["categories"];
  for (std::size_t i = 0; i < categories.size(); ++i) {
    Reader r{file, "category " + std::to_string(i)};
    CocoCategory category;
    category.id = r.integer_field(categories[i], "id");
    r.where = "category id " + std::to_string(category.id);
    const auto name = categories[i].find("name");
    category.name = name != categories[i].end() && name->is_string() ? name->get<std::string>()
                                                                     : std::to_string(category.id);
    if (!category_ids.insert(category.id).second) r.fail("appears twice in categories");
    out.categories.push_back(std::move(category));
  }

  std::set<std::int64_t> annotation_ids;
  const json& annotations = document["annotations"];
  for (std::size_t i = 0; i < annotations.size(); ++i) {
    Reader r{file, "annotation " + std::to_string(i)};
    const json& a = annotations[i];
    CocoAnnotation ann;
    ann.id = r.integer_field(a, "id");
    r.where = "annotation id " + std::to_string(ann.id);
    if (!annotation_ids.insert(ann.id).second) r.fail("appears twice in annotations");
    ann.image_id = r.integer_field(a, "image_id");
    const auto image = image_at.find(ann.image_id);
    if (image == image_at.end()) {
      r.fail("refers to image_id " + std::to_string(ann.image_id) + ", which is not in \"images\"");
    }
    ann.category_id = r.integer_field(a, "category_id");
    if (!category_ids.count(ann.category_id)) {
      r.fail("refers to category_id " + std::to_string(ann.category_id) +
             ", which is not in \"categories\"");
    }
    if (a.contains("iscrowd")) ann.iscrowd = r.integer(a["iscrowd"], "iscrowd") != 0;
    const CocoImage& img = out.images[image->second];
    ann.segmentation = r.segmentation(r.field(a, "segmentation"), img);
    const bool has_bbox = a.contains("bbox"), has_area = a.contains("area");
    if (has_bbox) ann.bbox = r.box(a["bbox"]);
    if (has_area) ann.area = r.number(a["area"], "area");
    if (!has_bbox || !has_area) {
      const Rle mask = segmentation_mask(ann.segmentation, img);
      if (!has_bbox) ann.bbox = rle_bbox(mask);
      if (!has_area) ann.area = static_cast<double>(rle_area(mask));
    }
    out.annotations.push_back(std::move(ann));
  }
  return out;
}

void check_image_files(const CocoAnnotations& annotations, const fs::path& image_dir,
                       const fs::path& annotation_file) {
  for (const auto& image : annotations.images) {
    const fs::path path = image_dir / image.file_name;
    std::error_code ec;
    if (fs::is_regular_file(path, ec)) continue;
    std::string users;
    int shown = 0, total = 0;
    for (const auto& a : annotations.annotations) {
      if (a.image_id != image.id) continue;
      if (shown < 5) users += (shown++ ? ", " : "") + std::to_string(a.id);
      ++total;
    }
    if (total > shown) users += ", ...";
    throw CocoFormatError(
        path.string() + ": image file not found (image id " + std::to_string(image.id) +
        " in " + annotation_file.string() +
        (total > 0 ? ", annotated by annotation id " + users : std::string(", no annotations")) +
        "); check the image folder given for this annotation file");
  }
}

void write_coco_annotations(const CocoAnnotations& annotations, const fs::path& file) {
  json images = json::array(), categories = json::array(), anns = json::array();
  for (const auto& i : annotations.images) {
    images.push_back(
        {{"id", i.id}, {"file_name", i.file_name}, {"width", i.width}, {"height", i.height}});
  }
  for (const auto& c : annotations.categories) {
    categories.push_back({{"id", c.id}, {"name", c.name}});
  }
  for (const auto& a : annotations.annotations) {
    anns.push_back({{"id", a.id},
                    {"image_id", a.image_id},
                    {"category_id", a.category_id},
                    {"bbox", a.bbox},
                    {"area", a.area},
                    {"iscrowd", a.iscrowd ? 1 : 0},
                    {"segmentation", segmentation_json(a.segmentation)}});
  }
  write_file(file, {{"images", std::move(images)},
                    {"annotations", std::move(anns)},
                    {"categories", std::move(categories)}});
}

Rle segmentation_mask(const Segmentation& segmentation, const CocoImage& image) {
  if (segmentation.rle) return *segmentation.rle;
  std::vector<Rle> parts;
  for (const auto& polygon : segmentation.polygons) {
    parts.push_back(rle_from_polygon(polygon, image.height, image.width));
  }
  if (parts.empty()) {
    return rle_encode(std::vector<std::uint8_t>(static_cast<std::size_t>(image.height * image.width)),
                      image.height, image.width);
  }
  return rle_union(parts);
}

std::string detections_to_json(const std::vector<CocoDetection>& detections) {
  json list = json::array();
  for (const auto& d : detections) list.push_back(detection_json(d));
  return list.dump();
}

std::vector<CocoDetection> detections_from_json(const std::string& text) {
  const json list = json::parse(text);
  std::vector<CocoDetection> out;
  for (const auto& d : list) {
    CocoDetection det;
    det.image_id = d.at("image_id").get<std::int64_t>();
    det.category_id = d.at("category_id").get<std::int64_t>();
    det.bbox = d.at("bbox").get<std::array<double, 4>>();
    det.score = d.at("score").get<double>();
    const json& s = d.at("segmentation");
    det.mask = rle_from_string(s.at("counts").get<std::string>(), s.at("size")[0].get<std::int64_t>(),
                               s.at("size")[1].get<std::int64_t>());
    out.push_back(std::move(det));
  }
  return out;
}

void write_coco_detections(const std::vector<CocoDetection>& detections, const fs::path& file) {
  json list = json::array();
  for (const auto& d : detections) list.push_back(detection_json(d));
  write_file(file, list);
}

std::vector<EvalDetection> read_coco_results(const fs::path& file,
                                             const CocoAnnotations& ground_truth) {
  const json results = parse_file(file);
  if (!results.is_array()) fail(file, "a results file must be a JSON list of detections");
  std::map<std::int64_t, const CocoImage*> images;
  for (const auto& i : ground_truth.images) images[i.id] = &i;
  std::vector<EvalDetection> out;
  if (results.empty()) return out;
  // pycocotools decides from the first result whether boxes or masks define the results.
  const bool boxes = results[0].is_object() && results[0].contains("bbox") &&
                     !(results[0]["bbox"].is_array() && results[0]["bbox"].empty());
  for (std::size_t i = 0; i < results.size(); ++i) {
    Reader r{file, "result " + std::to_string(i)};
    const json& res = results[i];
    EvalDetection d;
    d.image_id = r.integer_field(res, "image_id");
    const auto image = images.find(d.image_id);
    if (image == images.end()) {
      r.fail("is on image_id " + std::to_string(d.image_id) +
             ", which the ground truth does not list");
    }
    d.category_id = r.integer_field(res, "category_id");
    d.score = r.number(r.field(res, "score"), "score");
    const CocoImage& img = *image->second;
    if (boxes) {
      d.bbox = r.box(r.field(res, "bbox"));
      d.area = d.bbox[2] * d.bbox[3];
      if (res.contains("segmentation")) {
        d.mask = segmentation_mask(r.segmentation(res["segmentation"], img), img);
      } else {
        const double x1 = d.bbox[0], y1 = d.bbox[1], x2 = x1 + d.bbox[2], y2 = y1 + d.bbox[3];
        const std::vector<double> corners = {x1, y1, x1, y2, x2, y2, x2, y1};
        d.mask = rle_from_polygon(corners, img.height, img.width);
      }
    } else {
      d.mask = segmentation_mask(r.segmentation(r.field(res, "segmentation"), img), img);
      d.area = static_cast<double>(rle_area(d.mask));
      d.bbox = res.contains("bbox") ? r.box(res["bbox"]) : rle_bbox(d.mask);
    }
    out.push_back(std::move(d));
  }
  return out;
}

EvalInput make_eval_input(const CocoAnnotations& ground_truth,
                          std::vector<EvalDetection> detections) {
  EvalInput input;
  std::map<std::int64_t, const CocoImage*> images;
  for (const auto& i : ground_truth.images) {
    input.image_ids.push_back(i.id);
    images[i.id] = &i;
  }
  for (const auto& c : ground_truth.categories) input.category_ids.push_back(c.id);
  for (const auto& a : ground_truth.annotations) {
    EvalGroundTruth g;
    g.id = a.id;
    g.image_id = a.image_id;
    g.category_id = a.category_id;
    g.bbox = a.bbox;
    g.area = a.area;
    g.iscrowd = a.iscrowd;
    g.mask = segmentation_mask(a.segmentation, *images.at(a.image_id));
    input.ground_truth.push_back(std::move(g));
  }
  input.detections = std::move(detections);
  return input;
}

std::vector<std::pair<IouType, CocoStats>> evaluate_files(const fs::path& ground_truth_file,
                                                          const fs::path& results_file) {
  const CocoAnnotations gt = read_coco_annotations(ground_truth_file);
  const EvalInput input = make_eval_input(gt, read_coco_results(results_file, gt));
  return {{IouType::bbox, evaluate(input, IouType::bbox)},
          {IouType::segm, evaluate(input, IouType::segm)}};
}

void write_stats_json(const std::vector<std::pair<IouType, CocoStats>>& stats,
                      const fs::path& file) {
  json out = {{"order",
               {"AP", "AP50", "AP75", "APs", "APm", "APl", "AR1", "AR10", "AR100", "ARs", "ARm",
                "ARl"}}};
  for (const auto& [type, s] : stats) out[to_string(type)] = s.values;
  write_file(file, out);
}

}  // namespace mask_rcnn
