#pragma once
// In-memory image classification datasets: Fashion-MNIST (gzip'd IDX), CIFAR-10 (binary version),
// an ImageNet-style folder of images, and a synthetic set for throughput runs.
//
// Every loader returns whole tensors: images [N, C, H, W] float32 normalised per channel, labels
// [N] int64. The datasets this example targets fit in memory comfortably (Fashion-MNIST: 188 MB
// as float), and indexing a tensor by a batch of sample indices is all a sampler needs.

#include <torch/torch.h>

#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

namespace resnet {

// A dataset file is missing, unreadable, or not what its format promises. The message names the
// file and how to obtain a good one.
class DatasetError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct Dataset {
  torch::Tensor images;  // [N, C, H, W] float32, normalised
  torch::Tensor labels;  // [N] int64 in [0, num_classes)

  std::int64_t size() const { return labels.defined() ? labels.size(0) : 0; }
  // The samples at `indices` (any integer tensor or list), as one batch.
  Dataset subset(const torch::Tensor& indices) const;
};

struct DataSplits {
  Dataset train;
  Dataset test;
  std::vector<std::string> class_names;

  std::int64_t num_classes() const { return static_cast<std::int64_t>(class_names.size()); }
  std::int64_t channels() const { return train.images.size(1); }
};

// Where Debian's dataset-fashion-mnist package installs the four .gz files.
inline constexpr const char* default_fashion_mnist_dir = "/usr/share/datasets/fashion-mnist";

// Reads an IDX file of unsigned bytes, gzip'd or not: images (magic 0x00000803) as uint8
// [N, rows, cols], labels (magic 0x00000801) as int64 [N]. Throws DatasetError for a missing file,
// a bad magic number, a truncated payload or trailing bytes.
torch::Tensor read_idx_images(const std::filesystem::path& file);
torch::Tensor read_idx_labels(const std::filesystem::path& file);

// train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz and
// t10k-labels-idx1-ubyte.gz (or the same names without .gz) in `dir`.
DataSplits load_fashion_mnist(const std::filesystem::path& dir);

// CIFAR-10 "binary version" records (1 label byte + 3x32x32 channel-planar pixels) from the given
// .bin files, concatenated.
Dataset read_cifar10_batches(const std::vector<std::filesystem::path>& files);

// data_batch_1.bin .. data_batch_5.bin and test_batch.bin in `dir` or in
// `dir`/cifar-10-batches-bin (the layout cifar-10-binary.tar.gz unpacks to).
DataSplits load_cifar10(const std::filesystem::path& dir);

struct ImageFolderOptions {
  std::int64_t image_size = 64;  // shorter side resized to this, then centre-cropped square
  std::int64_t channels = 3;     // 3 = RGB, 1 = grey; images are converted as they are decoded
};

// root/<class>/<image> with classes in lexicographic order. `class_names`, when non-empty, fixes
// the class list (so a validation folder uses the training folder's label numbering) and a class
// directory outside it is an error. Files whose extension is not an image format stb_image reads
// are ignored; an image that fails to decode is an error.
Dataset load_image_folder(const std::filesystem::path& root, const ImageFolderOptions& options,
                          std::vector<std::string>& class_names);

// root/train/<class>/<image> and root/val/<class>/<image> (ImageNet's layout).
DataSplits load_image_folder_splits(const std::filesystem::path& root,
                                    const ImageFolderOptions& options);

struct SyntheticOptions {
  std::int64_t train_samples = 4096;
  std::int64_t test_samples = 512;
  std::int64_t channels = 3;
  std::int64_t image_size = 32;
  std::int64_t num_classes = 10;
  std::uint64_t seed = 0;
};

// Noise around one random prototype image per class: learnable, so a synthetic run shows the loss
// falling, and deterministic for a given seed.
DataSplits make_synthetic(const SyntheticOptions& options);

// Training-time augmentation of a normalised batch: a random crop of the zero-padded image
// (padding `pad` on every side, 0 = none) and, when `flip`, a horizontal flip with probability 1/2,
// independently per sample.
torch::Tensor augment_batch(const torch::Tensor& images, std::int64_t pad, bool flip,
                            torch::Generator& generator);

}  // namespace resnet
