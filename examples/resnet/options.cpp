#include "options.hpp"

#include <algorithm>
#include <sstream>
#include <utility>

#include "common/cli.hpp"
#include "datasets.hpp"

namespace resnet {

std::string compression_name(GradientCompression compression) {
  switch (compression) {
    case GradientCompression::fp16: return "fp16";
    case GradientCompression::bf16: return "bf16";
    case GradientCompression::powersgd: return "powersgd";
    case GradientCompression::none: break;
  }
  return "none";
}

namespace {

void add_data_options(CLI::App& app, TrainOptions& o) {
  app.add_option("--dataset", o.dataset,
                 "fashion-mnist, cifar10, imagefolder (DIR/train/<class>/<image> and "
                 "DIR/val/<class>/<image>) or synthetic")
      ->check(CLI::IsMember({"fashion-mnist", "cifar10", "imagefolder", "synthetic"}));
  app.add_option("--data-dir", o.data_dir,
                 "the dataset's folder; fashion-mnist defaults to " +
                     std::string(default_fashion_mnist_dir) +
                     " (apt-get install dataset-fashion-mnist), cifar10 is the unpacked "
                     "cifar-10-binary.tar.gz")
      ->type_name("DIR")
      ->check(CLI::Validator(
          [](std::string& dir) { return dir.empty() ? std::string("must not be empty") : ""; },
          ""));
  app.add_option("--eval-samples", o.eval_samples,
                 "evaluate on the first N test samples (0: all)")
      ->check(examples::at_least<std::int64_t>(0));
  app.add_flag("--augment", o.augment, "random crop with padding and horizontal flip");
  app.add_option("--image-size", o.image_size,
                 "imagefolder and synthetic image side (0: 64 resp. 32)")
      ->check(examples::at_least<std::int64_t>(1));
  app.add_option("--synthetic-samples", o.synthetic_samples,
                 "synthetic training samples (test: N/8)")
      ->check(examples::at_least<std::int64_t>(2));
}

void add_model_options(CLI::App& app, TrainOptions& o) {
  app.add_option("--model", o.model,
                 "resnet8 .. resnet110 (CIFAR-style), resnet18, resnet34, resnet50 "
                 "(ImageNet-style)")
      ->check(CLI::IsMember(model_names()));
  examples::add_enum_option(app, "--norm", o.norm, {{"batch", Norm::batch}, {"group", Norm::group}},
                            "batch, or group: group norm does not depend on how the batch is "
                            "split across ranks");
  app.add_flag("--sync-bn", o.sync_bn,
               "batch norm with the statistics of every rank's batch (dtrain::SyncBatchNorm): "
               "N ranks with batch b normalize as one process with batch N x b");
  app.add_option("--stem", o.stem,
                 "resnet18/34/50: auto (the 3x3 stem for images of 32 px or less, else the "
                 "7x7 stride-2 stem and max-pool), standard or small")
      ->check(CLI::IsMember({"auto", "standard", "small"}));
}

void add_optimizer_options(CLI::App& app, TrainOptions& o) {
  app.add_option("--epochs", o.epochs, "training epochs")
      ->check(examples::at_least<std::int64_t>(1));
  app.add_option("--batch-size", o.batch_size, "samples per step on each rank")
      ->check(examples::at_least<std::int64_t>(1));
  app.add_option("--lr", o.lr,
                 "SGD learning rate for one rank's batch, cosine-decayed to 0 after the warmup")
      ->check(examples::positive());
  app.add_flag("--scale-lr", o.scale_lr,
               "multiply the rate by the number of ranks (linear scaling rule)");
  app.add_option("--momentum", o.momentum, "SGD momentum")->check(examples::fraction());
  app.add_option("--weight-decay", o.weight_decay, "L2 penalty")->check(examples::non_negative());
  app.add_option("--warmup-epochs", o.warmup_epochs,
                 "ramp the rate linearly from --lr to its peak over X epochs")
      ->check(examples::non_negative());
  app.add_option("--seed", o.seed, "seed of initialisation, shuffling and augmentation")
      ->check(examples::number<std::uint64_t>(">= 0", [](std::uint64_t) { return true; }));
  app.add_option("--max-steps-per-epoch", o.max_steps_per_epoch,
                 "stop each epoch after N steps (0: the whole training set)")
      ->check(examples::at_least<std::int64_t>(0));
}

void add_distributed_options(CLI::App& app, TrainOptions& o) {
  app.add_option("--threads", o.threads,
                 "intra-op threads per rank (0: the cores this process may use, divided by the "
                 "ranks on the host)")
      ->check(examples::at_least<std::int64_t>(0));
  app.add_option("--bucket-mb", o.bucket_mb,
                 "submit gradients for averaging in buckets of X MiB (0: each gradient as soon "
                 "as backward makes it; default: 25 MiB on GPUs and across hosts, one bucket "
                 "per step on the CPU of one host)")
      ->type_name("FLOAT")
      ->check(examples::non_negative());
  examples::add_enum_option(app, "--compression", o.compression,
                            {{"none", GradientCompression::none},
                             {"fp16", GradientCompression::fp16},
                             {"bf16", GradientCompression::bf16},
                             {"powersgd", GradientCompression::powersgd}},
                            "fp16/bf16: gradients travel as 16-bit floats, widened back after "
                            "averaging; powersgd: as PowerSGD's rank-R factors, with error "
                            "feedback");
  app.add_option("--powersgd-rank", o.powersgd_rank,
                 "PowerSGD: the rank R of each gradient's approximation")
      ->check(examples::at_least<int>(1));
  app.add_option("--powersgd-start-step", o.powersgd_start_step,
                 "PowerSGD: the first N steps average the gradients uncompressed")
      ->check(examples::at_least<std::int64_t>(0));
  examples::add_enum_option(app, "--op", o.op,
                            {{"average", GradientOp::average}, {"adasum", GradientOp::adasum}},
                            "how gradients combine: their average, or Adasum (scale-invariant "
                            "sums; keep the one-rank learning rate, without --scale-lr)");
  examples::add_enum_option(app, "--shard", o.shard,
                            {{"none", dtrain::Shard::none},
                             {"optimizer", dtrain::Shard::optimizer_state},
                             {"gradients", dtrain::Shard::gradients}},
                            "optimizer: each rank keeps the momentum of 1/ranks of the parameters "
                            "(ZeRO stage 1); gradients: and only their averaged gradients, "
                            "reduce-scattered during backward (ZeRO stage 2)");
}

void add_checkpoint_options(CLI::App& app, TrainOptions& o) {
  auto* dir = app.add_option("--checkpoint-dir", o.checkpoint_dir,
                             "checkpoint the training state into DIR after every epoch")
                  ->type_name("DIR");
  app.add_option("--checkpoint-every", o.checkpoint_every,
                 "also every N steps within an epoch (0: epoch ends only)")
      ->check(examples::at_least<std::int64_t>(0))
      ->needs(dir);
  app.add_option("--keep-checkpoints", o.keep_checkpoints, "keep the newest K (0: all)")
      ->check(examples::at_least<std::int64_t>(0));
  app.add_flag("--resume", o.resume,
               "continue from the newest valid checkpoint in --checkpoint-dir, if there is one")
      ->needs(dir);
  app.add_flag("--elastic", o.elastic,
                   "train under dtrainrun's elastic mode (docs/elastic.md): --checkpoint-dir is "
                   "each host's own folder ({host}: its name), committed every "
                   "--checkpoint-every steps and at each epoch's end")
      ->needs(dir);
  app.add_option("--save-model", o.save_model, "write the final model with torch::save (rank 0)")
      ->type_name("FILE");
  app.add_flag("--quiet", o.quiet, "print only the final summary");
  o.testing.add_flags(app);  // the crash only: the elastic ones act in plain_train
}

}  // namespace

void add_options(CLI::App& app, TrainOptions& o) {
  examples::describe_program(
      app,
      "Trains a ResNet image classifier and reports loss, accuracy and throughput per epoch. "
      "Started with `mpiexec -n N`, it trains data-parallel on N ranks: each rank takes its own "
      "shard of every epoch and gradients are averaged before each step, so the global batch is "
      "N x --batch-size.");
  add_data_options(app, o);
  add_model_options(app, o);
  add_optimizer_options(app, o);
  add_distributed_options(app, o);
  add_checkpoint_options(app, o);
  app.callback([&o, &app] {
    const bool powersgd = o.compression == GradientCompression::powersgd;
    for (const char* flag : {"--powersgd-rank", "--powersgd-start-step"})
      if (app.count(flag) > 0 && !powersgd)
        throw CLI::ValidationError(flag, "applies to --compression powersgd");
    if (o.op == GradientOp::adasum && o.compression != GradientCompression::none)
      throw CLI::ValidationError("--op", "adasum combines the gradients as they are: drop "
                                         "--compression " + compression_name(o.compression));
    if (o.shard != dtrain::Shard::none && (powersgd || o.op == GradientOp::adasum))
      throw CLI::ValidationError("--shard", "optimizer reduce-scatters the gradients: it works "
                                            "with --compression none/fp16/bf16 and --op average");
    if (o.sync_bn) {
      if (o.norm != Norm::batch)
        throw CLI::ValidationError("--sync-bn", "synchronizes batch norm; --norm group has none");
      o.norm = Norm::sync_batch;
    }
    if (o.warmup_epochs > static_cast<double>(o.epochs)) {
      std::ostringstream message;
      message << "(" << o.warmup_epochs << ") must not exceed --epochs (" << o.epochs << ")";
      throw CLI::ValidationError("--warmup-epochs", message.str());
    }
  });
}

TrainOptions parse_options(std::vector<std::string> args) {
  TrainOptions options;
  CLI::App app("", "resnet_train");
  add_options(app, options);
  examples::parse_arguments(app, std::move(args));
  return options;
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

}  // namespace resnet
