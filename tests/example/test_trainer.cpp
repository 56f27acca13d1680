// The trainer binary end to end: exit codes, messages, and learning on a small generated dataset.

#include "test_helpers.hpp"  // first: see Note [glog's CHECK]

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "file_writers.hpp"
#include "models.hpp"
#include "support/parameter_drift.hpp"
#include "support/run_command.hpp"
#include "support/temp_dir.hpp"

#if !defined(RESNET_TRAIN_EXECUTABLE) || !defined(RESNET_MPIEXEC)
#error "RESNET_TRAIN_EXECUTABLE and RESNET_MPIEXEC must name the trainer and the MPI launcher"
#endif

namespace {

using namespace resnet::test;
using namespace dtrain::test;
namespace fs = std::filesystem;

// Runs the trainer as one process (ranks = 0: without a launcher) or under mpiexec.
CommandResult train(const std::vector<std::string>& args, int ranks = 0) {
  std::string command = "'" RESNET_TRAIN_EXECUTABLE "'";
  if (ranks > 0) {
    command = RESNET_MPIEXEC " " + std::to_string(ranks) + " " RESNET_MPIEXEC_FLAGS " " + command;
  }
  for (const auto& arg : args) command += " '" + arg + "'";
  return run_command(command);
}

struct EpochLine {
  int epoch = 0;
  double loss = 0, train_accuracy = 0, test_loss = 0, test_accuracy = 0;
};

std::size_t count(const std::string& text, const std::string& part) {
  std::size_t n = 0;
  for (auto at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

std::vector<EpochLine> epoch_lines(const std::string& output) {
  std::vector<EpochLine> lines;
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);) {
    EpochLine e;
    int total = 0;
    if (std::sscanf(line.c_str(),
                    "epoch %d/%d loss %lf train acc %lf%% test loss %lf test acc %lf%%", &e.epoch,
                    &total, &e.loss, &e.train_accuracy, &e.test_loss, &e.test_accuracy) == 6) {
      lines.push_back(e);
    }
  }
  return lines;
}

// Four texture classes a ResNet tells apart in a few dozen steps (global average pooling keeps
// texture, not position): horizontal stripes, vertical stripes, checkerboard, diagonal stripes,
// each with a random phase and additive noise.
Bytes texture_images(std::uint32_t n, Bytes& labels, std::uint32_t& state) {
  auto next = [&state] {
    state = state * 1664525u + 1013904223u;
    return state >> 8;
  };
  Bytes pixels;
  labels.clear();
  for (std::uint32_t i = 0; i < n; ++i) {
    const auto label = static_cast<std::uint8_t>(i % 4);
    const auto phase = next() % 4;
    labels.push_back(label);
    for (std::uint32_t y = 0; y < 28; ++y) {
      for (std::uint32_t x = 0; x < 28; ++x) {
        const std::uint32_t u = label == 0   ? y
                                : label == 1 ? x
                                : label == 2 ? (x / 2 + y / 2) * 2
                                             : x + y;
        const bool on = ((u + phase) / 2) % 2 == 0;
        pixels.push_back(static_cast<std::uint8_t>((on ? 150 : 0) + next() % 100));
      }
    }
  }
  return pixels;
}

void write_texture_dataset(const fs::path& dir) {
  std::uint32_t state = 2024;
  Bytes labels;
  auto pixels = texture_images(640, labels, state);
  write_gzip(dir / "train-images-idx3-ubyte.gz", idx({640, 28, 28}, pixels));
  write_gzip(dir / "train-labels-idx1-ubyte.gz", idx({640}, labels));
  pixels = texture_images(200, labels, state);
  write_gzip(dir / "t10k-images-idx3-ubyte.gz", idx({200, 28, 28}, pixels));
  write_gzip(dir / "t10k-labels-idx1-ubyte.gz", idx({200}, labels));
}

}  // namespace

TEST_CASE("trainer: a bad flag is refused with exit status 2, naming the flag") {
  const auto result = train({"--bogus"});
  CHECK(result.exit_code == 2);
  CHECK(contains(result.output, "resnet_train: The following argument was not expected: --bogus"));
  CHECK(contains(result.output, "Run with --help"));
}

TEST_CASE("trainer: an unknown model is refused before any data is read") {
  const auto result = train({"--model", "resnet19", "--data-dir", "/nonexistent"});
  CHECK(result.exit_code == 2);
  CHECK(contains(result.output, "--model: resnet19 not in {resnet8,resnet20"));
}

TEST_CASE("trainer: --help prints the flags and exits 0, the testing flags left out") {
  const auto result = train({"--help"});
  CHECK(result.exit_code == 0);
  CHECK(contains(result.output, "--max-steps-per-epoch"));
  CHECK_FALSE(contains(result.output, "--crash-rank"));
}

TEST_CASE("trainer: missing data stops with the file and how to get it") {
  TempDir dir;
  const auto result = train({"--data-dir", (dir / "missing").string()});
  CHECK(result.exit_code == 1);
  CHECK(contains(result.output, (dir / "missing").string()));
  CHECK(contains(result.output, "apt-get install dataset-fashion-mnist"));
  CHECK(epoch_lines(result.output).empty());
}

TEST_CASE("trainer: learns a generated IDX dataset, reproducibly, checkpoints and saves the model") {
  TempDir dir;
  write_texture_dataset(dir.path());
  const std::vector<std::string> args = {"--data-dir",
                                         dir.path().string(),
                                         "--model",
                                         "resnet8",
                                         "--epochs",
                                         "3",
                                         "--batch-size",
                                         "32",
                                         "--lr",
                                         "0.05",
                                         "--threads",
                                         "1",
                                         "--seed",
                                         "5",
                                         "--checkpoint-dir",
                                         (dir / "ckpt").string(),
                                         "--keep-checkpoints",
                                         "2",
                                         "--save-model",
                                         (dir / "model.pt").string()};
  const auto first = train(args);
  INFO(first.output);
  REQUIRE(first.exit_code == 0);
  CHECK(contains(first.output, "resnet8 on fashion-mnist: 640 train / 200 test images of 1x28x28"));
  CHECK(contains(first.output, "20 steps per epoch"));
  CHECK(contains(first.output, "final: 3 epochs"));
  const auto epochs = epoch_lines(first.output);
  REQUIRE(epochs.size() == 3);
  CHECK(epochs[2].loss < epochs[0].loss);
  // Four balanced classes: chance is 25%.
  CHECK(epochs[2].test_accuracy > 75.0);

  // Same seed, same thread count: the same numbers, epoch by epoch (checkpoints in another
  // folder: a run that does not resume refuses to save below another run's checkpoints).
  auto again_args = args;
  *std::find(again_args.begin(), again_args.end(), (dir / "ckpt").string()) = (dir / "again").string();
  const auto again = epoch_lines(train(again_args).output);
  REQUIRE(again.size() == 3);
  for (std::size_t e = 0; e < 3; ++e) {
    CHECK(again[e].loss == epochs[e].loss);
    CHECK(again[e].test_accuracy == epochs[e].test_accuracy);
  }

  // A checkpoint at each epoch's end (20 steps each), the newest 2 kept.
  CHECK_FALSE(fs::exists(dir / "ckpt" / "checkpoint-000000000020.dtrain"));
  CHECK(fs::exists(dir / "ckpt" / "checkpoint-000000000040.dtrain"));
  CHECK(fs::exists(dir / "ckpt" / "checkpoint-000000000060.dtrain"));
  // The saved model loads into a fresh one and holds the trained weights, not the initial ones.
  REQUIRE(fs::exists(dir / "model.pt"));
  CHECK_FALSE(fs::exists(dir / "model.pt.tmp"));
  torch::manual_seed(5);
  const auto fresh = resnet::make_model("resnet8", {.in_channels = 1, .num_classes = 10});
  auto loaded = resnet::make_model("resnet8", {.in_channels = 1, .num_classes = 10});
  auto as_module = std::static_pointer_cast<torch::nn::Module>(loaded);
  torch::load(as_module, (dir / "model.pt").string());
  CHECK_FALSE(loaded->parameters()[0].equal(fresh->parameters()[0]));
}

TEST_CASE("trainer: step and evaluation limits, --quiet, and the synthetic dataset") {
  const auto result =
      train({"--dataset", "synthetic", "--synthetic-samples", "256", "--image-size", "16",
             "--model", "resnet8", "--epochs", "2", "--batch-size", "16", "--max-steps-per-epoch",
             "5", "--eval-samples", "10", "--threads", "1"});
  INFO(result.output);
  REQUIRE(result.exit_code == 0);
  CHECK(contains(result.output, "resnet8 on synthetic: 256 train / 10 test images of 3x16x16"));
  CHECK(contains(result.output, "5 steps per epoch"));
  CHECK(contains(result.output, "\nthreads: 1 rank x 1 thread on "));
  CHECK(contains(result.output, " cores of this host (--threads)"));
  // ResNet-8 for 3 channels and 10 classes (He et al.: 0.08M), which has one stem only.
  CHECK(contains(result.output, "\nmodel: resnet8, 75290 parameters\n"));
  CHECK(epoch_lines(result.output).size() == 2);

  // An ImageNet-style network says which stem it got: the standard one on 64 px images.
  const auto resnet18 =
      train({"--dataset", "synthetic", "--synthetic-samples", "16", "--image-size", "64",
             "--model", "resnet18", "--epochs", "1", "--batch-size", "4", "--max-steps-per-epoch",
             "1", "--eval-samples", "4", "--threads", "1"});
  INFO(resnet18.output);
  CHECK(resnet18.exit_code == 0);
  CHECK(contains(resnet18.output,
                 "\nmodel: resnet18, 11181642 parameters, standard stem (7x7 stride 2 + "
                 "max-pool), for 64 px images"));

  const auto quiet =
      train({"--dataset", "synthetic", "--synthetic-samples", "64", "--image-size", "8", "--epochs",
             "1", "--batch-size", "16", "--quiet", "--threads", "1"});
  CHECK(quiet.exit_code == 0);
  CHECK(quiet.output.rfind("final: 1 epochs", 0) == 0);
  CHECK(std::count(quiet.output.begin(), quiet.output.end(), '\n') == 1);
}

TEST_CASE("trainer on 2 ranks: learns, and only rank 0 prints") {
  TempDir dir;
  write_texture_dataset(dir.path());
  const auto result = train({"--data-dir", dir.path().string(), "--epochs", "3", "--batch-size",
                             "16", "--lr", "0.05", "--threads", "1", "--seed", "5"},
                            2);
  INFO(result.output);
  REQUIRE(result.exit_code == 0);
  // 640 samples, 320 per rank: 20 steps of 16 per rank, a global batch of 32.
  CHECK(contains(result.output, "2 ranks x batch 16 = 32, 20 steps per epoch"));
  CHECK(count(result.output, "final: 3 epochs in") == 1);
  CHECK(contains(result.output, "on 2 ranks"));
  CHECK(contains(result.output, "\nthreads: 2 ranks x 1 thread on "));
  const auto epochs = epoch_lines(result.output);
  REQUIRE(epochs.size() == 3);
  CHECK(epochs[2].loss < epochs[0].loss);
  CHECK(epochs[2].test_accuracy > 75.0);  // four classes: chance is 25%
}

TEST_CASE("trainer: 2 ranks with batch b end with the weights of 1 rank with batch 2b; fp16 near them, "
          "--shard optimizer and gradients on them") {
  // Group norm: batch norm would normalize each rank's half batch on its own statistics, which a
  // single process with the whole batch does not. Momentum and weight decay are on.
  TempDir dir;
  write_texture_dataset(dir.path());
  auto args = [&](const std::string& batch, const std::string& checkpoint) {
    return std::vector<std::string>{
        "--data-dir", dir.path().string(), "--norm", "group", "--epochs", "2",
        "--max-steps-per-epoch", "4", "--eval-samples", "8", "--batch-size", batch, "--lr",
        "0.05", "--threads", "1", "--seed", "9", "--quiet", "--save-model",
        (dir / checkpoint).string()};
  };
  const auto one = train(args("32", "one.pt"), 1);
  INFO(one.output);
  REQUIRE(one.exit_code == 0);
  const auto two = train(args("16", "two.pt"), 2);
  INFO(two.output);
  REQUIRE(two.exit_code == 0);

  auto load = [&](const std::string& checkpoint) {
    auto model = std::static_pointer_cast<torch::nn::Module>(resnet::make_model(
        "resnet8", {.in_channels = 1, .num_classes = 10, .norm = resnet::Norm::group}));
    torch::load(model, (dir / checkpoint).string());
    return model;
  };
  // Eight steps in float32: the two runs sum the same gradients in a different order, which moves
  // the weights by rounding only (about 1e-7 relative per step, amplified a little by training).
  torch::manual_seed(9);  // the trainer's --seed: its initial weights
  const auto initial = resnet::make_model(
      "resnet8", {.in_channels = 1, .num_classes = 10, .norm = resnet::Norm::group});
  const auto drift = parameter_drift(load("one.pt")->named_parameters(),
                                     load("two.pt")->named_parameters(), initial->named_parameters());
  CHECK(drift.worst < 1e-4);
  CHECK(drift.moved > 1e-3);  // training did change the weights: the comparison is not vacuous

  // --compression fp16: the gradients are rounded to float16 on the wire, so the weights leave
  // the float32 run's (bitwise: two ranks sum in one order every run) but stay close to them.
  auto fp16_args = args("16", "fp16.pt");
  fp16_args.insert(fp16_args.end(), {"--compression", "fp16"});
  const auto fp16 = train(fp16_args, 2);
  INFO(fp16.output);
  REQUIRE(fp16.exit_code == 0);
  const auto rounded = parameter_drift(load("fp16.pt")->named_parameters(),
                                       load("two.pt")->named_parameters(),
                                       initial->named_parameters());
  CHECK(rounded.worst > 0.0);
  CHECK(rounded.worst < 1e-2);

  // --shard optimizer: each rank steps the momentum of half the parameters, from the halves of
  // a reduce-scatter; the weights are the unsharded run's up to the summation order.
  auto sharded_args = args("16", "sharded.pt");
  sharded_args.insert(sharded_args.end(), {"--shard", "optimizer"});
  const auto sharded = train(sharded_args, 2);
  INFO(sharded.output);
  REQUIRE(sharded.exit_code == 0);
  const auto resharded = parameter_drift(load("sharded.pt")->named_parameters(),
                                         load("two.pt")->named_parameters(),
                                         initial->named_parameters());
  CHECK(resharded.worst < 1e-4);

  // --shard gradients: the same, with the gradients reduce-scattered during backward in units.
  auto stage2_args = args("16", "stage2.pt");
  stage2_args.insert(stage2_args.end(), {"--shard", "gradients"});
  const auto stage2 = train(stage2_args, 2);
  INFO(stage2.output);
  REQUIRE(stage2.exit_code == 0);
  const auto stage2_drift = parameter_drift(load("stage2.pt")->named_parameters(),
                                            load("two.pt")->named_parameters(),
                                            initial->named_parameters());
  CHECK(stage2_drift.worst < 1e-4);

  // --compression powersgd and --op adasum reach the optimizer: each trains (the weights move)
  // to weights of its own, not the averaged run's.
  for (const auto& flags : std::vector<std::vector<std::string>>{
           {"--compression", "powersgd", "--powersgd-rank", "2", "--powersgd-start-step", "0"},
           {"--op", "adasum"}}) {
    CAPTURE(flags[0]);
    auto variant_args = args("16", "variant.pt");
    variant_args.insert(variant_args.end(), flags.begin(), flags.end());
    const auto variant = train(variant_args, 2);
    INFO(variant.output);
    REQUIRE(variant.exit_code == 0);
    const auto apart = parameter_drift(load("variant.pt")->named_parameters(),
                                       load("two.pt")->named_parameters(),
                                       initial->named_parameters());
    CHECK(apart.worst > 1e-3);
    CHECK(apart.moved > 1e-3);
  }
}

TEST_CASE("trainer --sync-bn: 2 ranks with batch b train as 1 rank with batch 2b and batch norm") {
  // Batch norm, synchronized: each rank's half batch is normalized with the statistics of the
  // whole one, so the weights and the running statistics are those of one process.
  TempDir dir;
  write_texture_dataset(dir.path());
  auto args = [&](const std::string& batch, const std::string& checkpoint) {
    return std::vector<std::string>{
        "--data-dir", dir.path().string(), "--epochs", "2", "--max-steps-per-epoch", "4",
        "--eval-samples", "8", "--batch-size", batch, "--lr", "0.05", "--threads", "1",
        "--seed", "9", "--save-model", (dir / checkpoint).string()};
  };
  const auto one = train(args("32", "one.pt"), 1);
  INFO(one.output);
  REQUIRE(one.exit_code == 0);
  auto two_args = args("16", "two.pt");
  two_args.push_back("--sync-bn");
  const auto two = train(two_args, 2);
  INFO(two.output);
  REQUIRE(two.exit_code == 0);
  CHECK(contains(two.output, "\nmodel: resnet8, 75002 parameters, 7 SyncBatchNorm layers\n"));

  // The converted model's state has BatchNorm's names: it loads into the plain model.
  auto load = [&](const std::string& checkpoint) {
    auto model = std::static_pointer_cast<torch::nn::Module>(
        resnet::make_model("resnet8", {.in_channels = 1, .num_classes = 10}));
    torch::load(model, (dir / checkpoint).string());
    return model;
  };
  torch::manual_seed(9);
  const auto initial = resnet::make_model("resnet8", {.in_channels = 1, .num_classes = 10});
  const auto a = load("one.pt"), b = load("two.pt");
  const auto weights = parameter_drift(a->named_parameters(), b->named_parameters(),
                                       initial->named_parameters());
  CHECK(weights.worst < 1e-4);
  CHECK(weights.moved > 1e-3);
  const auto statistics = parameter_drift(a->named_buffers(), b->named_buffers(),
                                          initial->named_buffers());
  CHECK(statistics.worst < 1e-4);
  CHECK(statistics.moved > 1e-3);
}
