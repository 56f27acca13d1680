// Trains a ResNet classifier with SGD + momentum on Fashion-MNIST (default), CIFAR-10, a folder of
// images, or synthetic data, printing one line per epoch and a summary.
//
//   resnet_train --model resnet8 --epochs 3
//   resnet_train --dataset cifar10 --data-dir ~/data/cifar-10-batches-bin --model resnet20
//   --augment

#include <fmt/core.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <numbers>
#include <random>
#include <thread>
#include <vector>

#include "datasets.hpp"
#include "models.hpp"
#include "options.hpp"

namespace {

using resnet::Classifier;
using resnet::Dataset;
using resnet::DataSplits;
using resnet::TrainOptions;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

DataSplits load_data(const TrainOptions& options) {
  if (options.dataset == "fashion-mnist") {
    return resnet::load_fashion_mnist(options.data_dir.empty() ? resnet::default_fashion_mnist_dir
                                                               : options.data_dir);
  }
  if (options.dataset == "cifar10") {
    if (options.data_dir.empty()) {
      throw resnet::DatasetError(
          "--dataset cifar10 needs --data-dir: the folder with "
          "data_batch_1.bin .. data_batch_5.bin and test_batch.bin");
    }
    return resnet::load_cifar10(options.data_dir);
  }
  if (options.dataset == "imagefolder") {
    if (options.data_dir.empty()) {
      throw resnet::DatasetError(
          "--dataset imagefolder needs --data-dir: a folder with "
          "train/<class>/<image> and val/<class>/<image>");
    }
    return resnet::load_image_folder_splits(
        options.data_dir, {.image_size = options.image_size > 0 ? options.image_size : 64});
  }
  const auto samples = options.synthetic_samples;
  return resnet::make_synthetic({.train_samples = samples,
                                 .test_samples = std::max<std::int64_t>(1, samples / 8),
                                 .image_size = options.image_size > 0 ? options.image_size : 32,
                                 .seed = options.seed});
}

// The order in which one epoch visits the training set: a permutation that depends only on the
// seed and the epoch, so a run can be repeated exactly.
std::vector<std::int64_t> epoch_order(std::int64_t dataset_size, std::uint64_t seed,
                                      std::int64_t epoch) {
  std::vector<std::int64_t> order(static_cast<std::size_t>(dataset_size));
  for (std::int64_t i = 0; i < dataset_size; ++i) order[static_cast<std::size_t>(i)] = i;
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + static_cast<std::uint64_t>(epoch));
  for (std::size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[rng() % i]);
  return order;
}

// Linear warmup from 0 to the peak rate, then cosine decay to 0 at the last step.
struct LearningRateSchedule {
  double peak;
  std::int64_t warmup_steps;
  std::int64_t total_steps;

  double at(std::int64_t step) const {
    if (step < warmup_steps) return peak * static_cast<double>(step + 1) / warmup_steps;
    const double progress = static_cast<double>(step - warmup_steps) /
                            std::max<std::int64_t>(1, total_steps - warmup_steps);
    return 0.5 * peak * (1.0 + std::cos(std::numbers::pi * progress));
  }
};

void set_learning_rate(torch::optim::SGD& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) {
    static_cast<torch::optim::SGDOptions&>(group.options()).lr(lr);
  }
}

// Sums over the samples a phase has seen; the per-epoch report divides them.
struct Totals {
  double loss_sum = 0.0;
  std::int64_t correct = 0;
  std::int64_t samples = 0;
  double seconds = 0.0;
};

void accumulate(Totals& totals, const torch::Tensor& logits, const torch::Tensor& labels,
                const torch::Tensor& loss) {
  const auto n = labels.size(0);
  totals.loss_sum += loss.item<double>() * static_cast<double>(n);
  totals.correct += logits.argmax(1).eq(labels).sum().item<std::int64_t>();
  totals.samples += n;
}

std::int64_t steps_per_epoch(const TrainOptions& options, std::int64_t train_samples) {
  // Full batches only: a batch of one sample would break batch norm's training statistics.
  auto steps = std::max<std::int64_t>(1, train_samples / options.batch_size);
  if (options.max_steps_per_epoch > 0) steps = std::min(steps, options.max_steps_per_epoch);
  return steps;
}

Totals train_one_epoch(Classifier& model, torch::optim::SGD& optimizer, const Dataset& train,
                       const std::vector<std::int64_t>& order, const TrainOptions& options,
                       const LearningRateSchedule& schedule, std::int64_t first_step,
                       torch::Generator& augment_rng) {
  model.train();
  Totals totals;
  const auto start = Clock::now();
  const auto steps = steps_per_epoch(options, static_cast<std::int64_t>(order.size()));
  const auto batch_size = std::min<std::int64_t>(options.batch_size, train.size());
  const auto pad = train.images.size(2) >= 32 ? 4 : 2;
  for (std::int64_t step = 0; step < steps; ++step) {
    const auto indices =
        torch::tensor(std::vector<std::int64_t>(order.begin() + step * batch_size,
                                                order.begin() + (step + 1) * batch_size),
                      torch::kLong);
    auto batch = train.subset(indices);
    if (options.augment) batch.images = resnet::augment_batch(batch.images, pad, true, augment_rng);

    set_learning_rate(optimizer, schedule.at(first_step + step));
    optimizer.zero_grad();
    const auto logits = model.forward(batch.images);
    const auto loss = torch::nn::functional::cross_entropy(logits, batch.labels);
    loss.backward();
    optimizer.step();
    accumulate(totals, logits.detach(), batch.labels, loss.detach());
  }
  totals.seconds = seconds_since(start);
  return totals;
}

Totals evaluate(Classifier& model, const Dataset& test, std::int64_t batch_size) {
  torch::NoGradGuard no_grad;
  model.eval();
  Totals totals;
  const auto start = Clock::now();
  for (std::int64_t begin = 0; begin < test.size(); begin += batch_size) {
    const auto n = std::min(batch_size, test.size() - begin);
    const auto images = test.images.narrow(0, begin, n);
    const auto labels = test.labels.narrow(0, begin, n);
    const auto logits = model.forward(images);
    accumulate(totals, logits, labels, torch::nn::functional::cross_entropy(logits, labels));
  }
  totals.seconds = seconds_since(start);
  return totals;
}

struct EpochReport {
  double train_loss;
  double train_accuracy;
  double test_loss;
  double test_accuracy;
  double images_per_second;  // training throughput
  double seconds;            // training + evaluation
};

// Every metric the trainer prints is derived here, from the sums of one epoch.
EpochReport summarize(const Totals& train, const Totals& test) {
  auto ratio = [](double numerator, std::int64_t count) {
    return count > 0 ? numerator / static_cast<double>(count) : 0.0;
  };
  return {ratio(train.loss_sum, train.samples),
          ratio(static_cast<double>(train.correct), train.samples),
          ratio(test.loss_sum, test.samples),
          ratio(static_cast<double>(test.correct), test.samples),
          train.seconds > 0 ? static_cast<double>(train.samples) / train.seconds : 0.0,
          train.seconds + test.seconds};
}

void save_checkpoint(const std::filesystem::path& dir, const std::shared_ptr<Classifier>& model,
                     const torch::optim::SGD& optimizer) {
  std::filesystem::create_directories(dir);
  // Written next to the target and renamed, so an interrupted run never leaves half a file.
  auto save = [&dir](const std::string& name, auto&& write) {
    const auto tmp = dir / (name + ".tmp");
    write(tmp.string());
    std::filesystem::rename(tmp, dir / name);
  };
  save("model.pt", [&](const std::string& path) {
    torch::save(std::static_pointer_cast<torch::nn::Module>(model), path);
  });
  save("optimizer.pt", [&](const std::string& path) { torch::save(optimizer, path); });
}

int run(const TrainOptions& options) {
  // Checked before the data is loaded, which takes a while.
  const auto models = resnet::model_names();
  if (std::find(models.begin(), models.end(), options.model) == models.end()) {
    std::string accepted;
    for (const auto& name : models) accepted += (accepted.empty() ? "" : ", ") + name;
    throw resnet::UsageError("--model must be one of " + accepted + ", got " + options.model);
  }
  const auto threads = options.threads > 0
                           ? options.threads
                           : std::max<std::int64_t>(1, std::thread::hardware_concurrency());
  torch::set_num_threads(static_cast<int>(threads));
  torch::manual_seed(options.seed);

  const auto load_start = Clock::now();
  const DataSplits data = load_data(options);
  const Dataset test = options.eval_samples > 0 && options.eval_samples < data.test.size()
                           ? Dataset{data.test.images.narrow(0, 0, options.eval_samples),
                                     data.test.labels.narrow(0, 0, options.eval_samples)}
                           : data.test;

  const auto model = resnet::make_model(
      options.model, {.in_channels = data.channels(), .num_classes = data.num_classes()});
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(options.lr)
                                                       .momentum(options.momentum)
                                                       .weight_decay(options.weight_decay));

  const auto steps = steps_per_epoch(options, data.train.size());
  const LearningRateSchedule schedule{
      options.lr, static_cast<std::int64_t>(std::llround(options.warmup_epochs * steps)),
      options.epochs * steps};
  auto augment_rng = at::detail::createCPUGenerator(options.seed + 1);

  const auto& shape = data.train.images.sizes();
  if (!options.quiet) {
    fmt::print(
        "{} on {}: {} train / {} test images of {}x{}x{}, {} classes; batch {}, {} steps "
        "per epoch, lr {}, {} threads; data loaded in {:.1f} s\n",
        options.model, options.dataset, data.train.size(), test.size(), shape[1], shape[2],
        shape[3], data.num_classes(), options.batch_size, steps, options.lr, threads,
        seconds_since(load_start));
    std::fflush(stdout);
  }

  const auto run_start = Clock::now();
  EpochReport last{};
  double best_accuracy = 0.0;
  double train_seconds = 0.0;
  std::int64_t train_images = 0;
  for (std::int64_t epoch = 1; epoch <= options.epochs; ++epoch) {
    const auto order = epoch_order(data.train.size(), options.seed, epoch);
    const Totals train = train_one_epoch(*model, optimizer, data.train, order, options, schedule,
                                         (epoch - 1) * steps, augment_rng);
    const Totals tested = evaluate(*model, test, std::max<std::int64_t>(options.batch_size, 256));
    last = summarize(train, tested);
    best_accuracy = std::max(best_accuracy, last.test_accuracy);
    train_seconds += train.seconds;
    train_images += train.samples;
    if (!options.quiet) {
      fmt::print(
          "epoch {:>3}/{}  loss {:.4f}  train acc {:6.2f}%  test loss {:.4f}  test acc "
          "{:6.2f}%  {:7.1f} img/s  {:6.1f} s\n",
          epoch, options.epochs, last.train_loss, 100 * last.train_accuracy, last.test_loss,
          100 * last.test_accuracy, last.images_per_second, last.seconds);
      std::fflush(stdout);
    }
    if (!options.checkpoint_dir.empty()) save_checkpoint(options.checkpoint_dir, model, optimizer);
  }
  fmt::print(
      "final: {} epochs in {:.1f} s, test accuracy {:.2f}% (best {:.2f}%), train loss "
      "{:.4f}, {:.1f} img/s\n",
      options.epochs, seconds_since(run_start), 100 * last.test_accuracy, 100 * best_accuracy,
      last.train_loss, train_seconds > 0 ? static_cast<double>(train_images) / train_seconds : 0.0);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string program =
      argc > 0 ? std::filesystem::path(argv[0]).filename().string() : std::string("resnet_train");
  try {
    const TrainOptions options = resnet::parse_options(argc, argv);
    if (options.help) {
      fmt::print("{}", resnet::usage(program));
      return 0;
    }
    return run(options);
  } catch (const resnet::UsageError& e) {
    fmt::print(stderr, "{}: {}\n\n{}", program, e.what(), resnet::usage(program));
    return 2;
  } catch (const std::exception& e) {
    fmt::print(stderr, "{}: error: {}\n", program, e.what());
    return 1;
  }
}
