#include "rle.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <stdexcept>

namespace mask_rcnn {
namespace {

std::uint64_t pixels(std::int64_t height, std::int64_t width) {
  return static_cast<std::uint64_t>(height) * static_cast<std::uint64_t>(width);
}

void check_sum(const std::vector<std::uint32_t>& counts, std::int64_t height, std::int64_t width,
               std::string_view what) {
  std::uint64_t total = 0;
  for (const auto c : counts) total += c;
  if (total != pixels(height, width)) {
    throw std::invalid_argument(std::string(what) + ": the runs cover " + std::to_string(total) +
                                " pixels but the mask has " + std::to_string(height) + " x " +
                                std::to_string(width) + " = " +
                                std::to_string(pixels(height, width)));
  }
}

// Walks two masks' runs together, calling visit(length, in_a, in_b) for every stretch on which
// neither changes.
template <class Visit>
void walk_runs(const Rle& a, const Rle& b, Visit&& visit) {
  std::size_t ia = 0, ib = 0;
  std::uint64_t left_a = a.counts.empty() ? 0 : a.counts[0];
  std::uint64_t left_b = b.counts.empty() ? 0 : b.counts[0];
  auto advance = [](const Rle& r, std::size_t& i, std::uint64_t& left) {
    while (left == 0 && i + 1 < r.counts.size()) left = r.counts[++i];
  };
  advance(a, ia, left_a);
  advance(b, ib, left_b);
  while (left_a > 0 && left_b > 0) {
    const auto step = std::min(left_a, left_b);
    visit(step, ia % 2 == 1, ib % 2 == 1);
    left_a -= step;
    left_b -= step;
    advance(a, ia, left_a);
    advance(b, ib, left_b);
  }
}

}  // namespace

Rle rle_encode(std::span<const std::uint8_t> mask, std::int64_t height, std::int64_t width) {
  if (mask.size() != pixels(height, width)) {
    throw std::invalid_argument("rle_encode: mask has " + std::to_string(mask.size()) +
                                " values, expected " + std::to_string(height) + " x " +
                                std::to_string(width));
  }
  Rle rle{height, width, {}};
  bool inside = false;
  std::uint32_t run = 0;
  for (std::int64_t x = 0; x < width; ++x) {
    for (std::int64_t y = 0; y < height; ++y) {
      const bool value = mask[static_cast<std::size_t>(y * width + x)] != 0;
      if (value != inside) {
        rle.counts.push_back(run);
        run = 0;
        inside = value;
      }
      ++run;
    }
  }
  rle.counts.push_back(run);
  return rle;
}

std::vector<std::uint8_t> rle_decode(const Rle& rle) {
  std::vector<std::uint8_t> mask(pixels(rle.height, rle.width), 0);
  std::uint64_t position = 0;
  for (std::size_t i = 0; i < rle.counts.size(); ++i) {
    const auto end = std::min<std::uint64_t>(position + rle.counts[i], mask.size());
    if (i % 2 == 1) {
      for (auto p = position; p < end; ++p) {
        const auto x = static_cast<std::int64_t>(p) / rle.height;
        const auto y = static_cast<std::int64_t>(p) % rle.height;
        mask[static_cast<std::size_t>(y * rle.width + x)] = 1;
      }
    }
    position = end;
  }
  return mask;
}

std::uint64_t rle_area(const Rle& rle) {
  std::uint64_t area = 0;
  for (std::size_t i = 1; i < rle.counts.size(); i += 2) area += rle.counts[i];
  return area;
}

std::array<double, 4> rle_bbox(const Rle& rle) {
  if (rle.height <= 0) return {0, 0, 0, 0};
  const auto h = static_cast<std::uint64_t>(rle.height);
  std::uint64_t x_min = UINT64_MAX, x_max = 0, y_min = UINT64_MAX, y_max = 0;
  std::uint64_t position = 0;
  for (std::size_t i = 0; i < rle.counts.size(); ++i) {
    const std::uint64_t run = rle.counts[i];
    if (i % 2 == 1 && run > 0) {
      const auto first = position, last = position + run - 1;
      const auto x0 = first / h, x1 = last / h;
      x_min = std::min(x_min, x0);
      x_max = std::max(x_max, x1);
      if (x0 == x1) {
        y_min = std::min(y_min, first % h);
        y_max = std::max(y_max, last % h);
      } else {  // the run wraps into the next column: it touches the top and the bottom row
        y_min = 0;
        y_max = h - 1;
      }
    }
    position += run;
  }
  if (x_min == UINT64_MAX) return {0, 0, 0, 0};
  return {static_cast<double>(x_min), static_cast<double>(y_min),
          static_cast<double>(x_max - x_min + 1), static_cast<double>(y_max - y_min + 1)};
}

Rle rle_union(std::span<const Rle> masks) {
  if (masks.empty()) return {};
  Rle result = masks[0];
  for (std::size_t k = 1; k < masks.size(); ++k) {
    const Rle& other = masks[k];
    if (other.height != result.height || other.width != result.width) {
      throw std::invalid_argument("rle_union: masks of different sizes (" +
                                  std::to_string(result.height) + "x" +
                                  std::to_string(result.width) + " and " +
                                  std::to_string(other.height) + "x" +
                                  std::to_string(other.width) + ")");
    }
    Rle merged{result.height, result.width, {}};
    bool inside = false;
    std::uint32_t run = 0;
    walk_runs(result, other, [&](std::uint64_t length, bool a, bool b) {
      if ((a || b) != inside) {
        merged.counts.push_back(run);
        run = 0;
        inside = !inside;
      }
      run += static_cast<std::uint32_t>(length);
    });
    merged.counts.push_back(run);
    result = std::move(merged);
  }
  return result;
}

std::string rle_to_string(const Rle& rle) {
  std::string out;
  for (std::size_t i = 0; i < rle.counts.size(); ++i) {
    std::int64_t value = rle.counts[i];
    if (i > 2) value -= rle.counts[i - 2];
    // Little-endian groups of 5 bits, sign-extended from the last group's high bit; bit 0x20 of
    // a character says another group follows.
    for (bool more = true; more;) {
      int group = static_cast<int>(value & 0x1f);
      value >>= 5;
      more = (group & 0x10) != 0 ? value != -1 : value != 0;
      if (more) group |= 0x20;
      out.push_back(static_cast<char>(group + 48));
    }
  }
  return out;
}

Rle rle_from_string(std::string_view counts, std::int64_t height, std::int64_t width) {
  Rle rle{height, width, {}};
  std::size_t p = 0;
  while (p < counts.size()) {
    std::int64_t value = 0;
    int shift = 0;
    for (bool more = true; more; shift += 5) {
      if (p >= counts.size()) {
        throw std::invalid_argument("compressed RLE counts end in the middle of a number");
      }
      const int c = static_cast<unsigned char>(counts[p++]) - 48;
      if (c < 0 || c > 63) {
        throw std::invalid_argument("compressed RLE counts contain '" +
                                    std::string(1, counts[p - 1]) +
                                    "', which is not in COCO's alphabet ('0' to 'o')");
      }
      if (shift > 55) throw std::invalid_argument("compressed RLE counts hold a number too large");
      value |= static_cast<std::int64_t>(c & 0x1f) << shift;
      more = (c & 0x20) != 0;
      if (!more && (c & 0x10) != 0) value |= -(std::int64_t{1} << (shift + 5));
    }
    if (rle.counts.size() > 2) value += rle.counts[rle.counts.size() - 2];
    if (value < 0 || value > UINT32_MAX) {
      throw std::invalid_argument("compressed RLE counts decode to a run of " +
                                  std::to_string(value) + " pixels");
    }
    rle.counts.push_back(static_cast<std::uint32_t>(value));
  }
  check_sum(rle.counts, height, width, "compressed RLE");
  return rle;
}

Rle rle_from_counts(std::vector<std::uint32_t> counts, std::int64_t height, std::int64_t width) {
  check_sum(counts, height, width, "RLE counts");
  return Rle{height, width, std::move(counts)};
}

// Note [Polygon rasterization]
// The COCO API (maskApi.c, rleFrPoly) scales the vertices by 5 and rounds them, walks every edge
// one fine-grid step at a time along its longer axis, and wherever the walk crosses from one fine
// column to the next at the centre of a pixel column, it records where along that column the
// pixels start or stop being inside (the crossing's y, mapped back to pixels and rounded up). The
// recorded positions, in column-major order, are the toggles of the run-length encoding; two
// toggles at the same position cancel. The rounding and the casts below follow that procedure
// step for step so that our masks equal pycocotools' pixel for pixel.
Rle rle_from_polygon(std::span<const double> xy, std::int64_t height, std::int64_t width) {
  if (xy.size() < 6 || xy.size() % 2 != 0) {
    throw std::invalid_argument("a polygon needs an even number of coordinates and at least 3 "
                                "points (6 numbers), got " + std::to_string(xy.size()) +
                                " numbers");
  }
  constexpr double scale = 5.0;
  const std::size_t n = xy.size() / 2;
  std::vector<int> fx(n + 1), fy(n + 1);
  for (std::size_t j = 0; j < n; ++j) {
    fx[j] = static_cast<int>(scale * xy[2 * j] + 0.5);
    fy[j] = static_cast<int>(scale * xy[2 * j + 1] + 0.5);
  }
  fx[n] = fx[0];
  fy[n] = fy[0];

  // Fine-grid points along the closed outline, in order.
  std::vector<int> u, v;
  for (std::size_t j = 0; j < n; ++j) {
    int xs = fx[j], xe = fx[j + 1], ys = fy[j], ye = fy[j + 1];
    const int dx = std::abs(xe - xs), dy = std::abs(ys - ye);
    const bool along_x = dx >= dy;
    const bool flip = (along_x && xs > xe) || (!along_x && ys > ye);
    if (flip) {
      std::swap(xs, xe);
      std::swap(ys, ye);
    }
    if (dx == 0 && dy == 0) {  // a repeated vertex: one point, the vertex itself
      u.push_back(xs);
      v.push_back(ys);
      continue;
    }
    const double slope = along_x ? static_cast<double>(ye - ys) / dx
                                 : static_cast<double>(xe - xs) / dy;
    const int steps = along_x ? dx : dy;
    for (int d = 0; d <= steps; ++d) {
      const int t = flip ? steps - d : d;
      if (along_x) {
        u.push_back(t + xs);
        v.push_back(static_cast<int>(ys + slope * t + 0.5));
      } else {
        v.push_back(t + ys);
        u.push_back(static_cast<int>(xs + slope * t + 0.5));
      }
    }
  }

  // Crossings between fine columns that sit on a pixel column's centre.
  std::vector<std::uint32_t> toggles;
  for (std::size_t j = 1; j < u.size(); ++j) {
    if (u[j] == u[j - 1]) continue;
    double xd = u[j] < u[j - 1] ? u[j] : u[j] - 1;
    xd = (xd + 0.5) / scale - 0.5;
    if (std::floor(xd) != xd || xd < 0 || xd > static_cast<double>(width - 1)) continue;
    double yd = std::min(v[j], v[j - 1]);
    yd = (yd + 0.5) / scale - 0.5;
    yd = std::ceil(std::clamp(yd, 0.0, static_cast<double>(height)));
    toggles.push_back(static_cast<std::uint32_t>(static_cast<int>(xd) * static_cast<int>(height) +
                                                 static_cast<int>(yd)));
  }
  toggles.push_back(static_cast<std::uint32_t>(pixels(height, width)));
  std::sort(toggles.begin(), toggles.end());

  Rle rle{height, width, {}};
  std::uint32_t previous = 0;
  bool merge_next = false;
  for (std::size_t j = 0; j < toggles.size(); ++j) {
    const std::uint32_t run = toggles[j] - previous;
    previous = toggles[j];
    if (merge_next) {  // the two toggles before this run cancelled: extend the last run
      rle.counts.back() += run;
      merge_next = false;
    } else if (run > 0 || j == 0) {
      rle.counts.push_back(run);
    } else {
      merge_next = true;
    }
  }
  return rle;
}

double rle_iou(const Rle& detection, const Rle& ground_truth, bool crowd) {
  if (detection.height != ground_truth.height || detection.width != ground_truth.width) {
    throw std::invalid_argument("rle_iou: masks of different sizes (" +
                                std::to_string(detection.height) + "x" +
                                std::to_string(detection.width) + " and " +
                                std::to_string(ground_truth.height) + "x" +
                                std::to_string(ground_truth.width) + ")");
  }
  std::uint64_t intersection = 0, union_area = 0;
  walk_runs(detection, ground_truth, [&](std::uint64_t length, bool a, bool b) {
    if (a || b) union_area += length;
    if (a && b) intersection += length;
  });
  if (intersection == 0) return 0.0;
  if (crowd) union_area = rle_area(detection);
  return static_cast<double>(intersection) / static_cast<double>(union_area);
}

double box_iou_xywh(const std::array<double, 4>& d, const std::array<double, 4>& g, bool crowd) {
  // The same operations in the same order as the COCO API, so the doubles agree exactly.
  const double w = std::fmin(d[2] + d[0], g[2] + g[0]) - std::fmax(d[0], g[0]);
  if (w <= 0) return 0.0;
  const double h = std::fmin(d[3] + d[1], g[3] + g[1]) - std::fmax(d[1], g[1]);
  if (h <= 0) return 0.0;
  const double intersection = w * h;
  const double detection_area = d[2] * d[3];
  const double union_area =
      crowd ? detection_area : detection_area + g[2] * g[3] - intersection;
  return intersection / union_area;
}

}  // namespace mask_rcnn
