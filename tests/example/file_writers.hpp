#pragma once
// Writers for the small dataset files the example's tests load: IDX (optionally gzip'd), CIFAR-10
// binary records, PNG and PPM images. Written independently of the loaders, from the formats'
// specifications, so a loader bug cannot cancel out a writer bug.

#include <zlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <vector>

namespace resnet::test {

using Bytes = std::vector<std::uint8_t>;

inline void write_file(const std::filesystem::path& file, const Bytes& bytes) {
  std::filesystem::create_directories(file.parent_path());
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + file.string());
}

inline void write_gzip(const std::filesystem::path& file, const Bytes& bytes) {
  std::filesystem::create_directories(file.parent_path());
  gzFile gz = gzopen(file.c_str(), "wb");
  if (gz == nullptr) throw std::runtime_error("cannot open " + file.string());
  const int written = gzwrite(gz, bytes.data(), static_cast<unsigned>(bytes.size()));
  if (gzclose(gz) != Z_OK || written != static_cast<int>(bytes.size())) {
    throw std::runtime_error("cannot write " + file.string());
  }
}

inline void append_be32(Bytes& out, std::uint32_t value) {
  for (int shift = 24; shift >= 0; shift -= 8)
    out.push_back(static_cast<std::uint8_t>(value >> shift));
}

// IDX: magic 0x000008<ndims> (unsigned bytes), big-endian dimensions, then the payload.
inline Bytes idx(std::initializer_list<std::uint32_t> dims, const Bytes& payload) {
  Bytes out;
  append_be32(out, 0x00000800u | static_cast<std::uint32_t>(dims.size()));
  for (auto d : dims) append_be32(out, d);
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

// One CIFAR-10 record: the label byte, then the red, green and blue 32x32 planes.
inline void append_cifar_record(Bytes& out, std::uint8_t label, std::uint8_t red,
                                std::uint8_t green, std::uint8_t blue) {
  out.push_back(label);
  out.insert(out.end(), 1024, red);
  out.insert(out.end(), 1024, green);
  out.insert(out.end(), 1024, blue);
}

// Binary PPM (P6) from row-major RGB pixels.
inline Bytes ppm(std::uint32_t width, std::uint32_t height, const Bytes& rgb) {
  const std::string header =
      "P6\n" + std::to_string(width) + " " + std::to_string(height) + "\n255\n";
  Bytes out(header.begin(), header.end());
  out.insert(out.end(), rgb.begin(), rgb.end());
  return out;
}

// An 8-bit RGB PNG (colour type 2, no interlace) from row-major RGB pixels.
inline Bytes png(std::uint32_t width, std::uint32_t height, const Bytes& rgb) {
  auto chunk = [](Bytes& out, const char* type, const Bytes& data) {
    append_be32(out, static_cast<std::uint32_t>(data.size()));
    Bytes typed(type, type + 4);
    typed.insert(typed.end(), data.begin(), data.end());
    out.insert(out.end(), typed.begin(), typed.end());
    append_be32(
        out, static_cast<std::uint32_t>(crc32(0, typed.data(), static_cast<uInt>(typed.size()))));
  };
  Bytes out = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  Bytes header;
  append_be32(header, width);
  append_be32(header, height);
  header.insert(header.end(),
                {8, 2, 0, 0, 0});  // bit depth, colour type, compression, filter, interlace
  chunk(out, "IHDR", header);
  Bytes scanlines;
  for (std::uint32_t y = 0; y < height; ++y) {
    scanlines.push_back(0);  // filter type: none
    scanlines.insert(scanlines.end(), rgb.begin() + y * width * 3,
                     rgb.begin() + (y + 1) * width * 3);
  }
  uLongf size = compressBound(static_cast<uLong>(scanlines.size()));
  Bytes compressed(size);
  if (compress(compressed.data(), &size, scanlines.data(), static_cast<uLong>(scanlines.size())) !=
      Z_OK) {
    throw std::runtime_error("zlib compress failed");
  }
  compressed.resize(size);
  chunk(out, "IDAT", compressed);
  chunk(out, "IEND", {});
  return out;
}

// `count` RGB pixels of one colour.
inline Bytes solid(std::size_t count, std::uint8_t r, std::uint8_t g, std::uint8_t b) {
  Bytes out;
  for (std::size_t i = 0; i < count; ++i) out.insert(out.end(), {r, g, b});
  return out;
}

}  // namespace resnet::test
