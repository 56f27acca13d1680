#pragma once
// Command-line options of the ResNet trainer: each flag declared once, on a CLI::App, with what it
// accepts; the testing flags (common/testing_hooks.hpp) are kept out of the help.

#include <CLI/CLI.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <dtrain/train/compression.hpp>
#include <dtrain/train/distributed_optimizer.hpp>

#include "common/testing_hooks.hpp"
#include "models.hpp"

namespace resnet {

// How gradients travel (--compression): as they are, as 16-bit floats, or as PowerSGD's low-rank
// factors (Note [Gradient communication hooks] in dtrain/train/gradient_hook.hpp).
enum class GradientCompression { none, fp16, bf16, powersgd };

// How the ranks' gradients combine (--op): their average, or Adasum.
enum class GradientOp { average, adasum };

struct TrainOptions {
  std::string model = "resnet8";
  std::string dataset = "fashion-mnist";  // fashion-mnist | cifar10 | imagefolder | synthetic
  std::string data_dir;                   // empty: the dataset's default location
  std::int64_t epochs = 3;
  std::int64_t batch_size = 128;         // per rank
  double lr = 0.1;                        // one rank's rate
  bool scale_lr = false;                  // peak rate lr x ranks, reached after the warmup
  double momentum = 0.9;
  double weight_decay = 5e-4;
  double warmup_epochs = 0.0;             // linear ramp from lr to the peak
  Norm norm = Norm::batch;                // --sync-bn turns batch into sync_batch
  bool sync_bn = false;
  std::string stem = "auto";              // auto | standard | small (resnet18/34/50)
  std::uint64_t seed = 42;
  std::int64_t threads = 0;              // 0: choose_threads()
  std::optional<double> bucket_mb;       // none: DistributedOptimizer's default by device
  GradientCompression compression = GradientCompression::none;  // the gradients' wire format
  int powersgd_rank = 2;                 // PowerSGD's rank of the approximation
  std::int64_t powersgd_start_step = 50; // PowerSGD: steps averaged uncompressed first
  GradientOp op = GradientOp::average;
  dtrain::Shard shard = dtrain::Shard::none;  // optimizer: each rank keeps 1/ranks of SGD's state
  std::int64_t max_steps_per_epoch = 0;  // 0: the whole training set every epoch
  std::int64_t eval_samples = 0;         // 0: the whole test set
  bool augment = false;                  // random crop (padding 2 or 4) + flip
  std::int64_t image_size = 0;           // imagefolder / synthetic; 0: 64 resp. 32
  std::int64_t synthetic_samples = 4096;
  std::string checkpoint_dir;           // empty: no checkpoints
  std::int64_t checkpoint_every = 0;    // steps between checkpoints; 0: at each epoch's end only
  std::int64_t keep_checkpoints = 3;    // newest kept; 0: all
  bool resume = false;                  // continue from the newest valid checkpoint, if any
  bool elastic = false;                 // dtrainrun's elastic mode: commits on each host
  std::string save_model;               // empty: no final model file
  bool quiet = false;
  examples::TestingHooks testing;
};

// "none", "fp16", "bf16" or "powersgd", as --compression spells them.
std::string compression_name(GradientCompression compression);

// Declares every flag on `app`, each writing its field of `options`, and the checks that involve
// more than one flag (run by app.parse(), which throws a CLI::ParseError for a refused command line).
void add_options(CLI::App& app, TrainOptions& options);

// Parses `args` (without the program name) as resnet_train would. Throws CLI::ParseError, and
// CLI::CallForHelp for --help.
TrainOptions parse_options(std::vector<std::string> args);

// Intra-op threads per rank, and a sentence saying why, for the trainer's header line.
struct ThreadChoice {
  std::int64_t threads = 1;
  std::string description;  // e.g. "2 ranks x 1 thread on 2 cores"
};

// --threads when given (> 0); otherwise the cores this process may run on, divided evenly among
// the ranks on this host, at least 1: ranks x threads fill the cores without oversubscribing them
// (unless there are more ranks than cores, which the description then says).
ThreadChoice choose_threads(std::int64_t requested, std::int64_t cores, std::int64_t local_ranks);

}  // namespace resnet
