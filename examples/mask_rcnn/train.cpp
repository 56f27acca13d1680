// Trains Mask R-CNN from scratch on generated shapes (default) or a COCO-format dataset, then
// evaluates it COCO-style on a held-out set: prints box and mask AP, and writes
// ground_truth.json, detections.json (COCO results, RLE masks), evaluation.json,
// predictions.png and the checkpoint model.pt into --out.
//
// It is an ordinary single-process libtorch trainer plus the dtrain lines marked "dtrain:", which
// make it data-parallel: start it with `mpiexec -n 4 mask_rcnn_train ...` and every rank trains on
// its own batches, with gradients averaged before every step.
//
//   mpiexec -n 2 mask_rcnn_train                        # shapes: mask AP50 0.85 (docs/mask-rcnn.md)
//   mask_rcnn_train --smoke --out smoke                 # a quick check
//   mpiexec -n 8 mask_rcnn_train --dataset coco --device cuda --model resnet18 ...
//   mask_rcnn_train --eval-only --checkpoint mask_rcnn_output/model.pt

#include <fmt/core.h>
#include <mpi.h>
#include <torch/torch.h>

#include <dtrain/torch.hpp>  // dtrain: the SDK, with its libtorch support
#if defined(MASK_RCNN_WITH_DTRAIN_CUDA)
#include <dtrain/cuda.hpp>  // dtrain: allreduce of CUDA tensors over NCCL
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "coco_dataset.hpp"
#include "common/cli.hpp"
#include "coco_format.hpp"
#include "model.hpp"
#include "options.hpp"
#include "shapes.hpp"
#include "visualize.hpp"

namespace {

using namespace mask_rcnn;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::string minutes_and_seconds(double seconds) {
  const auto s = static_cast<long>(std::lround(std::max(0.0, seconds)));
  return fmt::format("{}m{:02d}s", s / 60, s % 60);
}

std::uint64_t mix(std::uint64_t a, std::uint64_t b) {
  std::uint64_t z = a * 0x9e3779b97f4a7c15ULL + b + 0x632be59bd9b4e019ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

constexpr const char* loss_names[] = {"rpn_objectness", "rpn_box", "box_class", "box_regression", "mask"};

struct Data {
  std::unique_ptr<DetectionDataset> train;  // null for --eval-only
  std::unique_ptr<DetectionDataset> val;    // null for --no-eval
  std::string description;
};

Data load_data(const TrainOptions& o) {
  Data d;
  if (o.dataset == "shapes") {
    const auto [min_side, max_side] = o.shapes_size;
    ShapesOptions shapes{.min_side = min_side, .max_side = max_side};
    if (!o.eval_only) {
      shapes.count = o.shapes_train;
      shapes.seed = o.seed;
      d.train = std::make_unique<ShapesDataset>(shapes);
    }
    // Held out: images from another seed, never seen in training.
    shapes.count = o.shapes_val;
    shapes.seed = mix(o.seed, 0x76616c);
    d.val = std::make_unique<ShapesDataset>(shapes);
    d.description = fmt::format("shapes ({}-{} px)", min_side, max_side);
    return d;
  }
  if (!o.eval_only) {
    d.train = std::make_unique<CocoDataset>(CocoDatasetOptions{o.train_annotations, o.train_images,
                                                               o.min_size, o.max_size, true});
  }
  if (o.evaluate || o.eval_only) {
    d.val = std::make_unique<CocoDataset>(
        CocoDatasetOptions{o.val_annotations, o.val_images, o.min_size, o.max_size, false});
  }
  d.description = fmt::format("coco (shorter side {}, longer at most {})", o.min_size, o.max_size);
  return d;
}

// Moves a sample's image and objects to the device and fixes its sampling seed.
InstanceTargets targets_on(const DetectionSample& s, const torch::Device& device, std::uint64_t seed) {
  InstanceTargets t;
  t.boxes = s.targets.boxes.to(device);
  t.labels = s.targets.labels.to(device);
  t.masks = s.targets.masks.to(device);
  t.sampling_seed = seed;
  return t;
}

// One step's images and targets on the device: index's sample flipped or not by its seed, which
// also fixes the sampling of its regions.
struct StepBatch {
  ImageBatch images;
  std::vector<InstanceTargets> targets;
};

StepBatch load_batch(const DetectionDataset& data, const std::vector<std::int64_t>& indices,
                     const TrainOptions& o, std::int64_t iteration, const torch::Device& device) {
  StepBatch batch;
  std::vector<torch::Tensor> images;
  for (const auto index : indices) {
    const auto seed = mix(mix(o.seed, static_cast<std::uint64_t>(iteration)),
                          static_cast<std::uint64_t>(index));
    auto sample = data.get(index);
    if (o.flip && (seed >> 63) != 0) sample = flip_horizontal(std::move(sample));
    images.push_back(sample.image.to(device));
    batch.targets.push_back(targets_on(sample, device, seed));
  }
  batch.images = make_batch(images);
  return batch;
}

// The step's loss terms (in loss_names' order; undefined where no rank had an example of one)
// and their total.
struct StepLosses {
  torch::Tensor total;
  std::vector<torch::Tensor> terms;
};

// One optimizer step at rate `lr`, phase by phase for the profiler.
template <class Optimizer>
StepLosses train_step(MaskRcnn& model, const StepBatch& batch, Optimizer& optimizer,
                      torch::optim::SGD& sgd, double lr, dtrain::Profiler& profiler) {
  StepLosses step{torch::Tensor(), std::vector<torch::Tensor>(std::size(loss_names))};
  {
    auto phase = profiler.phase(dtrain::Phase::forward);
    optimizer.zero_grad();
    Losses losses = model->losses(batch.images, batch.targets);
    // dtrain: each loss is its sum divided by the number of examples in the whole global batch,
    // counted over all ranks (Note [Losses over the global batch] in detection.hpp).
    std::vector<double> counts;
    for (const char* name : loss_names) counts.push_back(losses.at(name).count);
    dtrain::allreduce(counts, {.name = "mask_rcnn.loss_counts"});
    step.total = torch::zeros({}, batch.images.images.options());
    for (std::size_t k = 0; k < counts.size(); ++k) {
      if (counts[k] <= 0) continue;
      step.terms[k] = losses.at(loss_names[k]).sum / counts[k];
      step.total = step.total + step.terms[k];
    }
  }
  {
    auto phase = profiler.phase(dtrain::Phase::backward);
    step.total.backward();
  }
  {
    auto phase = profiler.phase(dtrain::Phase::communication_wait);
    optimizer.synchronize();  // dtrain: the gradients' allreduces still running after backward
  }
  {
    auto phase = profiler.phase(dtrain::Phase::optimizer);
    auto synchronized = optimizer.skip_synchronize();  // dtrain: already averaged above
    dtrain::set_learning_rate(sgd, lr);
    optimizer.step();
  }
  return step;
}

// The progress line after `iteration` of a run started at `start`, from the losses averaged over
// the ranks since the last one. Stops the run when the loss is no longer finite.
void log_progress(const TrainOptions& o, std::int64_t iteration, Clock::time_point start,
                  const std::map<std::string, double>& average, double images_per_second,
                  bool report) {
  if (!std::isfinite(average.at("loss"))) {
    throw std::runtime_error(fmt::format(
        "the loss is {} at iteration {}: training diverged; try a lower --lr (now {}) or a "
        "longer --warmup-iterations (now {})",
        average.at("loss"), iteration + 1, o.lr, o.warmup_iterations));
  }
  if (!report) return;
  const double elapsed = seconds_since(start);
  const double left = elapsed / static_cast<double>(iteration + 1) *
                      static_cast<double>(o.iterations - iteration - 1);
  fmt::print(
      "iter {:>5}/{}  loss {:.4f}  rpn_obj {:.4f} rpn_box {:.4f} cls {:.4f} box {:.4f} mask "
      "{:.4f}  lr {:.5f}  {:6.1f} img/s  {} left\n",
      iteration + 1, o.iterations, average.at("loss"), average.at("rpn_objectness"),
      average.at("rpn_box"), average.at("box_class"), average.at("box_regression"),
      average.count("mask") ? average.at("mask") : 0.0, learning_rate(o, iteration),
      images_per_second, minutes_and_seconds(left));
  std::fflush(stdout);
}

void train(MaskRcnn& model, const DetectionDataset& data, const TrainOptions& o,
           const torch::Device& device, bool report) {
  // dtrain: batches of similar-sized images (little padding), split so that every rank takes the
  // same number of steps, each with about the same number of pixels as the other ranks'.
  std::vector<double> pixels;
  for (std::int64_t i = 0; i < data.size(); ++i) {
    const auto [h, w] = data.image_size(i);
    pixels.push_back(static_cast<double>(h * w));
  }
  dtrain::SplitSortedBucketSampler sampler(pixels, o.batch_size,
                                           {.parts = dtrain::size(), .part = dtrain::rank()},
                                           {.shuffle = o.shuffle, .seed = o.seed});
  const auto steps_per_epoch = sampler.num_batches();

  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(o.lr)
                                                 .momentum(o.momentum)
                                                 .weight_decay(o.weight_decay));
  // dtrain: gradients are averaged over the ranks, each allreduce starting while backward runs;
  // with --shard optimizer each rank keeps the momentum of its shard of the parameters only.
  dtrain::DistributedOptimizer optimizer(sgd, model->named_parameters(),
                                         dtrain::DistributedOptimizerOptions{.shard = o.shard});

  if (report) {
    fmt::print("{} steps per epoch, {:.1f} epochs\n", steps_per_epoch,
               static_cast<double>(o.iterations) / static_cast<double>(steps_per_epoch));
    std::fflush(stdout);
  }
  model->train();
  dtrain::MetricAverager metrics;       // dtrain: losses averaged over the ranks for the log
  dtrain::ThroughputMeter throughput;  // dtrain: images/s of all ranks together
  dtrain::Profiler profiler;  // dtrain: DTRAIN_PROFILE=<folder> records where each step's time goes
  throughput.start_epoch();
  const auto start = Clock::now();
  std::int64_t epoch = -1;
  for (std::int64_t it = 0; it < o.iterations; ++it) {
    if (it / steps_per_epoch != epoch) {
      epoch = it / steps_per_epoch;
      sampler.set_epoch(epoch);  // dtrain: the same epoch on every rank
    }
    const auto& indices = sampler.batches()[static_cast<std::size_t>(it % steps_per_epoch)];
    // dtrain: one step, phase by phase
    auto profiled_step = profiler.step(static_cast<std::int64_t>(indices.size()));
    StepBatch batch;
    {
      auto phase = profiler.phase(dtrain::Phase::data);
      batch = load_batch(data, indices, o, it, device);
    }
    const StepLosses losses =
        train_step(model, batch, optimizer, sgd, learning_rate(o, it), profiler);
    for (std::size_t k = 0; k < losses.terms.size(); ++k)
      if (losses.terms[k].defined()) metrics.add(loss_names[k], losses.terms[k].item<double>());
    metrics.add("loss", losses.total.item<double>());
    throughput.add_samples(static_cast<std::int64_t>(indices.size()));

    if ((it + 1) % o.log_every == 0 || it + 1 == o.iterations) {
      const auto speed = throughput.end_epoch();
      // dtrain: collective, every rank calls it
      log_progress(o, it, start, metrics.average(), speed.samples_per_second, report);
      throughput.start_epoch();
    }
  }
  if (report) {
    fmt::print("trained {} iterations in {}\n", o.iterations, minutes_and_seconds(seconds_since(start)));
    std::fflush(stdout);
  }
}

// One image's detections as COCO results at the image's original size.
std::vector<CocoDetection> to_coco(const Detections& d, const DetectionSample& s,
                                   const std::vector<Category>& categories) {
  std::vector<CocoDetection> out;
  const auto boxes = (d.boxes.detach().to(torch::kCPU, torch::kFloat) / s.scale).contiguous();
  const auto masks = paste_masks(d.masks, boxes, s.original_height, s.original_width).to(torch::kUInt8);
  const auto labels = d.labels.to(torch::kCPU);
  const auto scores = d.scores.detach().to(torch::kCPU, torch::kDouble);
  for (std::int64_t k = 0; k < boxes.size(0); ++k) {
    const auto mask = masks[k].contiguous();
    const float* b = boxes.data_ptr<float>() + 4 * k;
    CocoDetection c;
    c.image_id = s.image_id;
    c.category_id = categories.at(static_cast<std::size_t>(labels[k].item<std::int64_t>() - 1)).id;
    c.bbox = {b[0], b[1], static_cast<double>(b[2] - b[0]), static_cast<double>(b[3] - b[1])};
    c.score = scores[k].item<double>();
    c.mask = rle_encode({mask.data_ptr<std::uint8_t>(), static_cast<std::size_t>(mask.numel())},
                        s.original_height, s.original_width);
    out.push_back(std::move(c));
  }
  return out;
}

void evaluate(MaskRcnn& model, const DetectionDataset& data, const TrainOptions& o,
              const torch::Device& device, const fs::path& out) {
  torch::NoGradGuard no_grad;
  model->eval();
  const auto start = Clock::now();
  const auto n = o.eval_images > 0 ? std::min(o.eval_images, data.size()) : data.size();
  // dtrain: each rank evaluates its own contiguous slice of the evaluation set.
  const auto ranks = static_cast<std::int64_t>(dtrain::size());
  const auto rank = static_cast<std::int64_t>(dtrain::rank());
  const auto first = n * rank / ranks, last = n * (rank + 1) / ranks;

  std::vector<CocoDetection> mine;
  std::vector<DrawnImage> drawn;
  for (std::int64_t begin = first; begin < last; begin += o.batch_size) {
    std::vector<DetectionSample> samples;
    std::vector<torch::Tensor> images;
    for (auto i = begin; i < std::min(begin + o.batch_size, last); ++i) {
      samples.push_back(data.get(i));
      images.push_back(samples.back().image.to(device));
    }
    const auto detections = model->detect(make_batch(images));
    for (std::size_t j = 0; j < samples.size(); ++j) {
      const auto& d = detections[j];
      const auto& s = samples[j];
      auto coco = to_coco(d, s, data.categories());
      mine.insert(mine.end(), std::make_move_iterator(coco.begin()), std::make_move_iterator(coco.end()));
      if (rank == 0 && static_cast<std::int64_t>(drawn.size()) < o.png_images) {
        const auto keep = (d.scores >= 0.5).nonzero().flatten();
        const auto boxes = d.boxes.index_select(0, keep).to(torch::kCPU);
        drawn.push_back({s.image, paste_masks(d.masks.index_select(0, keep), boxes, s.image.size(1), s.image.size(2)),
                         boxes, d.labels.index_select(0, keep), d.scores.index_select(0, keep)});
      }
    }
  }
  // dtrain: rank 0 collects every rank's detections (in rank order, i.e. image order).
  const auto gathered = dtrain::allgather_object(detections_to_json(mine), "mask_rcnn.detections");
  if (rank != 0) return;

  std::vector<CocoDetection> all;
  for (const auto& part : gathered) {
    auto d = detections_from_json(part);
    all.insert(all.end(), std::make_move_iterator(d.begin()), std::make_move_iterator(d.end()));
  }
  std::vector<std::int64_t> indices(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) indices[static_cast<std::size_t>(i)] = i;
  const auto gt_file = out / "ground_truth.json", dt_file = out / "detections.json";
  write_coco_annotations(data.ground_truth(indices), gt_file);
  write_coco_detections(all, dt_file);
  // Scored from the files just written, so the table is what any COCO tool reads from them.
  const auto stats = evaluate_files(gt_file, dt_file);
  write_stats_json(stats, out / "evaluation.json");
  std::vector<std::string> names;
  for (const auto& c : data.categories()) names.push_back(c.name);
  if (!drawn.empty()) write_detections_png(out / "predictions.png", drawn, names, 4);
  fmt::print("evaluation on {} images ({} detections) in {}:\n{}", n, all.size(),
             minutes_and_seconds(seconds_since(start)), format_table(stats));
  fmt::print("wrote {}, {}, {}{}\n", gt_file.string(), dt_file.string(), (out / "evaluation.json").string(),
             drawn.empty() ? std::string() : ", " + (out / "predictions.png").string());
  std::fflush(stdout);
}

// dtrain: ranks on one host share its cores instead of each starting one thread per core; with
// GPUs, each rank on a host takes its own, by local rank.
torch::Device place_this_rank(const TrainOptions& o, std::int64_t& threads) {
  const auto cores = std::max<std::int64_t>(1, std::thread::hardware_concurrency());
  threads = o.threads > 0 ? o.threads : std::max<std::int64_t>(1, cores / dtrain::local_size());
  torch::set_num_threads(static_cast<int>(threads));
  if (o.device != torch::kCUDA) return torch::Device(torch::kCPU);
  if (!torch::cuda::is_available()) {
    throw CLI::ValidationError("--device", "cuda: no CUDA device is visible to this process, or "
                                           "libtorch was built without CUDA");
  }
  return torch::Device(torch::kCUDA, static_cast<torch::DeviceIndex>(
                                         dtrain::local_rank() % torch::cuda::device_count()));
}

// --eval-only: the checkpoint, which must know the evaluation set's categories; otherwise a new
// model of --model for them. Every rank starts from rank 0's weights.
MaskRcnn build_model(const TrainOptions& o, const std::vector<Category>& categories,
                     const torch::Device& device, CheckpointInfo& info) {
  MaskRcnn model{nullptr};
  if (o.eval_only) {
    model = load_checkpoint(o.checkpoint, info);
    std::vector<std::int64_t> ids;
    for (const auto& c : categories) ids.push_back(c.id);
    if (ids != info.category_ids) {
      throw CLI::ValidationError(
          "--checkpoint", fmt::format("{} was trained on categories [{}], the evaluation set has "
                                      "[{}]",
                                      o.checkpoint, fmt::join(info.category_ids, ", "),
                                      fmt::join(ids, ", ")));
    }
  } else {
    torch::manual_seed(o.seed);
    info.norm = o.norm;
    model = MaskRcnn(
        preset_config(o.model, static_cast<std::int64_t>(categories.size()), info.norm));
    info.preset = o.model;
    for (const auto& c : categories) {
      info.category_ids.push_back(c.id);
      info.category_names.push_back(c.name);
    }
  }
  dtrain::broadcast_module(*model);  // dtrain: every rank starts from rank 0's weights
  model->to(device);
  return model;
}

void print_header(const TrainOptions& o, const Data& data, const MaskRcnn& model,
                  const CheckpointInfo& info, std::int64_t threads, const torch::Device& device,
                  double load_seconds) {
  const auto& categories = (data.train ? data.train : data.val)->categories();
  std::int64_t parameters = 0;
  for (const auto& p : model->parameters()) parameters += p.numel();
  const auto eval_images =
      data.val ? (o.eval_images > 0 ? std::min(o.eval_images, data.val->size()) : data.val->size())
               : 0;
  fmt::print(
      "mask r-cnn {} ({:.2f} M parameters{}) on {}: {} train / {} eval images, {} classes; {} "
      "ranks x batch {} = {} images per step, {} iterations, lr {}; {} thread{} per rank on {}; "
      "data ready in {:.1f} s\n",
      info.preset, static_cast<double>(parameters) / 1e6,
      info.norm == Norm::group ? std::string() : ", " + norm_name(info.norm) + " norm",
      data.description, data.train ? data.train->size() : 0, eval_images, categories.size(),
      dtrain::size(), o.batch_size, o.batch_size * dtrain::size(), o.eval_only ? 0 : o.iterations,
      o.lr, threads, threads == 1 ? "" : "s", device.str(), load_seconds);
  std::fflush(stdout);
}

int run(const TrainOptions& o) {
  const bool is_root = dtrain::rank() == 0;  // dtrain: one rank prints and writes files
  std::int64_t threads = 1;
  const torch::Device device = place_this_rank(o, threads);
  const fs::path out = o.out;

  const auto load_start = Clock::now();
  const Data data = load_data(o);
  CheckpointInfo info;
  MaskRcnn model =
      build_model(o, (data.train ? data.train : data.val)->categories(), device, info);
  if (is_root) print_header(o, data, model, info, threads, device, seconds_since(load_start));

  if (!o.eval_only) {
    train(model, *data.train, o, device, is_root);
    info.iterations = o.iterations;
    if (is_root) {
      save_checkpoint(out / "model.pt", model, info);
      fmt::print("wrote {}\n", (out / "model.pt").string());
      std::fflush(stdout);
    }
  }
  if (data.val && (o.evaluate || o.eval_only)) evaluate(model, *data.val, o, device, out);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string program =
      argc > 0 ? fs::path(argv[0]).filename().string() : std::string("mask_rcnn_train");
  try {
    dtrain::Session session(argc, argv);  // dtrain: start MPI and the engine; stop at scope exit
    CLI::App app("", program);
    TrainOptions options;
    add_options(app, options);
    try {
      app.parse(argc, argv);
      return run(options);
    } catch (const CLI::ParseError& e) {
      // Every rank parses the same flags, so every rank gets here and none waits for another.
      return examples::refused_command_line(app, e, dtrain::rank() == 0);
    } catch (const std::exception& e) {
      fmt::print(stderr, "{}: error on rank {}: {}\n", program, dtrain::rank(), e.what());
      // A failure on one rank (a file it cannot read, say) would leave the others waiting in
      // their next collective: stop them all.
      if (dtrain::size() > 1) MPI_Abort(MPI_COMM_WORLD, 1);
      return 1;
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "{}: error: {}\n", program, e.what());
    return 1;
  }
}
