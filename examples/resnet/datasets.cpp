#include "datasets.hpp"

#include <stb_image.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <utility>

namespace resnet {
namespace {

namespace fs = std::filesystem;
namespace F = torch::nn::functional;

constexpr const char* fashion_mnist_hint =
    "Install Debian's Fashion-MNIST package (apt-get install dataset-fashion-mnist, files in "
    "/usr/share/datasets/fashion-mnist) or pass --data-dir with train-images-idx3-ubyte.gz, "
    "train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz and t10k-labels-idx1-ubyte.gz from "
    "https://github.com/zalandoresearch/fashion-mnist.";

constexpr const char* cifar10_hint =
    "Download the binary version (cifar-10-binary.tar.gz) from "
    "https://www.cs.toronto.edu/~kriz/cifar.html, unpack it and pass --data-dir with "
    "data_batch_1.bin .. data_batch_5.bin and test_batch.bin (the cifar-10-batches-bin folder or "
    "its parent).";

constexpr const char* image_folder_hint =
    "Expected layout: <data-dir>/train/<class>/<image> and <data-dir>/val/<class>/<image>, one "
    "folder per class, images in a format stb_image decodes (PNG, JPEG, BMP, PPM/PGM, TGA, GIF).";

std::string quoted(const fs::path& file) {
  // Appended piecewise: g++ 12 flags `"'" + std::string` with a false -Wrestrict (GCC PR 105329).
  std::string text(1, '\'');
  text += file.string();
  text += '\'';
  return text;
}

[[noreturn]] void fail(const fs::path& file, const std::string& what, const char* hint) {
  throw DatasetError(quoted(file) + ": " + what + ". " + hint);
}

// The whole decompressed content. zlib reads files that are not gzip'd unchanged, so an IDX file
// someone unpacked works too.
std::vector<std::uint8_t> read_gzip_file(const fs::path& file, const char* hint) {
  if (!fs::is_regular_file(file)) fail(file, "file not found", hint);
  std::unique_ptr<gzFile_s, int (*)(gzFile)> gz(gzopen(file.c_str(), "rb"), gzclose);
  if (!gz) fail(file, std::string("cannot open: ") + std::strerror(errno), hint);
  std::vector<std::uint8_t> bytes;
  std::array<std::uint8_t, 1 << 16> chunk{};
  for (;;) {
    const int n = gzread(gz.get(), chunk.data(), static_cast<unsigned>(chunk.size()));
    if (n < 0) {
      int code = 0;
      fail(file, std::string("corrupt gzip data (") + gzerror(gz.get(), &code) + ")", hint);
    }
    if (n == 0) break;
    bytes.insert(bytes.end(), chunk.data(), chunk.data() + n);
  }
  // A gzip stream cut short reads as a clean end of file; zlib only reports it here.
  int code = Z_OK;
  const char* message = gzerror(gz.get(), &code);
  if (code != Z_OK) fail(file, std::string("corrupt gzip data (") + message + ")", hint);
  return bytes;
}

std::vector<std::uint8_t> read_binary_file(const fs::path& file, const char* hint) {
  if (!fs::is_regular_file(file)) fail(file, "file not found", hint);
  std::ifstream in(file, std::ios::binary);
  if (!in) fail(file, std::string("cannot open: ") + std::strerror(errno), hint);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::uint32_t read_be32(const std::uint8_t* p) {
  return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) |
         std::uint32_t{p[3]};
}

// Validates the IDX header (magic 0x000008<ndims>: unsigned bytes) and the payload size, and
// returns the dimensions. The payload follows at 4 + 4 * ndims.
std::vector<std::int64_t> parse_idx_header(const std::vector<std::uint8_t>& bytes,
                                           const fs::path& file, std::uint8_t ndims) {
  const std::uint32_t expected_magic = 0x00000800u | ndims;
  const std::size_t header = 4 + 4 * std::size_t{ndims};
  // The magic number first: a wrong kind of file is a clearer report than its short header.
  if (bytes.size() >= 4 && read_be32(bytes.data()) != expected_magic) {
    char text[64];
    std::snprintf(text, sizeof text, "bad IDX magic number 0x%08x, expected 0x%08x",
                  read_be32(bytes.data()), expected_magic);
    fail(file, text, fashion_mnist_hint);
  }
  if (bytes.size() < header) {
    fail(file, "truncated IDX header (" + std::to_string(bytes.size()) + " bytes)",
         fashion_mnist_hint);
  }
  std::vector<std::int64_t> dims;
  std::uint64_t per_item = 1;
  for (std::size_t d = 0; d < ndims; ++d) {
    const std::uint32_t dim = read_be32(bytes.data() + 4 + 4 * d);
    if (dim == 0 && d > 0) {
      fail(file, "IDX dimension " + std::to_string(d) + " is 0", fashion_mnist_hint);
    }
    dims.push_back(dim);
    if (d > 0) per_item *= dim;
  }
  const std::uint64_t payload = bytes.size() - header;
  // Compare by division: count * per_item can overflow for a corrupt header.
  const std::uint64_t count = static_cast<std::uint64_t>(dims[0]);
  if (payload / per_item < count) {
    fail(file,
         "truncated: the header promises " + std::to_string(count) + " items of " +
             std::to_string(per_item) + " bytes, the file holds " + std::to_string(payload) +
             " bytes after the header",
         fashion_mnist_hint);
  }
  if (payload != count * per_item) {
    fail(file,
         "corrupt: " + std::to_string(payload - count * per_item) + " unexpected bytes after the " +
             std::to_string(count) + " items the header promises",
         fashion_mnist_hint);
  }
  return dims;
}

// uint8 [N, C, H, W] -> float32 normalised with per-channel mean and std (of pixel / 255).
torch::Tensor normalize(const torch::Tensor& pixels, const std::vector<double>& mean,
                        const std::vector<double>& std) {
  const auto channels = static_cast<std::int64_t>(mean.size());
  auto m = torch::tensor(mean, torch::kFloat32).view({1, channels, 1, 1});
  auto s = torch::tensor(std, torch::kFloat32).view({1, channels, 1, 1});
  return (pixels.to(torch::kFloat32).div_(255.0f) - m).div_(s).contiguous();
}

void check_labels(const torch::Tensor& labels, std::int64_t num_classes, const fs::path& file,
                  const char* hint) {
  if (labels.numel() == 0) return;
  const auto max_label = labels.max().item<std::int64_t>();
  if (max_label >= num_classes) {
    fail(file,
         "corrupt: label " + std::to_string(max_label) + " is outside 0.." +
             std::to_string(num_classes - 1),
         hint);
  }
}

fs::path existing_or_gz(const fs::path& dir, const std::string& name) {
  const auto gz = dir / (name + ".gz");
  if (fs::exists(gz) || !fs::exists(dir / name)) return gz;
  return dir / name;
}

const std::vector<std::string> fashion_mnist_classes = {
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};

const std::vector<std::string> cifar10_classes = {
    "airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"};

Dataset load_fashion_mnist_split(const fs::path& dir, const std::string& prefix) {
  const auto image_file = existing_or_gz(dir, prefix + "-images-idx3-ubyte");
  const auto label_file = existing_or_gz(dir, prefix + "-labels-idx1-ubyte");
  auto pixels = read_idx_images(image_file);
  auto labels = read_idx_labels(label_file);
  if (pixels.size(0) != labels.size(0)) {
    fail(label_file,
         "holds " + std::to_string(labels.size(0)) + " labels but " + quoted(image_file) +
             " holds " + std::to_string(pixels.size(0)) + " images",
         fashion_mnist_hint);
  }
  check_labels(labels, 10, label_file, fashion_mnist_hint);
  // Fashion-MNIST training-set statistics.
  return {normalize(pixels.unsqueeze(1), {0.2860}, {0.3530}), labels};
}

bool is_image_file(const fs::path& file) {
  static const std::vector<std::string> extensions = {".png", ".jpg", ".jpeg", ".bmp", ".ppm",
                                                      ".pgm", ".pnm", ".tga",  ".gif"};
  std::string ext = file.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return std::find(extensions.begin(), extensions.end(), ext) != extensions.end();
}

// Decodes to uint8 [C, size, size]: shorter side resized to `size`, then centre-cropped.
torch::Tensor decode_image(const fs::path& file, const ImageFolderOptions& options) {
  int width = 0, height = 0, channels_in_file = 0;
  const int channels = static_cast<int>(options.channels);
  std::unique_ptr<stbi_uc, void (*)(void*)> data(
      stbi_load(file.c_str(), &width, &height, &channels_in_file, channels), stbi_image_free);
  if (!data) {
    fail(file, std::string("cannot decode image (") + stbi_failure_reason() + ")",
         image_folder_hint);
  }
  auto image = torch::from_blob(data.get(), {height, width, channels}, torch::kUInt8)
                   .permute({2, 0, 1})
                   .to(torch::kFloat32)
                   .unsqueeze(0);
  const auto size = options.image_size;
  if (height != size || width != size) {
    const double scale = static_cast<double>(size) / std::min(height, width);
    const auto new_h = std::max<std::int64_t>(size, std::llround(height * scale));
    const auto new_w = std::max<std::int64_t>(size, std::llround(width * scale));
    image = F::interpolate(image, F::InterpolateFuncOptions()
                                      .size(std::vector<std::int64_t>{new_h, new_w})
                                      .mode(torch::kBilinear)
                                      .align_corners(false)
                                      .antialias(true));
    const auto top = (new_h - size) / 2;
    const auto left = (new_w - size) / 2;
    image = image.narrow(2, top, size).narrow(3, left, size);
  }
  return image.squeeze(0).round_().clamp_(0, 255).to(torch::kUInt8);
}

std::vector<double> image_mean(std::int64_t channels) {
  // ImageNet statistics; grey images use their average.
  return channels == 3 ? std::vector<double>{0.485, 0.456, 0.406} : std::vector<double>{0.449};
}

std::vector<double> image_std(std::int64_t channels) {
  return channels == 3 ? std::vector<double>{0.229, 0.224, 0.225} : std::vector<double>{0.226};
}

}  // namespace

Dataset Dataset::subset(const torch::Tensor& indices) const {
  auto idx = indices.to(torch::kLong);
  return {images.index_select(0, idx), labels.index_select(0, idx)};
}

torch::Tensor read_idx_images(const std::filesystem::path& file) {
  const auto bytes = read_gzip_file(file, fashion_mnist_hint);
  const auto dims = parse_idx_header(bytes, file, 3);
  auto pixels = torch::empty(dims, torch::kUInt8);
  std::memcpy(pixels.data_ptr<std::uint8_t>(), bytes.data() + 16, bytes.size() - 16);
  return pixels;
}

torch::Tensor read_idx_labels(const std::filesystem::path& file) {
  const auto bytes = read_gzip_file(file, fashion_mnist_hint);
  const auto dims = parse_idx_header(bytes, file, 1);
  auto labels = torch::empty(dims, torch::kUInt8);
  std::memcpy(labels.data_ptr<std::uint8_t>(), bytes.data() + 8, bytes.size() - 8);
  return labels.to(torch::kLong);
}

DataSplits load_fashion_mnist(const std::filesystem::path& dir) {
  if (!fs::is_directory(dir)) {
    throw DatasetError("Fashion-MNIST directory " + quoted(dir) + " not found. " +
                       fashion_mnist_hint);
  }
  return {load_fashion_mnist_split(dir, "train"), load_fashion_mnist_split(dir, "t10k"),
          fashion_mnist_classes};
}

Dataset read_cifar10_batches(const std::vector<std::filesystem::path>& files) {
  constexpr std::int64_t record = 1 + 3 * 32 * 32;
  std::vector<torch::Tensor> pixels, labels;
  for (const auto& file : files) {
    const auto bytes = read_binary_file(file, cifar10_hint);
    const auto size = static_cast<std::int64_t>(bytes.size());
    if (size == 0 || size % record != 0) {
      fail(file,
           "corrupt or truncated: " + std::to_string(size) +
               " bytes is not a whole number of 3073-byte records (1 label byte + 3x32x32 "
               "pixels)",
           cifar10_hint);
    }
    auto records = torch::from_blob(const_cast<std::uint8_t*>(bytes.data()),
                                    {size / record, record}, torch::kUInt8)
                       .clone();
    auto file_labels = records.select(1, 0).to(torch::kLong);
    check_labels(file_labels, 10, file, cifar10_hint);
    labels.push_back(file_labels);
    pixels.push_back(records.narrow(1, 1, record - 1).view({-1, 3, 32, 32}));
  }
  // CIFAR-10 training-set statistics.
  return {normalize(torch::cat(pixels), {0.4914, 0.4822, 0.4465}, {0.2470, 0.2435, 0.2616}),
          torch::cat(labels)};
}

DataSplits load_cifar10(const std::filesystem::path& dir) {
  auto base = dir;
  if (!fs::exists(base / "test_batch.bin") && fs::is_directory(dir / "cifar-10-batches-bin")) {
    base = dir / "cifar-10-batches-bin";
  }
  if (!fs::is_directory(base)) {
    throw DatasetError("CIFAR-10 directory " + quoted(dir) + " not found. " + cifar10_hint);
  }
  std::vector<fs::path> train_files;
  for (int i = 1; i <= 5; ++i) {
    train_files.push_back(base / ("data_batch_" + std::to_string(i) + ".bin"));
  }
  return {read_cifar10_batches(train_files), read_cifar10_batches({base / "test_batch.bin"}),
          cifar10_classes};
}

Dataset load_image_folder(const std::filesystem::path& root, const ImageFolderOptions& options,
                          std::vector<std::string>& class_names) {
  if (options.channels != 1 && options.channels != 3) {
    throw std::invalid_argument("image folder channels must be 1 or 3, got " +
                                std::to_string(options.channels));
  }
  if (options.image_size < 1) {
    throw std::invalid_argument("image size must be positive, got " +
                                std::to_string(options.image_size));
  }
  if (!fs::is_directory(root)) fail(root, "directory not found", image_folder_hint);
  std::vector<std::string> found;
  for (const auto& entry : fs::directory_iterator(root)) {
    if (entry.is_directory()) found.push_back(entry.path().filename().string());
  }
  std::sort(found.begin(), found.end());
  if (found.empty()) fail(root, "has no class directories", image_folder_hint);
  if (class_names.empty()) class_names = found;
  std::map<std::string, std::int64_t> label_of;
  for (std::size_t i = 0; i < class_names.size(); ++i) {
    label_of[class_names[i]] = static_cast<std::int64_t>(i);
  }

  std::vector<torch::Tensor> images;
  std::vector<std::int64_t> labels;
  for (const auto& name : found) {
    const auto it = label_of.find(name);
    if (it == label_of.end()) {
      fail(root / name, "is a class the training folder does not have", image_folder_hint);
    }
    std::vector<fs::path> files;
    for (const auto& entry : fs::directory_iterator(root / name)) {
      if (entry.is_regular_file() && is_image_file(entry.path())) files.push_back(entry.path());
    }
    std::sort(files.begin(), files.end());
    for (const auto& file : files) {
      images.push_back(decode_image(file, options));
      labels.push_back(it->second);
    }
  }
  if (images.empty()) fail(root, "holds no images", image_folder_hint);
  return {
      normalize(torch::stack(images), image_mean(options.channels), image_std(options.channels)),
      torch::tensor(labels, torch::kLong)};
}

DataSplits load_image_folder_splits(const std::filesystem::path& root,
                                    const ImageFolderOptions& options) {
  if (!fs::is_directory(root / "train") || !fs::is_directory(root / "val")) {
    fail(root, "needs 'train' and 'val' subdirectories", image_folder_hint);
  }
  DataSplits splits;
  splits.train = load_image_folder(root / "train", options, splits.class_names);
  splits.test = load_image_folder(root / "val", options, splits.class_names);
  return splits;
}

DataSplits make_synthetic(const SyntheticOptions& options) {
  if (options.train_samples < 1 || options.test_samples < 1 || options.channels < 1 ||
      options.image_size < 1 || options.num_classes < 2) {
    throw std::invalid_argument(
        "synthetic data needs positive sample counts, channels and image size, and at least 2 "
        "classes");
  }
  auto generator = at::detail::createCPUGenerator(options.seed);
  const std::vector<std::int64_t> image_shape = {options.channels, options.image_size,
                                                 options.image_size};
  std::vector<std::int64_t> prototype_shape = {options.num_classes};
  prototype_shape.insert(prototype_shape.end(), image_shape.begin(), image_shape.end());
  const auto prototypes = torch::randn(prototype_shape, generator);
  auto make = [&](std::int64_t n) {
    auto labels = torch::randint(options.num_classes, {n}, generator);
    std::vector<std::int64_t> shape = {n};
    shape.insert(shape.end(), image_shape.begin(), image_shape.end());
    auto images = prototypes.index_select(0, labels).mul_(0.5) + torch::randn(shape, generator);
    return Dataset{images, labels};
  };
  DataSplits splits;
  splits.train = make(options.train_samples);
  splits.test = make(options.test_samples);
  for (std::int64_t c = 0; c < options.num_classes; ++c) {
    splits.class_names.push_back("class" + std::to_string(c));
  }
  return splits;
}

torch::Tensor augment_batch(const torch::Tensor& images, std::int64_t pad, bool flip,
                            torch::Generator& generator) {
  const auto n = images.size(0);
  const auto height = images.size(2);
  const auto width = images.size(3);
  auto out = images;
  if (pad > 0) {
    // Replicate padding: Fashion-MNIST's borders are black, so this pads with black rather than
    // with the grey a normalised zero would be.
    const auto padded =
        F::pad(images, F::PadFuncOptions({pad, pad, pad, pad}).mode(torch::kReplicate));
    const auto offsets = torch::randint(2 * pad + 1, {n, 2}, generator);
    const auto* off = offsets.data_ptr<std::int64_t>();
    out = torch::empty_like(images);
    for (std::int64_t i = 0; i < n; ++i) {
      out[i].copy_(padded[i].narrow(1, off[2 * i], height).narrow(2, off[2 * i + 1], width));
    }
  }
  if (flip) {
    const auto mirror = torch::randint(2, {n}, generator).to(torch::kBool);
    if (out.data_ptr() == images.data_ptr()) out = images.clone();
    out.index_put_({mirror}, out.index({mirror}).flip({3}));
  }
  return out;
}

}  // namespace resnet
