#include "visualize.hpp"

#include <stb_easy_font.h>
#include <stb_image_write.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <stdexcept>

namespace mask_rcnn {
namespace {

constexpr std::array<std::array<std::uint8_t, 3>, 8> palette = {{{230, 25, 75},
                                                                 {60, 180, 75},
                                                                 {0, 130, 200},
                                                                 {245, 130, 48},
                                                                 {145, 30, 180},
                                                                 {70, 240, 240},
                                                                 {240, 50, 230},
                                                                 {210, 245, 60}}};

struct Canvas {
  std::int64_t height, width;
  std::uint8_t* pixels;  // [height][width][3]

  void blend(std::int64_t x, std::int64_t y, const std::array<std::uint8_t, 3>& colour, double alpha) {
    if (x < 0 || y < 0 || x >= width || y >= height) return;
    auto* p = pixels + 3 * (y * width + x);
    for (int c = 0; c < 3; ++c) {
      p[c] = static_cast<std::uint8_t>(std::lround((1 - alpha) * p[c] + alpha * colour[static_cast<std::size_t>(c)]));
    }
  }

  void rectangle(std::int64_t x0, std::int64_t y0, std::int64_t x1, std::int64_t y1,
                 const std::array<std::uint8_t, 3>& colour) {
    for (auto x = x0; x <= x1; ++x) {
      blend(x, y0, colour, 1);
      blend(x, y1, colour, 1);
    }
    for (auto y = y0; y <= y1; ++y) {
      blend(x0, y, colour, 1);
      blend(x1, y, colour, 1);
    }
  }

  // stb_easy_font's quads, on a dark backing so the text reads on any background.
  void text(std::int64_t x, std::int64_t y, const std::string& s, const std::array<std::uint8_t, 3>& colour) {
    std::array<char, 8000> buffer{};
    const int quads = stb_easy_font_print(0, 0, const_cast<char*>(s.c_str()), nullptr, buffer.data(),
                                          static_cast<int>(buffer.size()));
    const int text_width = stb_easy_font_width(const_cast<char*>(s.c_str()));
    for (std::int64_t yy = y - 1; yy < y + 8; ++yy)
      for (std::int64_t xx = x - 1; xx < x + text_width + 1; ++xx) blend(xx, yy, {0, 0, 0}, 0.6);
    const auto* vertices = reinterpret_cast<const float*>(buffer.data());
    for (int q = 0; q < quads; ++q) {
      const float* v = vertices + q * 16;  // 4 vertices of (x, y, z, colour)
      const auto qx0 = static_cast<std::int64_t>(v[0]), qy0 = static_cast<std::int64_t>(v[1]);
      const auto qx1 = static_cast<std::int64_t>(v[8]), qy1 = static_cast<std::int64_t>(v[9]);
      for (auto yy = qy0; yy < qy1; ++yy)
        for (auto xx = qx0; xx < qx1; ++xx) blend(x + xx, y + yy, colour, 1);
    }
  }
};

}  // namespace

torch::Tensor draw_detections(const DrawnImage& item, const std::vector<std::string>& class_names) {
  auto rgb = (item.image.detach().to(torch::kCPU, torch::kFloat).clamp(0, 1) * 255)
                 .round()
                 .to(torch::kUInt8)
                 .permute({1, 2, 0})
                 .contiguous();
  Canvas canvas{rgb.size(0), rgb.size(1), rgb.data_ptr<std::uint8_t>()};
  const auto masks = item.masks.to(torch::kCPU).contiguous();
  const auto boxes = item.boxes.detach().to(torch::kCPU, torch::kFloat).contiguous();
  const auto labels = item.labels.to(torch::kCPU, torch::kLong).contiguous();
  const auto scores = item.scores.detach().to(torch::kCPU, torch::kFloat).contiguous();
  const auto n = labels.size(0);
  // Lowest score first, so the best detections end on top.
  for (std::int64_t i = n - 1; i >= 0; --i) {
    const auto label = labels.data_ptr<std::int64_t>()[i];
    const auto& colour = palette[static_cast<std::size_t>(label - 1) % palette.size()];
    const auto* mask = masks[i].data_ptr<bool>();
    for (std::int64_t y = 0; y < canvas.height; ++y)
      for (std::int64_t x = 0; x < canvas.width; ++x)
        if (mask[y * canvas.width + x]) canvas.blend(x, y, colour, 0.55);
  }
  for (std::int64_t i = n - 1; i >= 0; --i) {
    const auto label = labels.data_ptr<std::int64_t>()[i];
    const auto& colour = palette[static_cast<std::size_t>(label - 1) % palette.size()];
    const float* b = boxes.data_ptr<float>() + 4 * i;
    const auto x0 = static_cast<std::int64_t>(b[0]), y0 = static_cast<std::int64_t>(b[1]);
    canvas.rectangle(x0, y0, static_cast<std::int64_t>(b[2]) - 1, static_cast<std::int64_t>(b[3]) - 1, colour);
    const auto name = label - 1 < static_cast<std::int64_t>(class_names.size())
                          ? class_names[static_cast<std::size_t>(label - 1)]
                          : std::to_string(label);
    char caption[96];
    std::snprintf(caption, sizeof caption, "%s %.2f", name.c_str(), scores.data_ptr<float>()[i]);
    canvas.text(x0 + 1, std::max<std::int64_t>(1, y0 - 9), caption, {255, 255, 255});
  }
  return rgb;
}

void write_detections_png(const std::filesystem::path& file, const std::vector<DrawnImage>& items,
                          const std::vector<std::string>& class_names, std::int64_t columns) {
  constexpr std::int64_t gap = 4;
  std::vector<torch::Tensor> drawn;
  for (const auto& item : items) drawn.push_back(draw_detections(item, class_names));
  if (drawn.empty()) throw std::runtime_error(file.string() + ": no images to draw");
  const auto count = static_cast<std::int64_t>(drawn.size());
  const auto cols = std::min(columns, count);
  const auto rows = (count + cols - 1) / cols;
  std::vector<std::int64_t> row_height(static_cast<std::size_t>(rows), 0),
      col_width(static_cast<std::size_t>(cols), 0);
  for (std::int64_t i = 0; i < count; ++i) {
    auto& rh = row_height[static_cast<std::size_t>(i / cols)];
    auto& cw = col_width[static_cast<std::size_t>(i % cols)];
    rh = std::max(rh, drawn[static_cast<std::size_t>(i)].size(0));
    cw = std::max(cw, drawn[static_cast<std::size_t>(i)].size(1));
  }
  std::int64_t height = gap, width = gap;
  for (const auto h : row_height) height += h + gap;
  for (const auto w : col_width) width += w + gap;
  auto sheet = torch::full({height, width, 3}, 255, torch::kUInt8);
  std::int64_t y = gap;
  for (std::int64_t r = 0; r < rows; ++r) {
    std::int64_t x = gap;
    for (std::int64_t c = 0; c < cols && r * cols + c < count; ++c) {
      const auto& d = drawn[static_cast<std::size_t>(r * cols + c)];
      sheet.narrow(0, y, d.size(0)).narrow(1, x, d.size(1)).copy_(d);
      x += col_width[static_cast<std::size_t>(c)] + gap;
    }
    y += row_height[static_cast<std::size_t>(r)] + gap;
  }
  if (file.has_parent_path()) std::filesystem::create_directories(file.parent_path());
  if (!stbi_write_png(file.string().c_str(), static_cast<int>(width), static_cast<int>(height), 3,
                      sheet.data_ptr<std::uint8_t>(), static_cast<int>(width * 3))) {
    throw std::runtime_error(file.string() + ": cannot write the PNG");
  }
}

}  // namespace mask_rcnn
