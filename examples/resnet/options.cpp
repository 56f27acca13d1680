#include "options.hpp"

#include <algorithm>
#include <limits>
#include <map>
#include <sstream>

namespace resnet {

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
  --sync-bn                 batch norm with the statistics of every rank's batch
                            (dtrain::SyncBatchNorm): N ranks with batch b normalize as one
                            process with batch N x b
  --stem NAME               resnet18/34/50: auto (default: the small-input 3x3 stem for images
                            of 32 px or less, else the standard 7x7 stride-2 stem and max-pool),
                            standard or small
  --seed N                  seed of initialisation, shuffling and augmentation (default 42)
  --threads N               intra-op threads per rank (default 0: the cores this process may
                            use, divided by the ranks on the host, at least 1)
  --bucket-mb X             submit gradients for averaging in buckets of X MiB (default:
                            dtrain's choice: 25 MiB on GPUs and across hosts, one bucket per
                            step on the CPU of one host; 0: each gradient as soon as backward
                            produces it)
  --compression NAME        none (default), fp16 or bf16: gradients travel as 16-bit floats
                            and are widened back after averaging (half the bytes on the wire)
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
  --elastic                 train under dtrainrun's elastic mode (docs/elastic.md):
                            --checkpoint-dir is each host's own folder ({host} is replaced by
                            the host's name), committed every --checkpoint-every steps and at
                            each epoch's end; every world resumes from the newest commit any
                            host holds, on its own number of ranks, and leaves with status 75
                            when dtrainrun asks for a resize
  --save-model FILE         write the final model with torch::save (rank 0)
  --crash-rank R            testing restarts: rank R kills itself with SIGKILL after the step
  --crash-after-step N      of --crash-after-step, once the checkpoints before it are on disk;
                            a run that resumed does not crash again
  --quiet                   print only the final summary
  --help                    print this text
)";
}

TrainOptions parse_options(const std::vector<std::string>& args) {
  using namespace examples;  // the setters of common/command_line.hpp
  TrainOptions o;
  const double huge = std::numeric_limits<double>::infinity();
  const std::map<std::string, Setter> with_value = {
      {"model", text(o.model)},
      {"dataset", one_of(o.dataset, {"fashion-mnist", "cifar10", "imagefolder", "synthetic"})},
      {"data-dir", text(o.data_dir)},
      {"epochs", integer(o.epochs, 1)},
      {"batch-size", integer(o.batch_size, 1)},
      {"lr", positive(o.lr)},
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
      {"bucket-mb", real(o.bucket_mb, 0.0, huge, ">= 0")},
      {"compression", one_of(o.compression, {"none", "fp16", "bf16"})},
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
                                                 {"sync-bn", &o.sync_bn},
                                                 {"resume", &o.resume},
                                                 {"elastic", &o.elastic},
                                                 {"quiet", &o.quiet},
                                                 {"help", &o.help}};

  examples::parse_flags(args, with_value, switches);
  if (o.checkpoint_dir.empty() && (o.resume || o.checkpoint_every > 0)) {
    throw UsageError(std::string(o.resume ? "--resume" : "--checkpoint-every") +
                     " needs --checkpoint-dir: the folder that holds the checkpoints");
  }
  if (o.elastic && o.checkpoint_dir.empty()) {
    throw UsageError("--elastic needs --checkpoint-dir: each host's own folder for the commits");
  }
  if (o.sync_bn && o.norm != "batch") {
    throw UsageError("--sync-bn synchronizes batch norm; --norm " + o.norm + " has none");
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
  return parse_options(examples::arguments(argc, argv));
}

}  // namespace resnet
