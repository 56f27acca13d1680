#pragma once
// Command-line options of the ResNet trainer. Kept free of libtorch so parsing is cheap to test.

#include <cstdint>
#include <string>
#include <vector>

#include "common/command_line.hpp"

namespace resnet {

// A flag the trainer does not accept, or a value it cannot use.
using examples::UsageError;

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
  std::string norm = "batch";             // batch | group
  bool sync_bn = false;                   // batch norm over every rank's batch (SyncBatchNorm)
  std::string stem = "auto";              // auto | standard | small (resnet18/34/50)
  std::uint64_t seed = 42;
  std::int64_t threads = 0;              // 0: choose_threads()
  double bucket_mb = -1;                 // < 0: DistributedOptimizer's default by device
  std::string compression = "none";      // none | fp16 | bf16: the gradients' wire format
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
  std::int64_t crash_rank = -1;         // testing restarts: this rank dies with SIGKILL ...
  std::int64_t crash_after_step = 0;    // ... after this step, unless the run resumed
  bool quiet = false;
  bool help = false;
};

// Intra-op threads per rank, and a sentence saying why, for the trainer's header line.
struct ThreadChoice {
  std::int64_t threads = 1;
  std::string description;  // e.g. "2 ranks x 1 thread on 2 cores"
};

// --threads when given (> 0); otherwise the cores this process may run on, divided evenly among
// the ranks on this host, at least 1: ranks x threads fill the cores without oversubscribing them
// (unless there are more ranks than cores, which the description then says).
ThreadChoice choose_threads(std::int64_t requested, std::int64_t cores, std::int64_t local_ranks);

// The usage text, `program` being argv[0].
std::string usage(const std::string& program);

// Accepts `--flag value` and `--flag=value`. Throws UsageError naming the flag and what it accepts.
TrainOptions parse_options(const std::vector<std::string>& args);
TrainOptions parse_options(int argc, const char* const* argv);

}  // namespace resnet
