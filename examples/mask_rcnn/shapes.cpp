#include "shapes.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <numbers>

namespace mask_rcnn {
namespace {

// SplitMix64 with our own uniform draws: the same images from the same seed with any compiler
// and standard library (std::uniform_*_distribution may differ between them).
class Random {
 public:
  explicit Random(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
  std::int64_t integer(std::int64_t lo, std::int64_t hi) {  // inclusive
    return lo + static_cast<std::int64_t>(next() % static_cast<std::uint64_t>(hi - lo + 1));
  }

 private:
  std::uint64_t state_;
};

Random image_random(const ShapesOptions& options, std::int64_t index) {
  Random mix(options.seed * 0x2545f4914f6cdd1dULL + static_cast<std::uint64_t>(index));
  return Random(mix.next());
}

std::pair<std::int64_t, std::int64_t> draw_size(const ShapesOptions& options, Random& random) {
  const auto steps = (options.max_side - options.min_side) / 16;
  const auto h = options.min_side + 16 * random.integer(0, steps);
  const auto w = options.min_side + 16 * random.integer(0, steps);
  return {h, w};
}

enum Shape : std::int64_t { circle = 1, square = 2, triangle = 3 };

struct Object {
  Shape shape;
  double cx, cy, size;
  std::array<double, 3> colour;
};

// Whether the pixel centre (px, py) lies inside the object.
bool inside(const Object& o, double px, double py) {
  const double dx = px - o.cx, dy = py - o.cy, r = o.size / 2;
  switch (o.shape) {
    case circle: return dx * dx + dy * dy <= r * r;
    case square: return std::abs(dx) <= r && std::abs(dy) <= r;
    case triangle: {
      // Upright equilateral triangle of side `size`, centred on its bounding box.
      const double h = o.size * std::numbers::sqrt3 / 2;
      const double top = -h / 2, bottom = h / 2;
      if (dy < top || dy > bottom) return false;
      const double half_width = (dy - top) / h * r;
      return std::abs(dx) <= half_width;
    }
  }
  return false;
}

std::vector<std::uint8_t> rasterize(const Object& o, std::int64_t height, std::int64_t width) {
  std::vector<std::uint8_t> mask(static_cast<std::size_t>(height * width), 0);
  const auto r = o.size / 2 + 1;
  const auto x0 = std::max<std::int64_t>(0, static_cast<std::int64_t>(o.cx - r));
  const auto x1 = std::min<std::int64_t>(width, static_cast<std::int64_t>(o.cx + r) + 1);
  const auto y0 = std::max<std::int64_t>(0, static_cast<std::int64_t>(o.cy - r));
  const auto y1 = std::min<std::int64_t>(height, static_cast<std::int64_t>(o.cy + r) + 1);
  for (auto y = y0; y < y1; ++y)
    for (auto x = x0; x < x1; ++x)
      mask[static_cast<std::size_t>(y * width + x)] = inside(o, x + 0.5, y + 0.5) ? 1 : 0;
  return mask;
}

std::int64_t count(const std::vector<std::uint8_t>& mask) {
  return std::count(mask.begin(), mask.end(), std::uint8_t{1});
}

double distance(const std::array<double, 3>& a, const std::array<double, 3>& b) {
  return std::sqrt((a[0] - b[0]) * (a[0] - b[0]) + (a[1] - b[1]) * (a[1] - b[1]) +
                   (a[2] - b[2]) * (a[2] - b[2]));
}

}  // namespace

ShapesImage generate_shapes_image(const ShapesOptions& options, std::int64_t index) {
  Random random = image_random(options, index);
  ShapesImage out;
  std::tie(out.height, out.width) = draw_size(options, random);
  const auto h = out.height, w = out.width;
  const double side = static_cast<double>(std::min(h, w));

  const std::array<double, 3> background = {random.uniform(0, 255), random.uniform(0, 255),
                                            random.uniform(0, 255)};
  const double angle = random.uniform(0, 2 * std::numbers::pi);
  const double shading = random.uniform(0, 60);

  std::vector<Object> objects;
  std::vector<std::vector<std::uint8_t>> full, visible;
  const auto wanted = random.integer(1, options.max_objects);
  for (std::int64_t n = 0; n < wanted; ++n) {
    for (int attempt = 0; attempt < 20; ++attempt) {
      Object o;
      o.shape = static_cast<Shape>(random.integer(1, 3));
      o.size = random.uniform(options.min_object, options.max_object) * side;
      o.cx = random.uniform(o.size / 2, static_cast<double>(w) - o.size / 2);
      o.cy = random.uniform(o.size / 2, static_cast<double>(h) - o.size / 2);
      o.colour = {random.uniform(0, 255), random.uniform(0, 255), random.uniform(0, 255)};
      bool distinct = distance(o.colour, background) >= 100;
      for (const auto& other : objects) distinct = distinct && distance(o.colour, other.colour) >= 80;
      if (!distinct) continue;
      auto mask = rasterize(o, h, w);
      if (count(mask) < 30) continue;
      // Accepted only if every earlier object keeps enough of itself in view.
      bool keeps_others = true;
      std::vector<std::vector<std::uint8_t>> after = visible;
      for (std::size_t j = 0; j < after.size() && keeps_others; ++j) {
        for (std::size_t p = 0; p < mask.size(); ++p)
          if (mask[p]) after[j][p] = 0;
        keeps_others = static_cast<double>(count(after[j])) >=
                       options.min_visible * static_cast<double>(count(full[j]));
      }
      if (!keeps_others) continue;
      visible = std::move(after);
      visible.push_back(mask);
      full.push_back(std::move(mask));
      objects.push_back(o);
      break;
    }
  }

  out.rgb.resize(static_cast<std::size_t>(h * w * 3));
  const double cos_a = std::cos(angle), sin_a = std::sin(angle);
  const double extent = static_cast<double>(std::max(h, w));
  for (std::int64_t y = 0; y < h; ++y) {
    for (std::int64_t x = 0; x < w; ++x) {
      const auto p = static_cast<std::size_t>(y * w + x);
      std::array<double, 3> c = background;
      const double shade = shading * ((x * cos_a + y * sin_a) / extent - 0.5);
      for (auto& v : c) v += shade;
      for (std::size_t k = 0; k < objects.size(); ++k) {
        if (full[k][p]) c = objects[k].colour;
      }
      for (std::size_t ch = 0; ch < 3; ++ch) {
        const double noisy = c[ch] + random.uniform(-12, 12);
        out.rgb[3 * p + ch] = static_cast<std::uint8_t>(std::clamp(std::lround(noisy), 0L, 255L));
      }
    }
  }
  for (std::size_t k = 0; k < objects.size(); ++k) {
    out.labels.push_back(objects[k].shape);
    out.masks.push_back(std::move(visible[k]));
  }
  return out;
}

ShapesDataset::ShapesDataset(ShapesOptions options) : options_(options) {
  if (options.count < 1) throw DatasetError("shapes: the number of images must be >= 1");
  if (options.min_side < 32 || options.max_side < options.min_side) {
    throw DatasetError("shapes: image sides must satisfy 32 <= min_side <= max_side, got " +
                       std::to_string(options.min_side) + " and " + std::to_string(options.max_side));
  }
  if (options.max_objects < 1 || !(options.min_object > 0) || options.max_object < options.min_object ||
      options.max_object > 1) {
    throw DatasetError("shapes: need max_objects >= 1 and 0 < min_object <= max_object <= 1");
  }
  categories_ = {{1, "circle"}, {2, "square"}, {3, "triangle"}};
}

std::pair<std::int64_t, std::int64_t> ShapesDataset::image_size(std::int64_t index) const {
  Random random = image_random(options_, index);
  return draw_size(options_, random);
}

DetectionSample ShapesDataset::get(std::int64_t index) const {
  ShapesImage g = generate_shapes_image(options_, index);
  DetectionSample s;
  s.image_id = index + 1;
  s.original_height = g.height;
  s.original_width = g.width;
  s.image = torch::from_blob(g.rgb.data(), {g.height, g.width, 3}, torch::kUInt8)
                .permute({2, 0, 1})
                .to(torch::kFloat)
                .div_(255.0);
  const auto n = static_cast<std::int64_t>(g.labels.size());
  s.targets.labels = torch::tensor(g.labels, torch::kLong);
  s.targets.masks = torch::empty({n, g.height, g.width}, torch::kUInt8);
  std::vector<float> boxes;
  for (std::int64_t i = 0; i < n; ++i) {
    auto& mask = g.masks[static_cast<std::size_t>(i)];
    std::copy(mask.begin(), mask.end(), s.targets.masks[i].data_ptr<std::uint8_t>());
    const auto b = rle_bbox(rle_encode(mask, g.height, g.width));
    for (const double v : {b[0], b[1], b[0] + b[2], b[1] + b[3]}) boxes.push_back(static_cast<float>(v));
  }
  s.targets.boxes = torch::tensor(boxes, torch::kFloat).view({n, 4});
  return s;
}

CocoAnnotations ShapesDataset::ground_truth(const std::vector<std::int64_t>& indices) const {
  CocoAnnotations gt;
  for (const auto& c : categories_) gt.categories.push_back({c.id, c.name});
  std::int64_t next_id = 1;
  for (const auto index : indices) {
    ShapesImage g = generate_shapes_image(options_, index);
    gt.images.push_back({index + 1, "shapes_" + std::to_string(index) + ".png", g.width, g.height});
    for (std::size_t k = 0; k < g.labels.size(); ++k) {
      CocoAnnotation a;
      a.id = next_id++;
      a.image_id = index + 1;
      a.category_id = g.labels[k];
      const Rle rle = rle_encode(g.masks[k], g.height, g.width);
      a.bbox = rle_bbox(rle);
      a.area = static_cast<double>(rle_area(rle));
      a.segmentation.rle = rle;
      a.segmentation.compressed = true;
      gt.annotations.push_back(std::move(a));
    }
  }
  return gt;
}

}  // namespace mask_rcnn
