#include "options.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <sstream>
#include <system_error>
#include <type_traits>

namespace resnet {
namespace {

template <class T>
T parse_number(const std::string& flag, const std::string& text) {
  T value{};
  const auto* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || ptr != end || text.empty()) {
    throw UsageError("--" + flag + ": '" + text + "' is not a valid " +
                     (std::is_floating_point_v<T> ? "number" : "integer"));
  }
  if constexpr (std::is_floating_point_v<T>) {
    if (!std::isfinite(value)) throw UsageError("--" + flag + ": '" + text + "' is not finite");
  }
  return value;
}

void require(bool ok, const std::string& flag, const std::string& what, const std::string& text) {
  if (!ok) throw UsageError("--" + flag + " must be " + what + ", got " + text);
}

}  // namespace

std::string usage(const std::string& program) {
  return "usage: " + program + R"( [options]

Trains a ResNet image classifier and reports loss, accuracy and throughput per epoch. Started
with `mpiexec -n N`, it trains data-parallel on N ranks: each rank takes its own shard of every
epoch and gradients are averaged before each step, so the global batch is N x --batch-size.

  --model NAME              resnet8 (default), resnet20, resnet32, resnet44, resnet56, resnet110
                            (CIFAR-style), resnet18, resnet34, resnet50 (ImageNet-style)
  --dataset NAME            fashion-mnist (default), cifar10, imagefolder, synthetic
  --data-dir DIR            fashion-mnist: default /usr/share/datasets/fashion-mnist
                            (apt-get install dataset-fashion-mnist); cifar10: the unpacked
                            cifar-10-binary.tar.gz; imagefolder: DIR/train/<class>/<image> and
                            DIR/val/<class>/<image>
  --epochs N                training epochs (default 3)
  --batch-size N            samples per step on each rank (default 128)
  --lr X                    learning rate of SGD for one rank's batch (default 0.1),
                            cosine-decayed to 0 after the warmup
  --scale-lr                multiply the rate by the number of ranks (linear scaling rule)
  --momentum X              SGD momentum in [0, 1) (default 0.9)
  --weight-decay X          L2 penalty (default 5e-4)
  --warmup-epochs X         ramp the rate linearly from --lr to its peak over X epochs
                            (default 0; with --scale-lr the peak is --lr x ranks)
  --norm NAME               batch (default) or group: group norm does not depend on how
                            the batch is split across ranks
  --stem NAME               resnet18/34/50: auto (default: the small-input 3x3 stem for images
                            of 32 px or less, else the standard 7x7 stride-2 stem and max-pool),
                            standard or small
  --seed N                  seed of initialisation, shuffling and augmentation (default 42)
  --threads N               intra-op threads per rank (default 0: the cores this process may
                            use, divided by the ranks on the host, at least 1)
  --max-steps-per-epoch N   stop each epoch after N steps (default 0: the whole training set)
  --eval-samples N          evaluate on the first N test samples (default 0: all)
  --augment                 random crop with padding and horizontal flip
  --image-size N            imagefolder and synthetic image side (default 64 and 32)
  --synthetic-samples N     synthetic training samples (default 4096; test: N/8)
  --checkpoint-dir DIR      checkpoint the training state (model, optimizer, data position,
                            generators) into DIR after every epoch (dtrain::Checkpoint)
  --checkpoint-every N      also every N steps within an epoch (default 0: epoch ends only)
  --keep-checkpoints K      keep the newest K checkpoints (default 3; 0 keeps all)
  --resume                  continue from the newest valid checkpoint in --checkpoint-dir, if
                            there is one; the same command serves the first start and restarts
  --save-model FILE         write the final model with torch::save (rank 0)
  --crash-rank R            testing restarts: rank R kills itself with SIGKILL after the step
  --crash-after-step N      of --crash-after-step, once the checkpoints before it are on disk;
                            a run that resumed does not crash again
  --quiet                   print only the final summary
  --help                    print this text
)";
}

TrainOptions parse_options(const std::vector<std::string>& args) {
  TrainOptions o;
  using Setter = std::function<void(const std::string& flag, const std::string& value)>;
  auto integer = [](std::int64_t& field, std::int64_t minimum) {
    return Setter([&field, minimum](const std::string& flag, const std::string& value) {
      field = parse_number<std::int64_t>(flag, value);
      require(field >= minimum, flag, ">= " + std::to_string(minimum), value);
    });
  };
  auto real = [](double& field, double minimum, double below, std::string accepted) {
    return Setter(
        [&field, minimum, below, accepted](const std::string& flag, const std::string& value) {
          field = parse_number<double>(flag, value);
          require(field >= minimum && field < below, flag, accepted, value);
        });
  };
  auto text = [](std::string& field) {
    return Setter([&field](const std::string& flag, const std::string& value) {
      require(!value.empty(), flag, "non-empty", "''");
      field = value;
    });
  };
  const double huge = std::numeric_limits<double>::infinity();
  const std::map<std::string, Setter> with_value = {
      {"model", text(o.model)},
      {"dataset",
       [&o](const std::string& flag, const std::string& value) {
         require(value == "fashion-mnist" || value == "cifar10" || value == "imagefolder" ||
                     value == "synthetic",
                 flag, "one of fashion-mnist, cifar10, imagefolder, synthetic", value);
         o.dataset = value;
       }},
      {"data-dir", text(o.data_dir)},
      {"epochs", integer(o.epochs, 1)},
      {"batch-size", integer(o.batch_size, 1)},
      {"lr",
       [&o](const std::string& flag, const std::string& value) {
         o.lr = parse_number<double>(flag, value);
         require(o.lr > 0, flag, "positive", value);
       }},
      {"momentum", real(o.momentum, 0.0, 1.0, "in [0, 1)")},
      {"weight-decay", real(o.weight_decay, 0.0, huge, ">= 0")},
      {"warmup-epochs", real(o.warmup_epochs, 0.0, huge, ">= 0")},
      {"norm",
       [&o](const std::string& flag, const std::string& value) {
         require(value == "batch" || value == "group", flag, "batch or group", value);
         o.norm = value;
       }},
      {"stem",
       [&o](const std::string& flag, const std::string& value) {
         require(value == "auto" || value == "standard" || value == "small", flag,
                 "auto, standard or small", value);
         o.stem = value;
       }},
      {"seed",
       [&o](const std::string& flag, const std::string& value) {
         o.seed = parse_number<std::uint64_t>(flag, value);
       }},
      {"threads", integer(o.threads, 0)},
      {"max-steps-per-epoch", integer(o.max_steps_per_epoch, 0)},
      {"eval-samples", integer(o.eval_samples, 0)},
      {"image-size", integer(o.image_size, 1)},
      {"synthetic-samples", integer(o.synthetic_samples, 2)},
      {"checkpoint-dir", text(o.checkpoint_dir)},
      {"checkpoint-every", integer(o.checkpoint_every, 0)},
      {"keep-checkpoints", integer(o.keep_checkpoints, 0)},
      {"save-model", text(o.save_model)},
      {"crash-rank", integer(o.crash_rank, 0)},
      {"crash-after-step", integer(o.crash_after_step, 1)},
  };
  const std::map<std::string, bool*> switches = {{"augment", &o.augment},
                                                 {"scale-lr", &o.scale_lr},
                                                 {"resume", &o.resume},
                                                 {"quiet", &o.quiet},
                                                 {"help", &o.help}};

  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg.rfind("--", 0) != 0 || arg.size() == 2) {
      throw UsageError("unexpected argument '" + arg + "'; options start with --");
    }
    std::string flag = arg.substr(2);
    std::string value;
    bool has_value = false;
    if (const auto eq = flag.find('='); eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag.resize(eq);
      has_value = true;
    }
    if (const auto it = switches.find(flag); it != switches.end()) {
      if (has_value) throw UsageError("--" + flag + " takes no value");
      *it->second = true;
    } else if (const auto setter = with_value.find(flag); setter != with_value.end()) {
      if (!has_value) {
        if (i + 1 >= args.size()) throw UsageError("--" + flag + " needs a value");
        value = args[++i];
      }
      setter->second(flag, value);
    } else {
      throw UsageError("unknown option '--" + flag + "'");
    }
  }
  if (o.checkpoint_dir.empty() && (o.resume || o.checkpoint_every > 0)) {
    throw UsageError(std::string(o.resume ? "--resume" : "--checkpoint-every") +
                     " needs --checkpoint-dir: the folder that holds the checkpoints");
  }
  if ((o.crash_rank >= 0) != (o.crash_after_step > 0)) {
    throw UsageError("--crash-rank and --crash-after-step go together");
  }
  if (o.warmup_epochs > static_cast<double>(o.epochs)) {
    std::ostringstream message;
    message << "--warmup-epochs (" << o.warmup_epochs << ") must not exceed --epochs (" << o.epochs
            << ")";
    throw UsageError(message.str());
  }
  return o;
}

ThreadChoice choose_threads(std::int64_t requested, std::int64_t cores, std::int64_t local_ranks) {
  cores = std::max<std::int64_t>(1, cores);
  local_ranks = std::max<std::int64_t>(1, local_ranks);
  const auto plural = [](std::int64_t n, const std::string& word) {
    return std::to_string(n) + " " + word + (n == 1 ? "" : "s");
  };
  ThreadChoice choice;
  choice.threads = requested > 0 ? requested : std::max<std::int64_t>(1, cores / local_ranks);
  choice.description = plural(local_ranks, "rank") + " x " + plural(choice.threads, "thread") +
                       " on " + plural(cores, "core") + " of this host";
  if (requested > 0) choice.description += " (--threads)";
  if (local_ranks * choice.threads > cores) choice.description += ", oversubscribed";
  return choice;
}

TrainOptions parse_options(int argc, const char* const* argv) {
  return parse_options(std::vector<std::string>(argv + (argc > 0 ? 1 : 0), argv + argc));
}

}  // namespace resnet
