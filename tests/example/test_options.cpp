#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "options.hpp"

namespace {

using resnet::parse_options;
using resnet::TrainOptions;

// The message of the CLI::ParseError that `args` are refused with.
std::string refused(const std::vector<std::string>& args) {
  try {
    parse_options(args);
  } catch (const CLI::ParseError& e) {
    return e.what();
  }
  return "<nothing thrown>";
}

std::string help_text() {
  CLI::App app("", "resnet_train");
  TrainOptions options;
  resnet::add_options(app, options);
  return app.help();
}

}  // namespace

TEST_CASE("no flags: the defaults") {
  const TrainOptions o = parse_options({});
  CHECK(o.model == "resnet8");
  CHECK(o.dataset == "fashion-mnist");
  CHECK(o.data_dir.empty());
  CHECK(o.epochs == 3);
  CHECK(o.batch_size == 128);
  CHECK(o.threads == 0);
  CHECK_FALSE(o.bucket_mb.has_value());  // DistributedOptimizer's default
  CHECK(o.compression == resnet::GradientCompression::none);
  CHECK(o.powersgd_rank == 2);
  CHECK(o.powersgd_start_step == 50);
  CHECK(o.op == resnet::GradientOp::average);
  CHECK_FALSE(o.scale_lr);
  CHECK(o.norm == resnet::Norm::batch);
  CHECK_FALSE(o.sync_bn);
  CHECK(o.stem == "auto");
  CHECK_FALSE(o.quiet);
  CHECK_FALSE(o.augment);
  CHECK(o.testing.crash_rank == -1);
}

TEST_CASE("every flag, in both spellings") {
  const TrainOptions o = parse_options(
      {"--model",          "resnet56", "--dataset=cifar10",  "--data-dir",   "/data/cifar",
       "--epochs=7",       "--batch-size", "64",             "--lr",         "0.4",
       "--momentum=0.85",  "--weight-decay", "1e-4",         "--scale-lr",   "--warmup-epochs",
       "2.5",              "--norm=group", "--stem",         "small",        "--seed",
       "123",              "--threads",  "2",                "--bucket-mb=0.5", "--compression",
       "bf16",             "--max-steps-per-epoch", "10",    "--eval-samples=500", "--augment",
       "--image-size",     "48",         "--synthetic-samples", "256",     "--checkpoint-dir",
       "ckpt",             "--checkpoint-every", "25",       "--keep-checkpoints", "2",
       "--resume",         "--save-model", "final.pt",       "--crash-rank", "1",
       "--crash-after-step", "30",       "--quiet"});
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
  CHECK(o.norm == resnet::Norm::group);
  CHECK(o.stem == "small");
  CHECK(o.seed == 123);
  CHECK(o.threads == 2);
  REQUIRE(o.bucket_mb.has_value());
  CHECK(*o.bucket_mb == doctest::Approx(0.5));
  CHECK(o.compression == resnet::GradientCompression::bf16);
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
  CHECK(o.testing.crash_rank == 1);
  CHECK(o.testing.crash_after_step == 30);
  CHECK_FALSE(o.elastic);
  CHECK(o.quiet);
  CHECK_THROWS_AS(parse_options({"--help"}), CLI::CallForHelp);
}

TEST_CASE("--sync-bn turns batch norm into SyncBatchNorm; --bucket-mb 0 is a size") {
  const TrainOptions o = parse_options({"--sync-bn", "--bucket-mb", "0"});
  CHECK(o.sync_bn);
  CHECK(o.norm == resnet::Norm::sync_batch);
  REQUIRE(o.bucket_mb.has_value());
  CHECK(*o.bucket_mb == 0.0);
  CHECK(parse_options({"--compression", "fp16"}).compression == resnet::GradientCompression::fp16);
}

TEST_CASE("--compression powersgd with its rank and start; --op adasum") {
  const TrainOptions o = parse_options(
      {"--compression", "powersgd", "--powersgd-rank", "4", "--powersgd-start-step=0"});
  CHECK(o.compression == resnet::GradientCompression::powersgd);
  CHECK(o.powersgd_rank == 4);
  CHECK(o.powersgd_start_step == 0);
  CHECK(parse_options({"--op", "adasum"}).op == resnet::GradientOp::adasum);
}

TEST_CASE("--elastic: commits into each host's --checkpoint-dir") {
  const TrainOptions o = parse_options(
      {"--elastic", "--checkpoint-dir", "/dev/shm/{host}", "--checkpoint-every", "20"});
  CHECK(o.elastic);
  CHECK(o.checkpoint_dir == "/dev/shm/{host}");
  CHECK(o.checkpoint_every == 20);
  CHECK_FALSE(o.resume);  // implied: an elastic world always resumes from the newest commit
}

TEST_CASE("bad flags are refused with the flag and what it accepts") {
  CHECK(refused({"--bogus"}) == "The following argument was not expected: --bogus");
  CHECK(refused({"--epochs"}) == "--epochs: 1 required INT:>= 1 missing");
  CHECK(refused({"--epochs", "two"}) == "--epochs: must be an integer >= 1, got 'two'");
  CHECK(refused({"--epochs", "3x"}) == "--epochs: must be an integer >= 1, got '3x'");
  CHECK(refused({"--epochs=0"}) == "--epochs: must be an integer >= 1, got '0'");
  CHECK(refused({"--batch-size", "-4"}) == "--batch-size: must be an integer >= 1, got '-4'");
  CHECK(refused({"--lr", "0"}) == "--lr: must be a number > 0, got '0'");
  CHECK(refused({"--lr", "nan"}) == "--lr: must be a number > 0, got 'nan'");
  CHECK(refused({"--momentum", "1"}) == "--momentum: must be a number in [0, 1), got '1'");
  CHECK(refused({"--weight-decay", "-1"}) == "--weight-decay: must be a number >= 0, got '-1'");
  CHECK(refused({"--seed", "-1"}) == "--seed: must be an integer >= 0, got '-1'");
  CHECK(refused({"--dataset", "mnist"}) ==
        "--dataset: mnist not in {fashion-mnist,cifar10,imagefolder,synthetic}");
  CHECK(refused({"--model", "resnet19"}).rfind("--model: resnet19 not in {resnet8,", 0) == 0);
  CHECK(refused({"--norm", "layer"}) == "--norm: layer not in {batch,group}");
  CHECK(refused({"--norm", "1"}) == "--norm: 1 not in {batch,group}");  // not the enum's number
  CHECK(refused({"--norm", "group", "--sync-bn"}) ==
        "--sync-bn: synchronizes batch norm; --norm group has none");
  CHECK(refused({"--stem", "large"}) == "--stem: large not in {auto,standard,small}");
  CHECK(refused({"--compression", "int8"}) ==
        "--compression: int8 not in {none,fp16,bf16,powersgd}");
  CHECK(refused({"--powersgd-rank", "2"}) == "--powersgd-rank: applies to --compression powersgd");
  CHECK(refused({"--compression", "powersgd", "--powersgd-rank", "0"}) ==
        "--powersgd-rank: must be an integer >= 1, got '0'");
  CHECK(refused({"--op", "sum"}) == "--op: sum not in {average,adasum}");
  CHECK(refused({"--op", "adasum", "--compression", "fp16"}) ==
        "--op: adasum combines the gradients as they are: drop --compression fp16");
  CHECK(refused({"--shard", "optimizer", "--compression", "powersgd"}).rfind("--shard: ", 0) == 0);
  CHECK(refused({"--resume"}) == "--resume requires --checkpoint-dir");
  CHECK(refused({"--checkpoint-every", "10"}) == "--checkpoint-every requires --checkpoint-dir");
  CHECK(refused({"--elastic"}) == "--elastic requires --checkpoint-dir");
  CHECK(refused({"--keep-checkpoints", "-1"}) ==
        "--keep-checkpoints: must be an integer >= 0, got '-1'");
  CHECK(refused({"--bucket-mb", "-1"}) == "--bucket-mb: must be a number >= 0, got '-1'");
  CHECK(refused({"--crash-rank", "0"}) == "--crash-rank requires --crash-after-step");
  CHECK(refused({"--crash-after-step", "3"}) == "--crash-after-step requires --crash-rank");
  CHECK(refused({"--epochs", "2", "--warmup-epochs", "3"}) ==
        "--warmup-epochs: (3) must not exceed --epochs (2)");
}

TEST_CASE("the help shows every flag a user sets, and none of the testing flags") {
  const auto text = help_text();
  for (const char* flag :
       {"--model",          "--dataset", "--data-dir",   "--epochs",
        "--batch-size",     "--lr",      "--momentum",   "--weight-decay",
        "--warmup-epochs",  "--seed",    "--threads",    "--max-steps-per-epoch",
        "--eval-samples",   "--augment", "--image-size", "--synthetic-samples",
        "--checkpoint-dir", "--quiet",   "--help",       "apt-get install dataset-fashion-mnist",
        "--scale-lr",       "--norm",    "mpiexec -n N", "--stem",
        "--checkpoint-every", "--keep-checkpoints", "--resume", "--save-model",
        "--bucket-mb",      "--elastic", "--sync-bn",    "--compression",
        "--powersgd-rank",  "--powersgd-start-step", "--op"}) {
    CAPTURE(flag);
    CHECK(text.find(flag) != std::string::npos);
  }
  for (const char* flag : {"--crash-rank", "--crash-after-step"}) {
    CAPTURE(flag);
    CHECK(text.find(flag) == std::string::npos);
  }
  // Each default at the end of its description.
  CHECK(text.find("training epochs (default: 3)") != std::string::npos);
  CHECK(text.find("(default: batch)") != std::string::npos);
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
