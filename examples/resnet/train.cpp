// Trains a ResNet classifier with SGD + momentum on Fashion-MNIST (default), CIFAR-10, a folder of
// images, or synthetic data, printing one line per epoch and a summary.
//
// It is an ordinary single-process libtorch trainer plus the dtrain lines marked "dtrain:", which
// make it data-parallel: start it with `mpiexec -n 4 resnet_train ...` and every rank trains on its
// own quarter of each epoch, with gradients averaged before every step.
//
//   mpiexec -n 2 resnet_train --model resnet8 --epochs 3
//   mpiexec -n 4 resnet_train --lr 0.05 --scale-lr --warmup-epochs 2
//   mpiexec -n 4 resnet_train --batch-size 8 --sync-bn  # batch norm over the 32 images of a step
//   resnet_train --dataset cifar10 --data-dir ~/data/cifar-10-batches-bin --augment
//   dtrainrun -np 4 --restarts 3 resnet_train --checkpoint-dir ckpt --checkpoint-every 200 --resume
//
// With --checkpoint-dir it checkpoints its whole training state (dtrain::Checkpoint); a job that is
// killed and started again with --resume ends with the weights, bit for bit, of one that was never
// interrupted. With DTRAIN_PROFILE=<folder> each rank records where its steps spend their time
// (the phases marked in the training loop; docs/profiling.md).

#include <fmt/core.h>
#include <mpi.h>
#include <sched.h>
#include <torch/torch.h>

#include <dtrain/torch.hpp>  // dtrain: the SDK, with its libtorch support
#if defined(RESNET_WITH_DTRAIN_CUDA)
#include <dtrain/cuda.hpp>  // dtrain: allreduce of CUDA tensors over NCCL
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <utility>
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

// The cores this process may run on (its affinity mask: taskset, cgroup cpusets, a launcher's
// binding), which can be fewer than the machine has.
std::int64_t usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max<std::int64_t>(1, std::thread::hardware_concurrency());
}

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

// Sums over the samples a phase has seen on this rank; the per-epoch report averages them over
// every rank.
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

// dtrain: every rank takes the same number of steps (an extra step on one rank would leave the
// others waiting for its gradients). The sampler pads the epoch so every rank's shard has the same
// length; only full batches are used, as one sample would break batch norm's statistics.
std::int64_t steps_per_epoch(const TrainOptions& options,
                             const dtrain::DistributedSampler& sampler) {
  auto steps = std::max<std::int64_t>(1, sampler.num_batches(options.batch_size, true));
  if (options.max_steps_per_epoch > 0) steps = std::min(steps, options.max_steps_per_epoch);
  return steps;
}

// Trains `steps` steps on the front of `shard`; batch b at the rate `learning_rate(b)`.
// `after_step(b)` runs after the step of batch b, inside the step's profile.
template <class Optimizer>
Totals train_one_epoch(Classifier& model, Optimizer& optimizer, torch::optim::SGD& sgd,
                       const Dataset& train, const std::vector<std::int64_t>& shard,
                       const TrainOptions& options,
                       const std::function<double(std::int64_t)>& learning_rate,
                       std::int64_t steps, torch::Generator& augment_rng,
                       const torch::Device& device, dtrain::Profiler& profiler,
                       const std::function<void(std::int64_t)>& after_step) {
  model.train();
  Totals totals;
  const auto start = Clock::now();
  const auto batch_size = std::min<std::int64_t>(options.batch_size,
                                                 static_cast<std::int64_t>(shard.size()));
  const auto pad = train.images.size(2) >= 32 ? 4 : 2;
  for (std::int64_t step = 0; step < steps; ++step) {
    auto profiled_step = profiler.step(batch_size);  // dtrain: one step, phase by phase
    Dataset batch;
    {
      auto phase = profiler.phase(dtrain::Phase::data);
      const auto begin = shard.begin() + step * batch_size;
      const auto indices =
          torch::tensor(std::vector<std::int64_t>(begin, begin + batch_size), torch::kLong);
      batch = train.subset(indices);
      if (options.augment) batch.images = resnet::augment_batch(batch.images, pad, true, augment_rng);
      batch.images = batch.images.to(device);
      batch.labels = batch.labels.to(device);
    }
    torch::Tensor logits, loss;
    {
      auto phase = profiler.phase(dtrain::Phase::forward);
      logits = model.forward(batch.images);
      loss = torch::nn::functional::cross_entropy(logits, batch.labels);
    }
    {
      // dtrain: hooks put each gradient in a bucket as soon as backward has made it.
      auto phase = profiler.phase(dtrain::Phase::backward);
      loss.backward();
    }
    {
      auto phase = profiler.phase(dtrain::Phase::communication_wait);
      optimizer.synchronize();  // dtrain: submits what the buckets hold; every gradient averaged
    }
    {
      auto phase = profiler.phase(dtrain::Phase::optimizer);
      auto synchronized = optimizer.skip_synchronize();  // dtrain: already averaged above
      dtrain::set_learning_rate(sgd, learning_rate(step));
      optimizer.step();
      optimizer.zero_grad();
    }
    accumulate(totals, logits.detach(), batch.labels, loss.detach());
    after_step(step);
  }
  totals.seconds = seconds_since(start);
  return totals;
}

// dtrain: batch norm's running statistics are updated from each rank's own batches; evaluation
// and checkpoints use their average over the ranks, so every rank holds the same model. (With
// --sync-bn they are equal on every rank already, and stay so.)
void average_buffers(torch::nn::Module& model) {
  std::vector<torch::Tensor> statistics;
  for (const auto& buffer : model.buffers())
    if (buffer.is_floating_point()) statistics.push_back(buffer);
  if (!statistics.empty()) dtrain::grouped_allreduce(statistics, {.name = "model.buffers"});
}

// dtrain: each rank evaluates its own contiguous slice of the test set; the report sums them.
Totals evaluate(Classifier& model, const Dataset& test, std::int64_t batch_size,
                const torch::Device& device) {
  torch::NoGradGuard no_grad;
  model.eval();
  Totals totals;
  const auto start = Clock::now();
  const auto ranks = static_cast<std::int64_t>(dtrain::size());
  const auto rank = static_cast<std::int64_t>(dtrain::rank());
  const auto first = test.size() * rank / ranks, last = test.size() * (rank + 1) / ranks;
  for (std::int64_t begin = first; begin < last; begin += batch_size) {
    const auto n = std::min(batch_size, last - begin);
    const auto images = test.images.narrow(0, begin, n).to(device);
    const auto labels = test.labels.narrow(0, begin, n).to(device);
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
  double images_per_second;  // training throughput of all ranks together
  double seconds;            // training + evaluation, slowest rank
  std::int64_t train_images;  // all ranks
};

// dtrain: averages the epoch's metrics over every rank, weighted by the samples each rank saw.
// Collective: every rank calls it once per epoch.
EpochReport summarize(const Totals& train, const Totals& test,
                      const dtrain::ThroughputMeter::EpochStats& throughput, double eval_seconds) {
  dtrain::MetricAverager metrics;
  const auto n_train = static_cast<double>(train.samples);
  const auto n_test = static_cast<double>(test.samples);
  metrics.add("train.loss", n_train > 0 ? train.loss_sum / n_train : 0.0, n_train);
  metrics.add("train.accuracy", n_train > 0 ? static_cast<double>(train.correct) / n_train : 0.0,
              n_train);
  metrics.add("test.loss", n_test > 0 ? test.loss_sum / n_test : 0.0, n_test);
  metrics.add("test.accuracy", n_test > 0 ? static_cast<double>(test.correct) / n_test : 0.0,
              n_test);
  const auto average = metrics.average();
  return {average.at("train.loss"),         average.at("train.accuracy"),
          average.at("test.loss"),          average.at("test.accuracy"),
          throughput.samples_per_second,    throughput.seconds + eval_seconds,
          throughput.global_samples};
}

// Written next to the target and renamed, so an interrupted run never leaves half a file.
void save_model(const std::filesystem::path& file, const std::shared_ptr<Classifier>& model) {
  if (file.has_parent_path()) std::filesystem::create_directories(file.parent_path());
  auto tmp = file;
  tmp += ".tmp";
  torch::save(std::static_pointer_cast<torch::nn::Module>(model), tmp.string());
  std::filesystem::rename(tmp, file);
}

// FNV-1a over the bytes of every parameter, buffer and momentum buffer: equal fingerprints mean
// (practically) bitwise-equal training states, which is what a restarted run must end with.
std::uint64_t fingerprint(const torch::nn::Module& model, torch::optim::SGD& sgd) {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  auto mix = [&h](const torch::Tensor& t) {
    const auto cpu = t.detach().to(torch::kCPU).contiguous();
    const auto* p = static_cast<const unsigned char*>(cpu.data_ptr());
    for (std::size_t i = 0; i < cpu.nbytes(); ++i) h = (h ^ p[i]) * 0x100000001b3ULL;
  };
  for (const auto& p : model.parameters()) mix(p);
  for (const auto& b : model.buffers()) mix(b);
  for (const auto& group : sgd.param_groups())
    for (const auto& p : group.params()) {
      const auto it = sgd.state().find(p.unsafeGetTensorImpl());
      if (it != sgd.state().end())
        mix(static_cast<const torch::optim::SGDParamState&>(*it->second).momentum_buffer());
    }
  return h;
}

// dtrain: between two epoch ends each rank's batch-norm statistics are its own (average_buffers
// makes them equal at the end of the epoch), so a checkpoint keeps every rank's.
using NamedBuffers = std::vector<std::pair<std::string, torch::Tensor>>;

NamedBuffers named_buffers(const torch::nn::Module& model) {
  NamedBuffers out;
  for (const auto& item : model.named_buffers()) out.emplace_back(item.key(), item.value());
  return out;
}

void load_buffers(torch::nn::Module& model, const NamedBuffers& saved) {
  auto own = model.named_buffers();
  if (own.size() != saved.size())
    throw std::runtime_error(fmt::format("the checkpoint holds {} buffers per rank, this model {}",
                                         saved.size(), own.size()));
  torch::NoGradGuard no_grad;
  for (const auto& [name, value] : saved) {
    auto* target = own.find(name);
    if (target == nullptr || target->sizes() != value.sizes())
      throw std::runtime_error("the checkpoint's per-rank buffer '" + name + "' does not fit this model");
    target->copy_(value);
  }
}

int run(const TrainOptions& options) {
  // Checked before the data is loaded, which takes a while.
  const auto models = resnet::model_names();
  if (std::find(models.begin(), models.end(), options.model) == models.end()) {
    std::string accepted;
    for (const auto& name : models) accepted += (accepted.empty() ? "" : ", ") + name;
    throw resnet::UsageError("--model must be one of " + accepted + ", got " + options.model);
  }
  const bool is_root = dtrain::rank() == 0;  // dtrain: one rank prints and writes files
  const bool report = is_root && !options.quiet;
  // dtrain: ranks on one host share its cores instead of each starting one thread per core.
  const auto threads = resnet::choose_threads(options.threads, usable_cores(), dtrain::local_size());
  torch::set_num_threads(static_cast<int>(threads.threads));
  torch::manual_seed(options.seed);
  // dtrain: with GPUs, each rank on a host takes its own, by local rank.
  const torch::Device device =
      torch::cuda::is_available()
          ? torch::Device(torch::kCUDA, static_cast<torch::DeviceIndex>(
                                            dtrain::local_rank() % torch::cuda::device_count()))
          : torch::Device(torch::kCPU);

  const auto load_start = Clock::now();
  const DataSplits data = load_data(options);
  const Dataset test = options.eval_samples > 0 && options.eval_samples < data.test.size()
                           ? Dataset{data.test.images.narrow(0, 0, options.eval_samples),
                                     data.test.labels.narrow(0, 0, options.eval_samples)}
                           : data.test;

  // dtrain: --sync-bn: every batch norm takes its statistics from all ranks' batches together,
  // built as dtrain::SyncBatchNorm2d where plain batch norm builds torch::nn::BatchNorm2d.
  const auto norm = options.norm == "group" ? resnet::Norm::group
                    : options.sync_bn       ? resnet::Norm::sync_batch
                                            : resnet::Norm::batch;
  const auto stem = resnet::choose_stem(options.model, options.stem, data.train.images.size(3));
  const auto model = resnet::make_model(options.model, {.in_channels = data.channels(),
                                                        .num_classes = data.num_classes(),
                                                        .small_input_stem = stem.small_input_stem,
                                                        .norm = norm});
  std::int64_t synchronized_norms = 0;
  for (const auto& module : model->modules(/*include_self=*/false))
    synchronized_norms += module->as<dtrain::SyncBatchNorm>() != nullptr ? 1 : 0;
  dtrain::broadcast_module(*model);  // dtrain: every rank starts from rank 0's weights
  model->to(device);
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(options.lr)
                                                 .momentum(options.momentum)
                                                 .weight_decay(options.weight_decay));
  // dtrain: gradients are averaged over the ranks (in buckets; --bucket-mb to choose their size).
  dtrain::DistributedOptimizerOptions sync_options;
  if (options.bucket_mb >= 0)
    sync_options.bucket_bytes = static_cast<std::int64_t>(options.bucket_mb * (1 << 20));
  // dtrain: --compression fp16/bf16: gradients cross the network as 16-bit floats.
  sync_options.compression = options.compression == "fp16"   ? dtrain::Compression::fp16
                             : options.compression == "bf16" ? dtrain::Compression::bf16
                                                             : dtrain::Compression::none;
  dtrain::DistributedOptimizer optimizer(sgd, model->named_parameters(), sync_options);

  // dtrain: this rank's shard of every epoch, a permutation fixed by (seed, epoch).
  dtrain::DistributedSampler sampler(data.train.size(),
                                     {.parts = dtrain::size(), .part = dtrain::rank()},
                                     {.shuffle = true, .seed = options.seed});
  const auto steps = steps_per_epoch(options, sampler);
  // dtrain: with --scale-lr the rate ramps from --lr to --lr x ranks over the warmup epochs (the
  // global batch is ranks x --batch-size), then decays to 0 along a cosine.
  dtrain::LrScheduleOptions lr_options;
  lr_options.base_lr = options.lr;
  lr_options.world_size = dtrain::size();
  lr_options.scale_by_world_size = options.scale_lr;
  lr_options.warmup_epochs = options.warmup_epochs;
  lr_options.steps_per_epoch = steps;
  lr_options.decay = dtrain::Decay::cosine;
  lr_options.total_epochs = static_cast<double>(options.epochs);
  const dtrain::LrSchedule schedule(lr_options);
  // Augmentation differs per rank, as it would for different samples in one process.
  const auto augment_seed = [&](std::int64_t step) {
    return options.seed + 1 + static_cast<std::uint64_t>(dtrain::rank()) +
           1000003 * static_cast<std::uint64_t>(step);
  };
  auto augment_rng = at::detail::createCPUGenerator(augment_seed(0));

  const auto& shape = data.train.images.sizes();
  if (report) {
    fmt::print(
        "{} on {}: {} train / {} test images of {}x{}x{}, {} classes; {} ranks x batch {} = {}, "
        "{} steps per epoch, lr {} (peak {}), {} threads per rank on {}; data loaded in {:.1f} s\n",
        options.model, options.dataset, data.train.size(), test.size(), shape[1], shape[2],
        shape[3], data.num_classes(), dtrain::size(), options.batch_size,
        options.batch_size * dtrain::size(), steps, options.lr, schedule.peak_lr(),
        threads.threads, device.str(), seconds_since(load_start));
    fmt::print("threads: {}\n", threads.description);
    if (options.compression != "none")
      fmt::print("gradients travel as {} (--compression)\n", options.compression);
    std::int64_t parameters = 0;
    for (const auto& p : model->parameters()) parameters += p.numel();
    fmt::print("model: {}, {} parameters{}{}{}\n", options.model, parameters,
               stem.description.empty() ? "" : ", ", stem.description,
               options.sync_bn ? fmt::format(", {} SyncBatchNorm layers", synchronized_norms)
                               : std::string());
    std::fflush(stdout);
  }

  // dtrain: checkpoints of the whole training state, and resuming from the newest valid one.
  // Another world size is refused: the global batch, the steps per epoch and with them the
  // learning-rate schedule would change under the run.
  std::optional<dtrain::Checkpoint> checkpoint;
  // dtrain: with --elastic, commits to each host's own folder instead, and dtrainrun's resizes.
  std::optional<dtrain::elastic::State> elastic;
  if (options.elastic)
    elastic.emplace(dtrain::elastic::Options{
        .directory = options.checkpoint_dir,
        .commit_every = options.checkpoint_every,
        .keep_last = static_cast<int>(options.keep_checkpoints)});
  else if (!options.checkpoint_dir.empty())
    checkpoint.emplace(dtrain::CheckpointOptions{
        .directory = options.checkpoint_dir,
        .keep_last = static_cast<int>(options.keep_checkpoints),
        .on_world_size_change = dtrain::WorldSizeChange::refuse});
  std::int64_t step = 0;  // optimizer steps so far, over all epochs: sets the learning rate
  std::int64_t first_epoch = 1;
  bool resumed = false;
  const bool has_buffers = !model->buffers().empty();
  if (options.resume && checkpoint) {
    if (auto restored = checkpoint->restore()) {  // collective: rank 0 reads, every rank loads
      restored->load("model", *model);            // in place: the optimizer keeps its parameters
      restored->load("optimizer", sgd);
      dtrain::set_torch_rng_state(restored->get<dtrain::TorchRngState>("torch_rng"));
      if (has_buffers) load_buffers(*model, restored->get<NamedBuffers>("rank_buffers"));
      if (options.augment) restored->load("augment_rng", augment_rng);
      const auto position = restored->get<dtrain::SamplerState>("sampler");
      sampler.load_state(position);  // the rest of the interrupted epoch
      step = restored->step();
      first_epoch = position.epoch;
      resumed = true;
      if (report)
        fmt::print("resumed from {}: step {}, epoch {}, sample {} of {} in it\n",
                   restored->file(), step, first_epoch, position.position,
                   data.train.size());
    } else if (report) {
      fmt::print("no checkpoint in {}: starting afresh\n", options.checkpoint_dir);
    }
  }
  if (elastic) {
    if (auto restored = elastic->restore()) {  // dtrain: the newest commit any host holds
      restored->load("model", *model);
      restored->load("optimizer", sgd);  // momentum intact across the resize
      dtrain::set_torch_rng_state(restored->get<dtrain::TorchRngState>("torch_rng"));
      const auto position = restored->get<dtrain::SamplerState>("sampler");
      sampler.load_state(position);  // dtrain: the rest of the epoch, re-sharded over this world
      step = restored->step();
      first_epoch = position.epoch;
      resumed = true;
      if (report)
        fmt::print("generation {}: resumed from the commit of step {}: epoch {}, sample {} of {} "
                   "in it, committed by {} ranks, {} now\n",
                   elastic->generation(), step, first_epoch, position.position,
                   data.train.size(), restored->world_size(), dtrain::size());
    }
    // A commit holds no per-rank state: each world seeds augmentation afresh.
    augment_rng = at::detail::createCPUGenerator(augment_seed(step));
  }
  // Every rank calls save() at the same step; rank 0 writes in the background. `taken`: the
  // samples this rank has used of the sampler's current order.
  auto save = [&](std::int64_t epoch, std::int64_t taken) {
    const dtrain::SamplerState position = sampler.state(taken);
    const auto torch_rng = dtrain::torch_rng_state();
    const auto buffers = named_buffers(*model);
    const dtrain::TrainingProgress progress{.step = step, .epoch = epoch};
    if (has_buffers && options.augment)
      checkpoint->save(progress, {{"model", *model}, {"optimizer", sgd}, {"sampler", position},
                                  {"torch_rng", torch_rng}},
                       {{"rank_buffers", buffers}, {"augment_rng", augment_rng}});
    else if (has_buffers)
      checkpoint->save(progress, {{"model", *model}, {"optimizer", sgd}, {"sampler", position},
                                  {"torch_rng", torch_rng}},
                       {{"rank_buffers", buffers}});
    else if (options.augment)
      checkpoint->save(progress, {{"model", *model}, {"optimizer", sgd}, {"sampler", position},
                                  {"torch_rng", torch_rng}},
                       {{"augment_rng", augment_rng}});
    else
      checkpoint->save(progress, {{"model", *model}, {"optimizer", sgd}, {"sampler", position},
                                  {"torch_rng", torch_rng}});
  };

  // dtrain: each host's writer commits the shared state; batch-norm statistics are made shared
  // first. At a commit where dtrainrun asks for a resize, every rank leaves with status 75.
  auto commit = [&](std::int64_t epoch, std::int64_t taken, bool may_leave) {
    average_buffers(*model);
    const dtrain::SamplerState position = sampler.state(taken);
    const auto torch_rng = dtrain::torch_rng_state();
    elastic->commit({.step = step, .epoch = epoch}, {{"model", *model}, {"optimizer", sgd},
                                                     {"sampler", position},
                                                     {"torch_rng", torch_rng}});
    if (may_leave && elastic->resize_requested()) {
      if (report) {
        fmt::print("generation {}: committed step {}; leaving for a world of {} ranks\n",
                   elastic->generation(), step, elastic->next_world_size());
        std::fflush(stdout);
      }
      elastic->exit_for_resize();
    }
  };
  // --elastic: the rate of this world's schedule at the epoch's fractional progress, which does
  // not depend on the world size as a step count does.
  const auto epoch_progress = [&](std::int64_t epoch, std::int64_t position) {
    return static_cast<double>(epoch - 1) +
           static_cast<double>(position) / static_cast<double>(data.train.size());
  };

  const auto run_start = Clock::now();
  EpochReport last{};
  double best_accuracy = 0.0;
  double train_seconds = 0.0;
  std::int64_t train_images = 0;
  std::int64_t epochs_run = 0;
  dtrain::ThroughputMeter throughput;  // dtrain: images/s of all ranks together
  dtrain::Profiler profiler;  // dtrain: DTRAIN_PROFILE=<folder> records where each step's time goes
  for (std::int64_t epoch = first_epoch; epoch <= options.epochs; ++epoch) {
    sampler.set_epoch(epoch);  // keeps a resumed position in its own epoch
    const std::int64_t position = sampler.state(0).position;
    const std::int64_t per_step = options.batch_size * dtrain::size();
    // After a resume: the steps of this epoch that are left, on the rest of its order. With
    // --elastic, counted from the position, as earlier worlds may have had other sizes (and
    // --max-steps-per-epoch ends the epoch at that many steps' samples of this world).
    std::int64_t epoch_steps = steps - (step - (epoch - 1) * steps);
    if (elastic) {
      epoch_steps = sampler.remaining() / options.batch_size;
      if (options.max_steps_per_epoch > 0)
        epoch_steps = std::clamp<std::int64_t>(options.max_steps_per_epoch - position / per_step,
                                               0, epoch_steps);
    }
    throughput.start_epoch();
    const auto after_step = [&](std::int64_t b) {
      ++step;
      if (checkpoint && options.checkpoint_every > 0 && step % options.checkpoint_every == 0 &&
          b + 1 < epoch_steps) {
        auto phase = profiler.phase("checkpoint");
        save(epoch, (b + 1) * options.batch_size);
      }
      if (elastic && elastic->commit_due(step) && b + 1 < epoch_steps) {
        auto phase = profiler.phase("checkpoint");
        commit(epoch, (b + 1) * options.batch_size, true);
      }
      if (step == options.crash_after_step && !resumed) {
        // The checkpoints so far are on disk before the crash, so the restart's starting point
        // is known: the newest one at or before this step.
        if (checkpoint) checkpoint->wait();
        if (elastic) elastic->wait();
        dtrain::barrier();
        if (dtrain::rank() == options.crash_rank) std::raise(SIGKILL);
      }
    };
    const std::int64_t first_step = step;
    const auto learning_rate = [&](std::int64_t b) {
      return elastic ? schedule.lr_at_epoch(epoch_progress(epoch, position + b * per_step))
                     : schedule.lr_at_step(first_step + b);
    };
    const Totals train = train_one_epoch(*model, optimizer, sgd, data.train, sampler.indices(),
                                         options, learning_rate, epoch_steps, augment_rng,
                                         device, profiler, after_step);
    throughput.add_samples(train.samples);
    ++epochs_run;
    const auto trained = throughput.end_epoch();
    average_buffers(*model);
    const Totals tested =
        evaluate(*model, test, std::max<std::int64_t>(options.batch_size, 256), device);
    last = summarize(train, tested, trained, tested.seconds);
    best_accuracy = std::max(best_accuracy, last.test_accuracy);
    train_seconds += trained.seconds;
    train_images += last.train_images;
    if (report) {
      fmt::print(
          "epoch {:>3}/{}  loss {:.4f}  train acc {:6.2f}%  test loss {:.4f}  test acc "
          "{:6.2f}%  {:7.1f} img/s  {:6.1f} s\n",
          epoch, options.epochs, last.train_loss, 100 * last.train_accuracy, last.test_loss,
          100 * last.test_accuracy, last.images_per_second, last.seconds);
      std::fflush(stdout);
    }
    if (checkpoint) {
      sampler.set_epoch(epoch + 1);  // saved as the start of the next epoch
      save(epoch + 1, 0);
    }
    if (elastic) {
      sampler.set_epoch(epoch + 1);  // committed as the start of the next epoch
      commit(epoch + 1, 0, epoch < options.epochs);  // after the last one, nothing to resize
    }
  }
  if (checkpoint) checkpoint->wait();  // the last checkpoint is on disk (errors surface here)
  if (elastic) elastic->wait();
  if (is_root && !options.save_model.empty()) save_model(options.save_model, model);
  if (is_root) {
    fmt::print(
        "final: {} epochs in {:.1f} s on {} ranks, test accuracy {:.2f}% (best {:.2f}%), train "
        "loss {:.4f}, {:.1f} img/s\n",
        epochs_run, seconds_since(run_start), dtrain::size(), 100 * last.test_accuracy,
        100 * best_accuracy, last.train_loss,
        train_seconds > 0 ? static_cast<double>(train_images) / train_seconds : 0.0);
    if (!options.quiet)
      fmt::print("weights: step {}, fingerprint {:016x} (parameters, buffers, momentum)\n", step,
                 fingerprint(*model, sgd));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string program =
      argc > 0 ? std::filesystem::path(argv[0]).filename().string() : std::string("resnet_train");
  try {
    dtrain::Session session(argc, argv);  // dtrain: start MPI and the engine; stop at scope exit
    const bool is_root = dtrain::rank() == 0;
    try {
      const TrainOptions options = resnet::parse_options(argc, argv);
      if (options.help) {
        if (is_root) fmt::print("{}", resnet::usage(program));
        return 0;
      }
      return run(options);
    } catch (const resnet::UsageError& e) {
      // Every rank parses the same flags, so every rank gets here and none waits for another.
      if (is_root) fmt::print(stderr, "{}: {}\n\n{}", program, e.what(), resnet::usage(program));
      return 2;
    } catch (const std::exception& e) {
      fmt::print(stderr, "{}: error on rank {}: {}\n", program, dtrain::rank(), e.what());
      // A failure on one rank (a file it cannot write, say) would leave the others waiting in
      // their next collective: stop them all.
      if (dtrain::size() > 1) MPI_Abort(MPI_COMM_WORLD, 1);
      return 1;
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "{}: error: {}\n", program, e.what());
    return 1;
  }
}
