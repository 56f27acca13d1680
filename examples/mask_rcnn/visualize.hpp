#pragma once
// Predictions drawn over their images: each mask tinted in its class's colour, its box outlined,
// and "name score" written above it; several images side by side in one PNG.

#include <torch/torch.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace mask_rcnn {

struct DrawnImage {
  torch::Tensor image;   // [3, H, W] float RGB in [0, 1]
  torch::Tensor masks;   // [D, H, W] bool
  torch::Tensor boxes;   // [D, 4] (x1, y1, x2, y2) in the image's pixels
  torch::Tensor labels;  // [D] int64, 1 .. K
  torch::Tensor scores;  // [D]
};

// Draws into a copy of the image: uint8 [H, W, 3].
torch::Tensor draw_detections(const DrawnImage& item, const std::vector<std::string>& class_names);

// Draws every item and writes them in a grid (at most `columns` per row, 4-pixel gaps) as a PNG.
// Throws std::runtime_error naming the file if it cannot be written.
void write_detections_png(const std::filesystem::path& file, const std::vector<DrawnImage>& items,
                          const std::vector<std::string>& class_names, std::int64_t columns = 4);

}  // namespace mask_rcnn
