#include "options.hpp"

#include <algorithm>

#include "common/cli.hpp"
#include "model.hpp"  // preset_names

namespace mask_rcnn {

namespace {

using examples::at_least;

void add_data_options(CLI::App& app, TrainOptions& o) {
  app.add_option("--dataset", o.dataset,
                 "shapes: generated circles, squares and triangles; or coco")
      ->check(CLI::IsMember({"shapes", "coco"}));
  app.add_option("--shapes-train", o.shapes_train, "shapes: training images")
      ->check(at_least<std::int64_t>(1));
  app.add_option("--shapes-val", o.shapes_val, "shapes: held-out evaluation images")
      ->check(at_least<std::int64_t>(1));
  app.add_option("--shapes-size", o.shapes_size, "shapes: image sides in [MIN, MAX]")
      ->delimiter(',')
      ->type_name("MIN,MAX")
      ->default_str("64,96")
      ->check(at_least<std::int64_t>(32));
  app.add_option("--train-annotations", o.train_annotations,
                 "coco: instances file for training (e.g. instances_train2017.json)")
      ->type_name("FILE");
  app.add_option("--train-images", o.train_images, "coco: its image folder (e.g. train2017)")
      ->type_name("DIR");
  app.add_option("--val-annotations", o.val_annotations,
                 "coco: instances file for evaluation (e.g. instances_val2017.json)")
      ->type_name("FILE");
  app.add_option("--val-images", o.val_images, "coco: its image folder (e.g. val2017)")
      ->type_name("DIR");
  app.add_option("--min-size", o.min_size, "coco: resize the shorter image side to N ...")
      ->check(at_least<std::int64_t>(0));
  app.add_option("--max-size", o.max_size, "... unless the longer side would exceed N")
      ->check(at_least<std::int64_t>(0));
  app.add_flag("--flip", o.flip, "random horizontal flips (always on for coco)");
}

void add_training_options(CLI::App& app, TrainOptions& o) {
  app.add_option("--model", o.model, "the backbone's size, smallest first")
      ->check(CLI::IsMember(preset_names()));
  examples::add_enum_option(app, "--norm", o.norm,
                            {{"group", Norm::group},
                             {"batch", Norm::batch},
                             {"syncbn", Norm::sync_batch}},
                            "after the backbone's and the mask head's convolutions: batch uses "
                            "each rank's own statistics, syncbn those of every rank's batch "
                            "(dtrain::SyncBatchNorm)");
  app.add_option("--iterations", o.iterations, "global steps")->check(at_least<std::int64_t>(1));
  app.add_option("--batch-size", o.batch_size, "images per step on each rank")
      ->check(at_least<std::int64_t>(1));
  app.add_option("--lr", o.lr,
                 "SGD learning rate for the global batch; a linear warmup from X/100, then X/10 "
                 "at 3/4 and X/100 at 11/12 of the run")
      ->check(examples::positive());
  app.add_option("--warmup-iterations", o.warmup_iterations, "steps of the warmup")
      ->check(at_least<std::int64_t>(0));
  app.add_option("--momentum", o.momentum, "SGD momentum")->check(examples::fraction());
  app.add_option("--weight-decay", o.weight_decay, "L2 penalty")->check(examples::non_negative());
  examples::add_enum_option(app, "--shard", o.shard,
                            {{"none", dtrain::Shard::none},
                             {"optimizer", dtrain::Shard::optimizer_state},
                             {"gradients", dtrain::Shard::gradients}},
                            "optimizer: each rank keeps the momentum of 1/ranks of the parameters "
                            "(ZeRO stage 1); gradients: and only their averaged gradients, "
                            "reduce-scattered during backward (ZeRO stage 2)");
  app.add_flag_callback("--no-shuffle", [&o] { o.shuffle = false; },
                        "batches in size order, the same on every run (for comparisons)");
  app.add_option("--seed", o.seed, "seed of the weights, the data order, the shapes")
      ->check(examples::number<std::uint64_t>(">= 0", [](std::uint64_t) { return true; }));
  app.add_option("--threads", o.threads,
                 "intra-op threads per rank (0: the host's cores / ranks on the host)")
      ->check(at_least<std::int64_t>(0));
  examples::add_enum_option(app, "--device", o.device,
                            {{"cpu", c10::DeviceType::CPU}, {"cuda", c10::DeviceType::CUDA}},
                            "cuda: each rank on a GPU (local rank mod GPUs)");
  app.add_option("--log-every", o.log_every, "a progress line every N iterations")
      ->check(at_least<std::int64_t>(1));
}

void add_output_options(CLI::App& app, TrainOptions& o) {
  app.add_option("--out", o.out, "output folder")->type_name("DIR");
  app.add_option("--eval-images", o.eval_images,
                 "evaluate on the first N images of the evaluation set (0: all)")
      ->check(at_least<std::int64_t>(0));
  app.add_option("--png-images", o.png_images, "evaluation images drawn into predictions.png")
      ->check(at_least<std::int64_t>(0));
  app.add_flag_callback("--no-eval", [&o] { o.evaluate = false; },
                        "train and save the checkpoint only");
  auto* checkpoint =
      app.add_option("--checkpoint", o.checkpoint, "a model.pt written by this program")
          ->check(CLI::ExistingFile);
  app.add_flag("--eval-only", o.eval_only, "evaluate --checkpoint instead of training")
      ->needs(checkpoint);
  app.add_flag("--smoke", o.smoke,
               "a quick check: 40 iterations on 200 small images, then evaluation on 16 (the "
               "flags given still apply)");
}

// --smoke's defaults, for the flags not given.
void apply_smoke_defaults(const CLI::App& app, TrainOptions& o) {
  const auto fallback = [&app](const char* flag, std::int64_t& field, std::int64_t value) {
    if (app.count(flag) == 0) field = value;
  };
  fallback("--iterations", o.iterations, 40);
  fallback("--shapes-train", o.shapes_train, 200);
  fallback("--shapes-val", o.shapes_val, 16);
  fallback("--eval-images", o.eval_images, 16);
  fallback("--warmup-iterations", o.warmup_iterations, 10);
  fallback("--log-every", o.log_every, 5);
  fallback("--png-images", o.png_images, 4);
}

void check_coco(TrainOptions& o) {
  o.flip = true;
  const std::pair<const char*, const std::string*> files[] = {
      {"--train-annotations", &o.train_annotations},
      {"--train-images", &o.train_images},
      {"--val-annotations", &o.val_annotations},
      {"--val-images", &o.val_images}};
  for (const auto& [flag, field] : files) {
    const bool for_training = std::string(flag).rfind("--train", 0) == 0;
    const bool needed = for_training ? !o.eval_only : o.evaluate || o.eval_only;
    if (needed && field->empty())
      throw CLI::ValidationError(std::string("--dataset coco needs ") + flag);
  }
}

}  // namespace

void add_options(CLI::App& app, TrainOptions& o) {
  examples::describe_program(
      app,
      "Trains Mask R-CNN (ResNet-FPN backbone, RPN, box and 28x28 mask heads) from scratch, then "
      "evaluates it COCO-style (box and mask AP) on a held-out set and writes ground_truth.json, "
      "detections.json, evaluation.json, predictions.png and model.pt to --out. Started with "
      "`mpiexec -n N`, it trains data-parallel on N ranks, each taking its own batches of "
      "similar-sized images; the global batch is N x --batch-size.");
  add_data_options(app, o);
  add_training_options(app, o);
  add_output_options(app, o);
  app.callback([&app, &o] {
    if (o.smoke) apply_smoke_defaults(app, o);
    if (o.shapes_size.second < o.shapes_size.first)
      throw CLI::ValidationError("--shapes-size", "MAX must be >= MIN");
    if (o.dataset == "coco") check_coco(o);
  });
}

TrainOptions parse_options(std::vector<std::string> args) {
  TrainOptions options;
  CLI::App app("", "mask_rcnn_train");
  add_options(app, options);
  examples::parse_arguments(app, std::move(args));
  return options;
}

double learning_rate(const TrainOptions& o, std::int64_t iteration) {
  const auto n = static_cast<double>(o.iterations), i = static_cast<double>(iteration);
  if (iteration < o.warmup_iterations) {
    const double progress = i / static_cast<double>(o.warmup_iterations);
    return o.lr * (0.01 + 0.99 * progress);
  }
  if (i >= n * 11.0 / 12.0) return o.lr * 0.01;
  if (i >= n * 0.75) return o.lr * 0.1;
  return o.lr;
}

}  // namespace mask_rcnn
