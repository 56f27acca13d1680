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
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/cli.hpp"
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

// Where this rank computes. dtrain: ranks on one host share its cores instead of each starting one
// thread per core; with GPUs, each rank on a host takes its own, by local rank. Also seeds
// libtorch's generator, before anything draws from it.
struct Placement {
  resnet::ThreadChoice threads;
  torch::Device device;
};

Placement place_this_rank(const TrainOptions& options) {
  auto threads = resnet::choose_threads(options.threads, usable_cores(), dtrain::local_size());
  torch::set_num_threads(static_cast<int>(threads.threads));
  torch::manual_seed(options.seed);
  const torch::Device device =
      torch::cuda::is_available()
          ? torch::Device(torch::kCUDA, static_cast<torch::DeviceIndex>(
                                            dtrain::local_rank() % torch::cuda::device_count()))
          : torch::Device(torch::kCPU);
  return {std::move(threads), device};
}

struct LoadedData {
  DataSplits splits;
  Dataset test;  // the front --eval-samples of the test split
  double seconds = 0.0;
};

LoadedData load(const TrainOptions& options) {
  const auto start = Clock::now();
  LoadedData data{load_data(options), {}, 0.0};
  const auto& test = data.splits.test;
  data.test = options.eval_samples > 0 && options.eval_samples < test.size()
                  ? Dataset{test.images.narrow(0, 0, options.eval_samples),
                            test.labels.narrow(0, 0, options.eval_samples)}
                  : test;
  data.seconds = seconds_since(start);
  return data;
}

// dtrain: --sync-bn builds every batch norm as dtrain::SyncBatchNorm2d, which takes its statistics
// from all ranks' batches together, where plain batch norm builds torch::nn::BatchNorm2d.
std::shared_ptr<Classifier> build_model(const TrainOptions& options, const DataSplits& data,
                                        const torch::Device& device) {
  const auto stem = resnet::choose_stem(options.model, options.stem, data.train.images.size(3));
  auto model = resnet::make_model(options.model, {.in_channels = data.channels(),
                                                  .num_classes = data.num_classes(),
                                                  .small_input_stem = stem.small_input_stem,
                                                  .norm = options.norm});
  dtrain::broadcast_module(*model);  // dtrain: every rank starts from rank 0's weights
  model->to(device);
  return model;
}

// dtrain: gradients are averaged over the ranks, in buckets (--bucket-mb to choose their size),
// and cross the network as 16-bit floats with --compression fp16/bf16, or as PowerSGD's low-rank
// factors with --compression powersgd; --op adasum combines them with Adasum instead of the
// average. With --shard optimizer each rank keeps the momentum of its shard of the parameters only.
dtrain::DistributedOptimizerOptions gradient_sync_options(const TrainOptions& options) {
  dtrain::DistributedOptimizerOptions sync;
  if (options.bucket_mb)
    sync.bucket_bytes = static_cast<std::int64_t>(*options.bucket_mb * (1 << 20));
  switch (options.compression) {
    case resnet::GradientCompression::fp16: sync.compression = dtrain::Compression::fp16; break;
    case resnet::GradientCompression::bf16: sync.compression = dtrain::Compression::bf16; break;
    case resnet::GradientCompression::powersgd:
      sync.hook = dtrain::powersgd_hook(
          {.rank = options.powersgd_rank, .start_step = options.powersgd_start_step});
      break;
    case resnet::GradientCompression::none: break;
  }
  if (options.op == resnet::GradientOp::adasum) sync.op = dtrain::ReduceOp::Adasum;
  sync.shard = options.shard;
  return sync;
}

// dtrain: with --scale-lr the rate ramps from --lr to --lr x ranks over the warmup epochs (the
// global batch is ranks x --batch-size), then decays to 0 along a cosine.
dtrain::LrSchedule learning_rate_schedule(const TrainOptions& options, std::int64_t steps) {
  dtrain::LrScheduleOptions lr;
  lr.base_lr = options.lr;
  lr.world_size = dtrain::size();
  lr.scale_by_world_size = options.scale_lr;
  lr.warmup_epochs = options.warmup_epochs;
  lr.steps_per_epoch = steps;
  lr.decay = dtrain::Decay::cosine;
  lr.total_epochs = static_cast<double>(options.epochs);
  return dtrain::LrSchedule(lr);
}

// One run of the trainer. The constructor sets it up (threads, device, data, model, optimizer,
// sampler, schedule, checkpoints); resume() continues from a checkpoint or commit; run_epoch()
// trains and evaluates one epoch; save_epoch_end() checkpoints it; finish() prints the summary.
class Training {
 public:
  explicit Training(const TrainOptions& options)
      : options_(options),
        place_(place_this_rank(options)),
        data_(load(options)),
        model_(build_model(options, data_.splits, place_.device)),
        sgd_(model_->parameters(), torch::optim::SGDOptions(options.lr)
                                       .momentum(options.momentum)
                                       .weight_decay(options.weight_decay)),
        optimizer_(sgd_, model_->named_parameters(), gradient_sync_options(options)),
        // dtrain: this rank's shard of every epoch, a permutation fixed by (seed, epoch).
        sampler_(data_.splits.train.size(), {.parts = dtrain::size(), .part = dtrain::rank()},
                 {.shuffle = true, .seed = options.seed}),
        steps_(steps_per_epoch(options, sampler_)),
        schedule_(learning_rate_schedule(options, steps_)),
        augment_rng_(at::detail::createCPUGenerator(augment_seed(0))),
        has_buffers_(!model_->buffers().empty()) {
    // dtrain: checkpoints of the whole training state, and resuming from the newest valid one.
    // Another world size is refused: the global batch, the steps per epoch and with them the
    // learning-rate schedule would change under the run. With --elastic, commits to each host's
    // own folder instead, and dtrainrun's resizes.
    if (options.elastic)
      elastic_.emplace(dtrain::elastic::Options{
          .directory = options.checkpoint_dir,
          .commit_every = options.checkpoint_every,
          .keep_last = static_cast<int>(options.keep_checkpoints)});
    else if (!options.checkpoint_dir.empty())
      checkpoint_.emplace(dtrain::CheckpointOptions{
          .directory = options.checkpoint_dir,
          .keep_last = static_cast<int>(options.keep_checkpoints),
          .on_world_size_change = dtrain::WorldSizeChange::refuse});
  }

  void print_header() const {
    if (!reporting()) return;
    const auto& train = data_.splits.train;
    const auto& shape = train.images.sizes();
    fmt::print(
        "{} on {}: {} train / {} test images of {}x{}x{}, {} classes; {} ranks x batch {} = {}, "
        "{} steps per epoch, lr {} (peak {}), {} threads per rank on {}; data loaded in {:.1f} s\n",
        options_.model, options_.dataset, train.size(), data_.test.size(), shape[1], shape[2],
        shape[3], data_.splits.num_classes(), dtrain::size(), options_.batch_size,
        options_.batch_size * dtrain::size(), steps_, options_.lr, schedule_.peak_lr(),
        place_.threads.threads, place_.device.str(), data_.seconds);
    fmt::print("threads: {}\n", place_.threads.description);
    if (options_.compression == resnet::GradientCompression::powersgd)
      fmt::print("gradients travel as PowerSGD rank-{} factors from step {} (--compression)\n",
                 options_.powersgd_rank, options_.powersgd_start_step);
    else if (options_.compression != resnet::GradientCompression::none)
      fmt::print("gradients travel as {} (--compression)\n",
                 resnet::compression_name(options_.compression));
    if (options_.op == resnet::GradientOp::adasum)
      fmt::print("gradients combine with Adasum (--op)\n");
    if (options_.shard == dtrain::Shard::optimizer_state)
      fmt::print("each rank keeps the optimizer state of 1/{} of the parameters (--shard)\n",
                 dtrain::size());
    if (options_.shard == dtrain::Shard::gradients)
      fmt::print("each rank keeps the optimizer state and the gradients of 1/{} of the parameters "
                 "(--shard)\n",
                 dtrain::size());
    std::int64_t parameters = 0;
    for (const auto& p : model_->parameters()) parameters += p.numel();
    std::int64_t synchronized_norms = 0;
    for (const auto& module : model_->modules(/*include_self=*/false))
      synchronized_norms += module->as<dtrain::SyncBatchNorm>() != nullptr ? 1 : 0;
    const auto stem = resnet::choose_stem(options_.model, options_.stem, shape[3]);
    fmt::print("model: {}, {} parameters{}{}{}\n", options_.model, parameters,
               stem.description.empty() ? "" : ", ", stem.description,
               options_.sync_bn ? fmt::format(", {} SyncBatchNorm layers", synchronized_norms)
                                : std::string());
    std::fflush(stdout);
  }

  // Continues from the newest valid checkpoint (--resume) or, with --elastic, from the newest
  // commit any host holds; otherwise the run starts at epoch 1.
  void resume() {
    if (options_.resume && checkpoint_) {
      if (auto restored = checkpoint_->restore()) {  // collective: rank 0 reads, every rank loads
        restored->load("model", *model_);  // in place: the optimizer keeps its parameters
        optimizer_.load_state(restored->get<dtrain::OptimizerState>("optimizer"));
        load_powersgd_state(*restored);
        dtrain::set_torch_rng_state(restored->get<dtrain::TorchRngState>("torch_rng"));
        if (has_buffers_) load_buffers(*model_, restored->get<NamedBuffers>("rank_buffers"));
        if (options_.augment) restored->load("augment_rng", augment_rng_);
        const auto position = restored->get<dtrain::SamplerState>("sampler");
        sampler_.load_state(position);  // the rest of the interrupted epoch
        step_ = restored->step();
        first_epoch_ = position.epoch;
        resumed_ = true;
        if (reporting())
          fmt::print("resumed from {}: step {}, epoch {}, sample {} of {} in it\n",
                     restored->file(), step_, first_epoch_, position.position,
                     data_.splits.train.size());
      } else if (reporting()) {
        fmt::print("no checkpoint in {}: starting afresh\n", options_.checkpoint_dir);
      }
    }
    if (elastic_) {
      if (auto restored = elastic_->restore()) {  // dtrain: the newest commit any host holds
        restored->load("model", *model_);
        // momentum intact across the resize, sharded or not
        optimizer_.load_state(restored->get<dtrain::OptimizerState>("optimizer"));
        load_powersgd_state(*restored);
        dtrain::set_torch_rng_state(restored->get<dtrain::TorchRngState>("torch_rng"));
        const auto position = restored->get<dtrain::SamplerState>("sampler");
        sampler_.load_state(position);  // dtrain: the rest of the epoch, re-sharded over this world
        step_ = restored->step();
        first_epoch_ = position.epoch;
        resumed_ = true;
        if (reporting())
          fmt::print("generation {}: resumed from the commit of step {}: epoch {}, sample {} of {} "
                     "in it, committed by {} ranks, {} now\n",
                     elastic_->generation(), step_, first_epoch_, position.position,
                     data_.splits.train.size(), restored->world_size(), dtrain::size());
      }
      // A commit holds no per-rank state: each world seeds augmentation afresh.
      augment_rng_ = at::detail::createCPUGenerator(augment_seed(step_));
    }
    run_start_ = Clock::now();
  }

  std::int64_t first_epoch() const { return first_epoch_; }

  // Trains epoch `epoch` (1-based) from where the sampler stands, then evaluates the model on
  // every rank's slice of the test set and prints the epoch's line.
  void run_epoch(std::int64_t epoch) {
    sampler_.set_epoch(epoch);  // keeps a resumed position in its own epoch
    const std::int64_t position = sampler_.state(0).position;
    const std::int64_t per_step = options_.batch_size * dtrain::size();
    // After a resume: the steps of this epoch that are left, on the rest of its order. With
    // --elastic, counted from the position, as earlier worlds may have had other sizes (and
    // --max-steps-per-epoch ends the epoch at that many steps' samples of this world).
    std::int64_t epoch_steps = steps_ - (step_ - (epoch - 1) * steps_);
    if (elastic_) {
      epoch_steps = sampler_.remaining() / options_.batch_size;
      if (options_.max_steps_per_epoch > 0)
        epoch_steps = std::clamp<std::int64_t>(options_.max_steps_per_epoch - position / per_step,
                                               0, epoch_steps);
    }
    throughput_.start_epoch();
    const std::int64_t first_step = step_;
    // --elastic: the rate of this world's schedule at the epoch's fractional progress, which does
    // not depend on the world size as a step count does.
    const auto learning_rate = [&](std::int64_t b) {
      if (!elastic_) return schedule_.lr_at_step(first_step + b);
      const auto done = static_cast<double>(position + b * per_step);
      return schedule_.lr_at_epoch(static_cast<double>(epoch - 1) +
                                   done / static_cast<double>(data_.splits.train.size()));
    };
    const auto after_step = [&](std::int64_t b) { this->after_step(epoch, b, epoch_steps); };
    const std::uint64_t payload_before = payload_bytes();
    const Totals train = train_one_epoch(*model_, optimizer_, sgd_, data_.splits.train,
                                         sampler_.indices(), options_, learning_rate, epoch_steps,
                                         augment_rng_, place_.device, profiler_, after_step);
    train_payload_bytes_ += payload_bytes() - payload_before;
    train_steps_ += step_ - first_step;
    throughput_.add_samples(train.samples);
    ++epochs_run_;
    const auto trained = throughput_.end_epoch();
    average_buffers(*model_);
    const Totals tested = evaluate(*model_, data_.test,
                                   std::max<std::int64_t>(options_.batch_size, 256), place_.device);
    last_ = summarize(train, tested, trained, tested.seconds);
    best_accuracy_ = std::max(best_accuracy_, last_.test_accuracy);
    train_seconds_ += trained.seconds;
    train_images_ += last_.train_images;
    if (reporting()) {
      fmt::print(
          "epoch {:>3}/{}  loss {:.4f}  train acc {:6.2f}%  test loss {:.4f}  test acc "
          "{:6.2f}%  {:7.1f} img/s  {:6.1f} s\n",
          epoch, options_.epochs, last_.train_loss, 100 * last_.train_accuracy, last_.test_loss,
          100 * last_.test_accuracy, last_.images_per_second, last_.seconds);
      std::fflush(stdout);
    }
  }

  // Saves the state as the start of the next epoch: a checkpoint, or with --elastic a commit,
  // where dtrainrun may ask for a resize (except after the last epoch).
  void save_epoch_end(std::int64_t epoch) {
    if (!checkpoint_ && !elastic_) return;
    sampler_.set_epoch(epoch + 1);
    if (checkpoint_) save_checkpoint(epoch + 1, 0);
    if (elastic_) commit(epoch + 1, 0, epoch < options_.epochs);
  }

  // Waits for the last checkpoint writes (their errors surface here), writes --save-model and
  // prints the summary.
  void finish() {
    if (checkpoint_) checkpoint_->wait();
    if (elastic_) elastic_->wait();
    if (dtrain::rank() != 0) return;  // dtrain: one rank prints and writes files
    if (!options_.save_model.empty()) save_model(options_.save_model, model_);
    fmt::print(
        "final: {} epochs in {:.1f} s on {} ranks, test accuracy {:.2f}% (best {:.2f}%), train "
        "loss {:.4f}, {:.1f} img/s\n",
        epochs_run_, seconds_since(run_start_), dtrain::size(), 100 * last_.test_accuracy,
        100 * best_accuracy_, last_.train_loss,
        train_seconds_ > 0 ? static_cast<double>(train_images_) / train_seconds_ : 0.0);
    if (train_steps_ > 0 && !options_.quiet)
      fmt::print("communicated: {:.3f} MB of collective payload per training step on rank 0\n",
                 static_cast<double>(train_payload_bytes_) / 1e6 /
                     static_cast<double>(train_steps_));
    if (!options_.quiet)
      fmt::print("weights: step {}, fingerprint {:016x} (parameters, buffers, momentum)\n", step_,
                 fingerprint(*model_, sgd_));
  }

 private:
  bool reporting() const { return dtrain::rank() == 0 && !options_.quiet; }

  // dtrain: the payload of this rank's collectives so far (what --compression changes).
  static std::uint64_t payload_bytes() {
    const auto s = dtrain::engine_stats();
    return s.allreduce_bytes + s.allgather_bytes + s.broadcast_bytes + s.alltoall_bytes +
           s.reducescatter_bytes;
  }

  // Augmentation differs per rank, as it would for different samples in one process.
  std::uint64_t augment_seed(std::int64_t step) const {
    return options_.seed + 1 + static_cast<std::uint64_t>(dtrain::rank()) +
           1000003 * static_cast<std::uint64_t>(step);
  }

  // After batch b of the epoch's `epoch_steps`, inside the step's profile: a checkpoint or commit
  // when one is due within the epoch (the epoch's end has its own), and the test suite's crash.
  void after_step(std::int64_t epoch, std::int64_t b, std::int64_t epoch_steps) {
    ++step_;
    const bool within_epoch = b + 1 < epoch_steps;
    if (checkpoint_ && options_.checkpoint_every > 0 &&
        step_ % options_.checkpoint_every == 0 && within_epoch) {
      auto phase = profiler_.phase("checkpoint");
      save_checkpoint(epoch, (b + 1) * options_.batch_size);
    }
    if (elastic_ && elastic_->commit_due(step_) && within_epoch) {
      auto phase = profiler_.phase("checkpoint");
      commit(epoch, (b + 1) * options_.batch_size, true);
    }
    options_.testing.after_step(step_, resumed_, dtrain::rank(), [&] {
      if (checkpoint_) checkpoint_->wait();
      if (elastic_) elastic_->wait();
      dtrain::barrier();
    });
  }

  // dtrain: every rank calls it at the same step; rank 0 writes in the background. `taken`: the
  // samples this rank has used of the sampler's current order. Between two epoch ends each rank's
  // batch-norm statistics and augmentation generator are its own: per-rank items.
  void save_checkpoint(std::int64_t epoch, std::int64_t taken) {
    const dtrain::SamplerState position = sampler_.state(taken);
    const auto torch_rng = dtrain::torch_rng_state();
    const auto buffers = named_buffers(*model_);
    const dtrain::TrainingProgress progress{.step = step_, .epoch = epoch};
    const auto optimizer_state = optimizer_.gather_state();  // collective: every rank's shard
    const auto powersgd = powersgd_state();
    if (has_buffers_ && options_.augment)
      checkpoint_->save(progress, {{"model", *model_}, {"optimizer", optimizer_state},
                                   {"powersgd", powersgd}, {"sampler", position},
                                   {"torch_rng", torch_rng}},
                        {{"rank_buffers", buffers}, {"augment_rng", augment_rng_}});
    else if (has_buffers_)
      checkpoint_->save(progress, {{"model", *model_}, {"optimizer", optimizer_state},
                                   {"powersgd", powersgd}, {"sampler", position},
                                   {"torch_rng", torch_rng}},
                        {{"rank_buffers", buffers}});
    else if (options_.augment)
      checkpoint_->save(progress, {{"model", *model_}, {"optimizer", optimizer_state},
                                   {"powersgd", powersgd}, {"sampler", position},
                                   {"torch_rng", torch_rng}},
                        {{"augment_rng", augment_rng_}});
    else
      checkpoint_->save(progress, {{"model", *model_}, {"optimizer", optimizer_state},
                                   {"powersgd", powersgd}, {"sampler", position},
                                   {"torch_rng", torch_rng}});
  }

  // dtrain: each host's writer commits the shared state; batch-norm statistics are made shared
  // first. At a commit where dtrainrun asks for a resize, every rank leaves with status 75.
  void commit(std::int64_t epoch, std::int64_t taken, bool may_leave) {
    average_buffers(*model_);
    const dtrain::SamplerState position = sampler_.state(taken);
    const auto torch_rng = dtrain::torch_rng_state();
    const auto optimizer_state = optimizer_.gather_state();
    const auto powersgd = powersgd_state();
    elastic_->commit({.step = step_, .epoch = epoch},
                     {{"model", *model_}, {"optimizer", optimizer_state}, {"powersgd", powersgd},
                      {"sampler", position}, {"torch_rng", torch_rng}});
    if (may_leave && elastic_->resize_requested()) {
      if (reporting()) {
        fmt::print("generation {}: committed step {}; leaving for a world of {} ranks\n",
                   elastic_->generation(), step_, elastic_->next_world_size());
        std::fflush(stdout);
      }
      elastic_->exit_for_resize();
    }
  }

  // dtrain: PowerSGD's Qs and error feedback go into checkpoints and commits beside the optimizer
  // (an empty state without --compression powersgd, so every run saves the same items).
  dtrain::PowerSGDHook* powersgd() const {
    return dynamic_cast<dtrain::PowerSGDHook*>(optimizer_.options().hook.get());
  }
  dtrain::PowerSGDState powersgd_state() {
    auto* hook = powersgd();
    return hook ? hook->gather_state() : dtrain::PowerSGDState{};  // collective
  }
  void load_powersgd_state(const dtrain::RestoredCheckpoint& restored) {
    auto* hook = powersgd();
    if (!hook || !restored.contains("powersgd")) return;
    const auto state = restored.get<dtrain::PowerSGDState>("powersgd");
    if (!state.settings.empty()) hook->load_state(state);  // empty: saved without PowerSGD
  }

  const TrainOptions& options_;
  const Placement place_;
  const LoadedData data_;
  const std::shared_ptr<Classifier> model_;
  torch::optim::SGD sgd_;
  dtrain::DistributedOptimizer<torch::optim::SGD> optimizer_;
  dtrain::DistributedSampler sampler_;
  const std::int64_t steps_;  // per epoch
  const dtrain::LrSchedule schedule_;
  torch::Generator augment_rng_;
  const bool has_buffers_;
  std::optional<dtrain::Checkpoint> checkpoint_;
  std::optional<dtrain::elastic::State> elastic_;

  std::int64_t step_ = 0;  // optimizer steps so far, over all epochs: sets the learning rate
  std::int64_t first_epoch_ = 1;
  bool resumed_ = false;

  Clock::time_point run_start_ = Clock::now();
  EpochReport last_{};
  double best_accuracy_ = 0.0;
  double train_seconds_ = 0.0;
  std::int64_t train_images_ = 0;
  std::int64_t epochs_run_ = 0;
  std::uint64_t train_payload_bytes_ = 0;  // collective payload during the training steps
  std::int64_t train_steps_ = 0;
  dtrain::ThroughputMeter throughput_;  // dtrain: images/s of all ranks together
  dtrain::Profiler profiler_;  // dtrain: DTRAIN_PROFILE=<folder> records where each step's time goes
};

int run(const TrainOptions& options) {
  Training training(options);
  training.print_header();
  training.resume();
  for (std::int64_t epoch = training.first_epoch(); epoch <= options.epochs; ++epoch) {
    training.run_epoch(epoch);
    training.save_epoch_end(epoch);
  }
  training.finish();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string program =
      argc > 0 ? std::filesystem::path(argv[0]).filename().string() : std::string("resnet_train");
  try {
    dtrain::Session session(argc, argv);  // dtrain: start MPI and the engine; stop at scope exit
    CLI::App app("", program);
    TrainOptions options;
    resnet::add_options(app, options);
    try {
      app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
      // Every rank parses the same flags, so every rank gets here and none waits for another.
      return examples::refused_command_line(app, e, dtrain::rank() == 0);
    }
    try {
      return run(options);
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
