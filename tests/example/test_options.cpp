#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "options.hpp"

namespace {

using resnet::parse_options;
using resnet::TrainOptions;
using resnet::UsageError;

std::string usage_error(const std::vector<std::string>& args) {
  try {
    parse_options(args);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "<nothing thrown>";
}

}  // namespace

TEST_CASE("no flags: the defaults") {
  const TrainOptions o = parse_options(std::vector<std::string>{});
  CHECK(o.model == "resnet8");
  CHECK(o.dataset == "fashion-mnist");
  CHECK(o.data_dir.empty());
  CHECK(o.epochs == 3);
  CHECK(o.batch_size == 128);
  CHECK(o.threads == 0);
  CHECK(o.bucket_mb < 0);  // DistributedOptimizer's default
  CHECK(o.compression == "none");
  CHECK_FALSE(o.scale_lr);
  CHECK(o.norm == "batch");
  CHECK_FALSE(o.sync_bn);
  CHECK(o.stem == "auto");
  CHECK_FALSE(o.quiet);
  CHECK_FALSE(o.augment);
}

TEST_CASE("every flag, in both spellings") {
  const TrainOptions o = parse_options(std::vector<std::string>{"--model",
                                                                "resnet56",
                                                                "--dataset=cifar10",
                                                                "--data-dir",
                                                                "/data/cifar",
                                                                "--epochs=7",
                                                                "--batch-size",
                                                                "64",
                                                                "--lr",
                                                                "0.4",
                                                                "--momentum=0.85",
                                                                "--weight-decay",
                                                                "1e-4",
                                                                "--scale-lr",
                                                                "--warmup-epochs",
                                                                "2.5",
                                                                "--norm=group",
                                                                "--stem",
                                                                "small",
                                                                "--seed",
                                                                "123",
                                                                "--threads",
                                                                "2",
                                                                "--bucket-mb=0.5",
                                                                "--compression",
                                                                "bf16",
                                                                "--max-steps-per-epoch",
                                                                "10",
                                                                "--eval-samples=500",
                                                                "--augment",
                                                                "--image-size",
                                                                "48",
                                                                "--synthetic-samples",
                                                                "256",
                                                                "--checkpoint-dir",
                                                                "ckpt",
                                                                "--checkpoint-every",
                                                                "25",
                                                                "--keep-checkpoints",
                                                                "2",
                                                                "--resume",
                                                                "--save-model",
                                                                "final.pt",
                                                                "--crash-rank",
                                                                "1",
                                                                "--crash-after-step",
                                                                "30",
                                                                "--quiet"});
  CHECK(o.model == "resnet56");
  CHECK(o.dataset == "cifar10");
  CHECK(o.data_dir == "/data/cifar");
  CHECK(o.epochs == 7);
  CHECK(o.batch_size == 64);
  CHECK(o.lr == doctest::Approx(0.4));
  CHECK(o.momentum == doctest::Approx(0.85));
  CHECK(o.weight_decay == doctest::Approx(1e-4));
  CHECK(o.scale_lr);
  CHECK(o.warmup_epochs == doctest::Approx(2.5));
  CHECK(o.norm == "group");
  CHECK(o.stem == "small");
  CHECK(o.seed == 123);
  CHECK(o.threads == 2);
  CHECK(o.bucket_mb == doctest::Approx(0.5));
  CHECK(o.compression == "bf16");
  CHECK(o.max_steps_per_epoch == 10);
  CHECK(o.eval_samples == 500);
  CHECK(o.augment);
  CHECK(o.image_size == 48);
  CHECK(o.synthetic_samples == 256);
  CHECK(o.checkpoint_dir == "ckpt");
  CHECK(o.checkpoint_every == 25);
  CHECK(o.keep_checkpoints == 2);
  CHECK(o.resume);
  CHECK(o.save_model == "final.pt");
  CHECK(o.crash_rank == 1);
  CHECK(o.crash_after_step == 30);
  CHECK_FALSE(o.elastic);
  CHECK(o.quiet);
  CHECK_FALSE(o.help);
  CHECK(parse_options(std::vector<std::string>{"--help"}).help);
}

TEST_CASE("--elastic: commits into each host's --checkpoint-dir") {
  const TrainOptions o = parse_options(std::vector<std::string>{
      "--elastic", "--checkpoint-dir", "/dev/shm/{host}", "--checkpoint-every", "20"});
  CHECK(o.elastic);
  CHECK(o.checkpoint_dir == "/dev/shm/{host}");
  CHECK(o.checkpoint_every == 20);
  CHECK_FALSE(o.resume);  // implied: an elastic world always resumes from the newest commit
}

TEST_CASE("bad flags are usage errors that name the flag and what it accepts") {
  CHECK(usage_error({"--bogus"}) == "unknown option '--bogus'");
  CHECK(usage_error({"epochs"}) == "unexpected argument 'epochs'; options start with --");
  CHECK(usage_error({"--"}) == "unexpected argument '--'; options start with --");
  CHECK(usage_error({"--epochs"}) == "--epochs needs a value");
  CHECK(usage_error({"--epochs", "two"}) == "--epochs: 'two' is not a valid integer");
  CHECK(usage_error({"--epochs", "3x"}) == "--epochs: '3x' is not a valid integer");
  CHECK(usage_error({"--epochs=0"}) == "--epochs must be >= 1, got 0");
  CHECK(usage_error({"--batch-size", "-4"}) == "--batch-size must be >= 1, got -4");
  CHECK(usage_error({"--lr", "0"}) == "--lr must be positive, got 0");
  CHECK(usage_error({"--lr", "nan"}) == "--lr: 'nan' is not finite");
  CHECK(usage_error({"--lr="}) == "--lr: '' is not a valid number");
  CHECK(usage_error({"--momentum", "1"}) == "--momentum must be in [0, 1), got 1");
  CHECK(usage_error({"--weight-decay", "-1"}) == "--weight-decay must be >= 0, got -1");
  CHECK(usage_error({"--seed", "-1"}) == "--seed: '-1' is not a valid integer");
  CHECK(usage_error({"--dataset", "mnist"}) ==
        "--dataset must be one of fashion-mnist, cifar10, imagefolder, synthetic, got mnist");
  CHECK(usage_error({"--data-dir="}) == "--data-dir must be non-empty, got ''");
  CHECK(usage_error({"--quiet=yes"}) == "--quiet takes no value");
  CHECK(usage_error({"--scale-lr=2"}) == "--scale-lr takes no value");
  CHECK(usage_error({"--norm", "layer"}) == "--norm must be batch or group, got layer");
  CHECK(usage_error({"--norm", "group", "--sync-bn"}) ==
        "--sync-bn synchronizes batch norm; --norm group has none");
  CHECK(parse_options(std::vector<std::string>{"--sync-bn"}).sync_bn);
  CHECK(usage_error({"--stem", "large"}) == "--stem must be auto, standard or small, got large");
  CHECK(usage_error({"--resume"}) ==
        "--resume needs --checkpoint-dir: the folder that holds the checkpoints");
  CHECK(usage_error({"--checkpoint-every", "10"}) ==
        "--checkpoint-every needs --checkpoint-dir: the folder that holds the checkpoints");
  CHECK(usage_error({"--keep-checkpoints", "-1"}) == "--keep-checkpoints must be >= 0, got -1");
  CHECK(usage_error({"--bucket-mb", "-1"}) == "--bucket-mb must be >= 0, got -1");
  CHECK(usage_error({"--compression", "int8"}) ==
        "--compression must be one of none, fp16, bf16, got int8");
  CHECK(usage_error({"--crash-rank", "0"}) == "--crash-rank and --crash-after-step go together");
  CHECK(usage_error({"--elastic"}) ==
        "--elastic needs --checkpoint-dir: each host's own folder for the commits");
  CHECK(usage_error({"--elastic=1"}) == "--elastic takes no value");
  CHECK(usage_error({"--epochs", "2", "--warmup-epochs", "3"}) ==
        "--warmup-epochs (3) must not exceed --epochs (2)");
}

TEST_CASE("the usage text documents every flag") {
  const auto text = resnet::usage("resnet_train");
  CHECK(text.rfind("usage: resnet_train [options]", 0) == 0);
  for (const char* flag :
       {"--model",          "--dataset", "--data-dir",   "--epochs",
        "--batch-size",     "--lr",      "--momentum",   "--weight-decay",
        "--warmup-epochs",  "--seed",    "--threads",    "--max-steps-per-epoch",
        "--eval-samples",   "--augment", "--image-size", "--synthetic-samples",
        "--checkpoint-dir", "--quiet",   "--help",       "apt-get install dataset-fashion-mnist",
        "--scale-lr",       "--norm",    "mpiexec -n N", "--stem",
        "--checkpoint-every", "--keep-checkpoints", "--resume", "--save-model",
        "--crash-rank",     "--crash-after-step", "--bucket-mb", "--elastic",
        "--sync-bn",        "--compression"}) {
    CAPTURE(flag);
    CHECK(text.find(flag) != std::string::npos);
  }
}

TEST_CASE("threads: ranks x threads fill the cores this process may use, at least one each") {
  using resnet::choose_threads;
  CHECK(choose_threads(0, 2, 1).threads == 2);
  CHECK(choose_threads(0, 2, 1).description == "1 rank x 2 threads on 2 cores of this host");
  CHECK(choose_threads(0, 2, 2).threads == 1);
  CHECK(choose_threads(0, 16, 3).threads == 5);  // 15 of 16: never more threads than cores
  CHECK(choose_threads(0, 2, 4).threads == 1);
  CHECK(choose_threads(0, 2, 4).description ==
        "4 ranks x 1 thread on 2 cores of this host, oversubscribed");
  CHECK(choose_threads(3, 2, 1).threads == 3);
  CHECK(choose_threads(3, 2, 1).description ==
        "1 rank x 3 threads on 2 cores of this host (--threads), oversubscribed");
  CHECK(choose_threads(1, 2, 2).description ==
        "2 ranks x 1 thread on 2 cores of this host (--threads)");
}
