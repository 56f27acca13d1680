#include "test_helpers.hpp"  // first: see Note [glog's CHECK]

#include <cmath>
#include <string>

#include "datasets.hpp"
#include "file_writers.hpp"
#include "support/temp_dir.hpp"

namespace {

using namespace resnet;
using namespace resnet::test;
using namespace dtrain::test;
namespace fs = std::filesystem;

// n images of rows x cols; image i has every pixel equal to 10 * i + 1.
Bytes idx_image_payload(std::uint32_t n, std::uint32_t rows, std::uint32_t cols) {
  Bytes out;
  for (std::uint32_t i = 0; i < n; ++i)
    out.insert(out.end(), rows * cols, static_cast<std::uint8_t>(10 * i + 1));
  return out;
}

void write_fashion_split(const fs::path& dir, const std::string& prefix, const Bytes& labels,
                         std::uint32_t rows = 28, std::uint32_t cols = 28) {
  const auto n = static_cast<std::uint32_t>(labels.size());
  write_gzip(dir / (prefix + "-images-idx3-ubyte.gz"),
             idx({n, rows, cols}, idx_image_payload(n, rows, cols)));
  write_gzip(dir / (prefix + "-labels-idx1-ubyte.gz"), idx({n}, labels));
}

float normalized(double pixel, double mean, double std) {
  return static_cast<float>((pixel / 255.0 - mean) / std);
}

}  // namespace

TEST_CASE("read_idx_images and read_idx_labels decode gzip'd IDX files") {
  TempDir dir;
  Bytes pixels;
  for (int i = 0; i < 2 * 3 * 4; ++i) pixels.push_back(static_cast<std::uint8_t>(i * 10));
  write_gzip(dir / "images.gz", idx({2, 3, 4}, pixels));
  write_gzip(dir / "labels.gz", idx({2}, {7, 3}));

  const auto images = read_idx_images(dir / "images.gz");
  CHECK(shape_of(images) == "2x3x4");
  CHECK(dtype_of(images) == "Byte");
  CHECK(images[1][2][3].item<int>() == 230);
  CHECK(images[0][1][0].item<int>() == 40);
  const auto labels = read_idx_labels(dir / "labels.gz");
  CHECK(dtype_of(labels) == "Long");
  CHECK(labels.equal(torch::tensor({7, 3}, torch::kLong)));
}

TEST_CASE("IDX files that are not gzip'd are read as they are") {
  TempDir dir;
  write_file(dir / "labels", idx({3}, {1, 2, 3}));
  CHECK(read_idx_labels(dir / "labels").equal(torch::tensor({1, 2, 3}, torch::kLong)));
}

TEST_CASE("IDX validation names the file and what is wrong") {
  TempDir dir;
  SUBCASE("missing file") {
    const auto message = message_of<DatasetError>([&] { read_idx_labels(dir / "absent.gz"); });
    CHECK(contains(message, (dir / "absent.gz").string()));
    CHECK(contains(message, "not found"));
    CHECK(contains(message, "apt-get install dataset-fashion-mnist"));
  }
  SUBCASE("labels file where images are expected: wrong magic") {
    write_gzip(dir / "f.gz", idx({2}, {1, 2}));
    const auto message = message_of<DatasetError>([&] { read_idx_images(dir / "f.gz"); });
    CHECK(contains(message, "f.gz"));
    CHECK(contains(message, "bad IDX magic number 0x00000801, expected 0x00000803"));
  }
  SUBCASE("signed-int IDX type is rejected") {
    Bytes bytes = idx({2}, {1, 2});
    bytes[2] = 0x0C;
    write_gzip(dir / "f.gz", bytes);
    CHECK(contains(message_of<DatasetError>([&] { read_idx_labels(dir / "f.gz"); }),
                   "bad IDX magic"));
  }
  SUBCASE("truncated header") {
    write_gzip(dir / "f.gz", {0, 0, 8, 3, 0, 0});
    CHECK(contains(message_of<DatasetError>([&] { read_idx_images(dir / "f.gz"); }),
                   "truncated IDX header"));
  }
  SUBCASE("truncated payload") {
    Bytes payload = idx_image_payload(3, 2, 2);
    payload.resize(payload.size() - 3);
    write_gzip(dir / "f.gz", idx({3, 2, 2}, payload));
    const auto message = message_of<DatasetError>([&] { read_idx_images(dir / "f.gz"); });
    CHECK(contains(message, "truncated: the header promises 3 items of 4 bytes, the file holds 9"));
  }
  SUBCASE("a count so large that count * size overflows is reported as truncation") {
    write_gzip(dir / "f.gz", idx({0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu}, {1, 2, 3}));
    CHECK(contains(message_of<DatasetError>([&] { read_idx_images(dir / "f.gz"); }), "truncated"));
  }
  SUBCASE("trailing bytes") {
    write_gzip(dir / "f.gz", idx({2}, {1, 2, 3}));
    CHECK(contains(message_of<DatasetError>([&] { read_idx_labels(dir / "f.gz"); }),
                   "1 unexpected bytes after the 2 items"));
  }
  SUBCASE("zero-sized image dimension") {
    write_gzip(dir / "f.gz", idx({1, 0, 28}, {}));
    CHECK(contains(message_of<DatasetError>([&] { read_idx_images(dir / "f.gz"); }),
                   "IDX dimension 1 is 0"));
  }
  SUBCASE("gzip stream cut short") {
    // Incompressible content, so that cutting the file cuts the deflate stream, not just the
    // trailer.
    Bytes payload;
    std::uint32_t state = 12345;
    for (int i = 0; i < 20000; ++i) {
      state = state * 1103515245u + 12345u;
      payload.push_back(static_cast<std::uint8_t>(state >> 24));
    }
    write_gzip(dir / "full.gz", idx({20000}, payload));
    std::ifstream in(dir / "full.gz", std::ios::binary);
    Bytes bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    bytes.resize(bytes.size() / 2);
    write_file(dir / "cut.gz", bytes);
    const auto message = message_of<DatasetError>([&] { read_idx_labels(dir / "cut.gz"); });
    CHECK(contains(message, "cut.gz"));
    CHECK(contains(message, "corrupt gzip data"));
  }
  SUBCASE("gzip stream with corrupted deflate data") {
    write_gzip(dir / "f.gz", idx({4}, {1, 2, 3, 4}));
    std::ifstream in(dir / "f.gz", std::ios::binary);
    Bytes bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    in.close();
    // Past the 10-byte gzip header: invalidate the deflate block type and the CRC trailer.
    bytes[10] = 0xFF;
    bytes[bytes.size() - 8] ^= 0xFF;
    write_file(dir / "f.gz", bytes);
    CHECK(contains(message_of<DatasetError>([&] { read_idx_labels(dir / "f.gz"); }),
                   "corrupt gzip data"));
  }
}

TEST_CASE("load_fashion_mnist reads both splits and normalises") {
  TempDir dir;
  write_fashion_split(dir.path(), "train", {0, 9, 4});
  write_fashion_split(dir.path(), "t10k", {5, 1});

  const auto data = load_fashion_mnist(dir.path());
  CHECK(data.num_classes() == 10);
  CHECK(data.class_names[9] == "Ankle boot");
  CHECK(shape_of(data.train.images) == "3x1x28x28");
  CHECK(dtype_of(data.train.images) == "Float");
  CHECK(shape_of(data.test.images) == "2x1x28x28");
  CHECK(data.train.labels.equal(torch::tensor({0, 9, 4}, torch::kLong)));
  CHECK(data.test.labels.equal(torch::tensor({5, 1}, torch::kLong)));
  // Image 2 of the training split has pixel value 21 everywhere.
  CHECK(data.train.images[2][0][13][7].item<float>() ==
        doctest::Approx(normalized(21, 0.2860, 0.3530)).epsilon(1e-5));
  CHECK(data.channels() == 1);
}

TEST_CASE("load_fashion_mnist errors say which file and how to get the dataset") {
  TempDir dir;
  SUBCASE("missing directory") {
    const auto message = message_of<DatasetError>([&] { load_fashion_mnist(dir / "nowhere"); });
    CHECK(contains(message, "nowhere"));
    CHECK(contains(message, "apt-get install dataset-fashion-mnist"));
  }
  SUBCASE("missing labels file") {
    write_fashion_split(dir.path(), "train", {0, 1});
    write_fashion_split(dir.path(), "t10k", {0, 1});
    fs::remove(dir / "t10k-labels-idx1-ubyte.gz");
    const auto message = message_of<DatasetError>([&] { load_fashion_mnist(dir.path()); });
    CHECK(contains(message, "t10k-labels-idx1-ubyte.gz"));
    CHECK(contains(message, "file not found"));
    CHECK(contains(message, "dataset-fashion-mnist"));
  }
  SUBCASE("image and label counts differ") {
    write_fashion_split(dir.path(), "train", {0, 1});
    write_gzip(dir / "train-labels-idx1-ubyte.gz", idx({3}, {0, 1, 2}));
    write_fashion_split(dir.path(), "t10k", {0, 1});
    CHECK(contains(message_of<DatasetError>([&] { load_fashion_mnist(dir.path()); }),
                   "holds 3 labels but"));
  }
  SUBCASE("label out of range") {
    write_fashion_split(dir.path(), "train", {0, 10});
    write_fashion_split(dir.path(), "t10k", {0, 1});
    const auto message = message_of<DatasetError>([&] { load_fashion_mnist(dir.path()); });
    CHECK(contains(message, "train-labels-idx1-ubyte.gz"));
    CHECK(contains(message, "label 10 is outside 0..9"));
  }
}

TEST_CASE("load_cifar10 reads channel-planar records from the folder or its parent") {
  TempDir dir;
  const auto folder = dir / "cifar-10-batches-bin";
  for (int i = 1; i <= 5; ++i) {
    Bytes batch;
    append_cifar_record(batch, static_cast<std::uint8_t>(i), 255, 0, 128);
    append_cifar_record(batch, 0, 0, 0, 0);
    write_file(folder / ("data_batch_" + std::to_string(i) + ".bin"), batch);
  }
  Bytes test;
  append_cifar_record(test, 9, 10, 20, 30);
  write_file(folder / "test_batch.bin", test);

  for (const auto& path : {dir.path(), folder}) {
    const auto data = load_cifar10(path);
    CHECK(data.num_classes() == 10);
    CHECK(shape_of(data.train.images) == "10x3x32x32");
    CHECK(shape_of(data.test.images) == "1x3x32x32");
    CHECK(data.train.labels.equal(torch::tensor({1, 0, 2, 0, 3, 0, 4, 0, 5, 0}, torch::kLong)));
    CHECK(data.test.labels.equal(torch::tensor({9}, torch::kLong)));
    const auto first = data.train.images[0];
    CHECK(first[0][5][5].item<float>() ==
          doctest::Approx(normalized(255, 0.4914, 0.2470)).epsilon(1e-5));
    CHECK(first[1][31][0].item<float>() ==
          doctest::Approx(normalized(0, 0.4822, 0.2435)).epsilon(1e-5));
    CHECK(first[2][0][31].item<float>() ==
          doctest::Approx(normalized(128, 0.4465, 0.2616)).epsilon(1e-5));
    CHECK(data.test.images[0][2][9][9].item<float>() ==
          doctest::Approx(normalized(30, 0.4465, 0.2616)).epsilon(1e-5));
  }
}

TEST_CASE("CIFAR-10 errors name the file and the expected layout") {
  TempDir dir;
  Bytes good;
  append_cifar_record(good, 1, 1, 1, 1);
  for (int i = 1; i <= 5; ++i) write_file(dir / ("data_batch_" + std::to_string(i) + ".bin"), good);
  write_file(dir / "test_batch.bin", good);
  SUBCASE("missing batch") {
    fs::remove(dir / "data_batch_3.bin");
    const auto message = message_of<DatasetError>([&] { load_cifar10(dir.path()); });
    CHECK(contains(message, "data_batch_3.bin"));
    CHECK(contains(message, "cifar-10-binary.tar.gz"));
  }
  SUBCASE("truncated record") {
    const Bytes cut(good.begin(), good.end() - 1);
    write_file(dir / "test_batch.bin", cut);
    const auto message = message_of<DatasetError>([&] { load_cifar10(dir.path()); });
    CHECK(contains(message, "test_batch.bin"));
    CHECK(contains(message, "3072 bytes is not a whole number of 3073-byte records"));
  }
  SUBCASE("empty file") {
    write_file(dir / "data_batch_2.bin", {});
    CHECK(
        contains(message_of<DatasetError>([&] { load_cifar10(dir.path()); }), "data_batch_2.bin"));
  }
  SUBCASE("label out of range") {
    Bytes bad;
    append_cifar_record(bad, 12, 0, 0, 0);
    write_file(dir / "data_batch_4.bin", bad);
    const auto message = message_of<DatasetError>([&] { load_cifar10(dir.path()); });
    CHECK(contains(message, "data_batch_4.bin"));
    CHECK(contains(message, "label 12 is outside 0..9"));
  }
  SUBCASE("missing directory") {
    CHECK(contains(message_of<DatasetError>([&] { load_cifar10(dir / "absent"); }), "absent"));
  }
}

namespace {

// root/train/{cat,dog} and root/val/{cat,dog}: cats are red PNGs, dogs are PPMs whose left half is
// black and right half white. A text file sits among the images.
void write_image_folder(const fs::path& root) {
  for (const char* split : {"train", "val"}) {
    write_file(root / split / "cat" / "a.png", png(4, 4, solid(16, 255, 0, 0)));
    Bytes halves;
    for (int y = 0; y < 4; ++y) {
      for (int x = 0; x < 8; ++x) {
        const std::uint8_t v = x < 4 ? 0 : 255;
        halves.insert(halves.end(), {v, v, v});
      }
    }
    write_file(root / split / "dog" / "b.ppm", ppm(8, 4, halves));
    write_file(root / split / "dog" / "notes.txt", {'h', 'i'});
  }
  write_file(root / "train" / "cat" / "c.PNG", png(2, 2, solid(4, 0, 0, 255)));
}

}  // namespace

TEST_CASE("load_image_folder_splits decodes, resizes, crops and labels by folder") {
  TempDir dir;
  write_image_folder(dir.path());

  const auto data = load_image_folder_splits(dir.path(), {.image_size = 4, .channels = 3});
  CHECK(data.class_names == std::vector<std::string>{"cat", "dog"});
  CHECK(shape_of(data.train.images) == "3x3x4x4");
  CHECK(shape_of(data.test.images) == "2x3x4x4");
  CHECK(data.train.labels.equal(torch::tensor({0, 0, 1}, torch::kLong)));
  CHECK(data.test.labels.equal(torch::tensor({0, 1}, torch::kLong)));

  const auto red = data.train.images[0];
  CHECK(red[0][1][2].item<float>() == doctest::Approx(normalized(255, 0.485, 0.229)).epsilon(1e-5));
  CHECK(red[1][1][2].item<float>() == doctest::Approx(normalized(0, 0.456, 0.224)).epsilon(1e-5));
  // c.PNG: 2x2 blue, upscaled to 4x4 and still blue.
  const auto blue = data.train.images[1];
  CHECK(blue[2][3][3].item<float>() ==
        doctest::Approx(normalized(255, 0.406, 0.225)).epsilon(1e-5));
  CHECK(blue[0][0][0].item<float>() == doctest::Approx(normalized(0, 0.485, 0.229)).epsilon(1e-5));
  // The 8x4 PPM is centre-cropped to columns 2..5: two black columns, then two white ones.
  const auto halves = data.train.images[2];
  for (int x = 0; x < 4; ++x) {
    CAPTURE(x);
    CHECK(halves[0][2][x].item<float>() ==
          doctest::Approx(normalized(x < 2 ? 0 : 255, 0.485, 0.229)).epsilon(1e-5));
  }
}

TEST_CASE("load_image_folder converts to grey when asked for one channel") {
  TempDir dir;
  write_image_folder(dir.path());
  std::vector<std::string> classes;
  const auto data = load_image_folder(dir / "val", {.image_size = 2, .channels = 1}, classes);
  CHECK(shape_of(data.images) == "2x1x2x2");
  CHECK(classes == std::vector<std::string>{"cat", "dog"});
}

TEST_CASE("image folder errors name the file or folder and the expected layout") {
  TempDir dir;
  write_image_folder(dir.path());
  const ImageFolderOptions options{.image_size = 4};
  SUBCASE("undecodable image") {
    write_file(dir / "train" / "dog" / "broken.png", {'n', 'o', 't', ' ', 'p', 'n', 'g'});
    const auto message =
        message_of<DatasetError>([&] { load_image_folder_splits(dir.path(), options); });
    CHECK(contains(message, "broken.png"));
    CHECK(contains(message, "cannot decode image"));
  }
  SUBCASE("no val folder") {
    fs::remove_all(dir / "val");
    const auto message =
        message_of<DatasetError>([&] { load_image_folder_splits(dir.path(), options); });
    CHECK(contains(message, "needs 'train' and 'val' subdirectories"));
    CHECK(contains(message, "<data-dir>/train/<class>/<image>"));
  }
  SUBCASE("validation class unknown to training") {
    write_file(dir / "val" / "bird" / "x.ppm", ppm(1, 1, solid(1, 1, 2, 3)));
    const auto message =
        message_of<DatasetError>([&] { load_image_folder_splits(dir.path(), options); });
    CHECK(contains(message, "bird"));
    CHECK(contains(message, "a class the training folder does not have"));
  }
  SUBCASE("no class folders") {
    fs::create_directories(dir / "empty");
    std::vector<std::string> classes;
    CHECK(contains(
        message_of<DatasetError>([&] { load_image_folder(dir / "empty", options, classes); }),
        "has no class directories"));
  }
  SUBCASE("class folders without images") {
    fs::create_directories(dir / "noimages" / "cat");
    std::vector<std::string> classes;
    CHECK(contains(
        message_of<DatasetError>([&] { load_image_folder(dir / "noimages", options, classes); }),
        "holds no images"));
  }
  SUBCASE("bad channel count") {
    std::vector<std::string> classes;
    CHECK_THROWS_AS(load_image_folder(dir / "train", {.image_size = 4, .channels = 2}, classes),
                    std::invalid_argument);
  }
}

TEST_CASE("make_synthetic is deterministic per seed and learnable by construction") {
  const SyntheticOptions options{.train_samples = 64,
                                 .test_samples = 16,
                                 .channels = 3,
                                 .image_size = 8,
                                 .num_classes = 4,
                                 .seed = 7};
  const auto a = make_synthetic(options);
  const auto b = make_synthetic(options);
  auto other_options = options;
  other_options.seed = 8;
  const auto c = make_synthetic(other_options);
  CHECK(shape_of(a.train.images) == "64x3x8x8");
  CHECK(shape_of(a.test.images) == "16x3x8x8");
  CHECK(a.num_classes() == 4);
  CHECK(a.train.images.equal(b.train.images));
  CHECK(a.test.labels.equal(b.test.labels));
  CHECK_FALSE(a.train.images.equal(c.train.images));
  CHECK(a.train.labels.min().item<std::int64_t>() >= 0);
  CHECK(a.train.labels.max().item<std::int64_t>() < 4);
  // Same-class images share a prototype: they correlate more with their class mean than with the
  // others' means.
  const auto flat = a.train.images.view({64, -1});
  const auto mean0 = flat.index({a.train.labels == 0}).mean(0);
  const auto mean1 = flat.index({a.train.labels == 1}).mean(0);
  const auto of_class0 = flat.index({a.train.labels == 0});
  CHECK((of_class0.matmul(mean0) > of_class0.matmul(mean1)).all().item<bool>());
}

TEST_CASE("Dataset::subset gathers samples in the order given") {
  const Dataset data{torch::arange(5, torch::kFloat32).view({5, 1, 1, 1}),
                     torch::tensor({0, 1, 2, 3, 4}, torch::kLong)};
  const auto picked = data.subset(torch::tensor({3, 0, 3}));
  CHECK(picked.size() == 3);
  CHECK(picked.labels.equal(torch::tensor({3, 0, 3}, torch::kLong)));
  CHECK(picked.images.view({3}).equal(torch::tensor({3.0f, 0.0f, 3.0f})));
}

TEST_CASE("augment_batch crops from the replicate-padded image and flips horizontally") {
  auto generator = at::detail::createCPUGenerator(3);
  const auto images = torch::arange(64 * 16, torch::kFloat32).view({64, 1, 4, 4});

  SUBCASE("no padding, no flip: unchanged") {
    CHECK(augment_batch(images, 0, false, generator).equal(images));
  }
  SUBCASE("flip only: every sample is itself or its mirror image, both occur") {
    const auto out = augment_batch(images, 0, true, generator);
    int flipped = 0;
    for (int i = 0; i < 64; ++i) {
      const bool same = out[i].equal(images[i]);
      const bool mirrored = out[i].equal(images[i].flip({2}));
      CHECK((same || mirrored));
      flipped += mirrored ? 1 : 0;
    }
    CHECK(flipped > 0);
    CHECK(flipped < 64);
  }
  SUBCASE("crop only: every sample is a 4x4 window of its padded image, offsets vary") {
    const auto out = augment_batch(images, 2, false, generator);
    CHECK(shape_of(out) == shape_of(images));
    const auto padded = torch::nn::functional::pad(
        images, torch::nn::functional::PadFuncOptions({2, 2, 2, 2}).mode(torch::kReplicate));
    int unshifted = 0;
    for (int i = 0; i < 64; ++i) {
      bool found = false;
      for (int dy = 0; dy <= 4 && !found; ++dy) {
        for (int dx = 0; dx <= 4 && !found; ++dx) {
          found = out[i].equal(padded[i].narrow(1, dy, 4).narrow(2, dx, 4));
        }
      }
      CHECK(found);
      unshifted += out[i].equal(images[i]) ? 1 : 0;
    }
    CHECK(unshifted < 64);
  }
  SUBCASE("the input is never modified") {
    const auto copy = images.clone();
    augment_batch(images, 1, true, generator);
    CHECK(images.equal(copy));
  }
}
