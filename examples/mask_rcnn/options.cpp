#include "options.hpp"

#include <algorithm>
#include <limits>
#include <map>
#include <set>

namespace mask_rcnn {

std::string usage(const std::string& program) {
  return "usage: " + program + R"( [options]

Trains Mask R-CNN (ResNet-FPN backbone with group norm, RPN, box and 28x28 mask heads) from
scratch, then evaluates it COCO-style (box and mask AP) on a held-out set and writes
ground_truth.json, detections.json, evaluation.json, predictions.png and model.pt to --out.
Started with `mpiexec -n N`, it trains data-parallel on N ranks: each rank takes its own batches
of similar-sized images, and gradients are averaged before each step, so the global batch is
N x --batch-size.

Data
  --dataset NAME            shapes (default): generated circles, squares and triangles; or coco
  --shapes-train N          shapes: training images (default 20000)
  --shapes-val N            shapes: held-out evaluation images (default 200)
  --shapes-size MIN,MAX     shapes: image sides in [MIN, MAX] (default 64,96)
  --train-annotations FILE  coco: instances file for training (e.g. instances_train2017.json)
  --train-images DIR        coco: its image folder (e.g. train2017)
  --val-annotations FILE    coco: instances file for evaluation (e.g. instances_val2017.json)
  --val-images DIR          coco: its image folder (e.g. val2017)
  --min-size N              coco: resize the shorter image side to N (default 800) ...
  --max-size N              ... unless the longer side would exceed N (default 1333)
  --flip                    random horizontal flips (always on for coco)

Training
  --model NAME              tiny (default), small, resnet18, resnet34
  --norm NAME               after the backbone's and the mask head's convolutions: group
                            (default), batch (each rank's own statistics) or syncbn (batch
                            norm over every rank's batch, dtrain::SyncBatchNorm)
  --iterations N            global steps (default 1200)
  --batch-size N            images per step on each rank (default 2)
  --lr X                    SGD learning rate for the global batch (default 0.02); a linear
                            warmup from X/100, then X/10 at 3/4 and X/100 at 11/12 of the run
  --warmup-iterations N     (default 100)
  --momentum X              (default 0.9)
  --weight-decay X          (default 1e-4)
  --no-shuffle              batches in size order, the same on every run (for comparisons)
  --seed N                  seed of the weights, the data order, the shapes (default 1)
  --threads N               intra-op threads per rank (default 0: cores / ranks on the host)
  --device NAME             cpu (default) or cuda: each rank on GPU (local rank mod GPUs)
  --log-every N             a progress line every N iterations (default 50)

Evaluation and output
  --out DIR                 output folder (default mask_rcnn_output)
  --eval-images N           evaluate on the first N images of the evaluation set (default: all)
  --png-images N            evaluation images drawn into predictions.png (default 8)
  --no-eval                 train and save the checkpoint only
  --eval-only               evaluate --checkpoint FILE instead of training
  --checkpoint FILE         a model.pt written by this program
  --smoke                   a quick check: 40 iterations on 200 small images, then evaluation
                            on 16 (other flags still apply)
  --help                    print this text
)";
}

TrainOptions parse_options(const std::vector<std::string>& args) {
  using namespace examples;  // the setters of common/command_line.hpp
  TrainOptions o;
  const double huge = std::numeric_limits<double>::infinity();
  const std::map<std::string, Setter> with_value = {
      {"dataset", one_of(o.dataset, {"shapes", "coco"})},
      {"train-annotations", text(o.train_annotations)},
      {"train-images", text(o.train_images)},
      {"val-annotations", text(o.val_annotations)},
      {"val-images", text(o.val_images)},
      {"min-size", integer(o.min_size, 0)},
      {"max-size", integer(o.max_size, 0)},
      {"shapes-train", integer(o.shapes_train, 1)},
      {"shapes-val", integer(o.shapes_val, 1)},
      {"shapes-size",
       [&o](const std::string& flag, const std::string& value) {
         const auto comma = value.find(',');
         require(comma != std::string::npos, flag, "MIN,MAX", value);
         o.shapes_min_side = parse_number<std::int64_t>(flag, value.substr(0, comma));
         o.shapes_max_side = parse_number<std::int64_t>(flag, value.substr(comma + 1));
         require(o.shapes_min_side >= 32 && o.shapes_max_side >= o.shapes_min_side, flag,
                 "MIN,MAX with 32 <= MIN <= MAX", value);
       }},
      {"model", text(o.model)},
      {"norm", one_of(o.norm, {"group", "batch", "syncbn"})},
      {"iterations", integer(o.iterations, 1)},
      {"batch-size", integer(o.batch_size, 1)},
      {"lr", positive(o.lr)},
      {"warmup-iterations", integer(o.warmup_iterations, 0)},
      {"momentum", real(o.momentum, 0.0, 1.0, "in [0, 1)")},
      {"weight-decay", real(o.weight_decay, 0.0, huge, ">= 0")},
      {"seed",
       [&o](const std::string& flag, const std::string& value) {
         o.seed = parse_number<std::uint64_t>(flag, value);
       }},
      {"threads", integer(o.threads, 0)},
      {"device", one_of(o.device, {"cpu", "cuda"})},
      {"log-every", integer(o.log_every, 1)},
      {"out", text(o.out)},
      {"eval-images", integer(o.eval_images, 0)},
      {"png-images", integer(o.png_images, 0)},
      {"checkpoint", text(o.checkpoint)},
  };
  bool no_shuffle = false, no_eval = false;
  const std::map<std::string, bool*> switches = {{"flip", &o.flip},
                                                 {"no-shuffle", &no_shuffle},
                                                 {"no-eval", &no_eval},
                                                 {"eval-only", &o.eval_only},
                                                 {"smoke", &o.smoke},
                                                 {"help", &o.help}};

  const std::set<std::string> given = examples::parse_flags(args, with_value, switches);
  o.shuffle = !no_shuffle;
  o.evaluate = !no_eval;
  if (o.smoke) {
    auto fallback = [&given](const char* flag, auto& field, auto value) {
      if (!given.count(flag)) field = value;
    };
    fallback("iterations", o.iterations, std::int64_t{40});
    fallback("shapes-train", o.shapes_train, std::int64_t{200});
    fallback("shapes-val", o.shapes_val, std::int64_t{16});
    fallback("eval-images", o.eval_images, std::int64_t{16});
    fallback("batch-size", o.batch_size, std::int64_t{2});
    fallback("warmup-iterations", o.warmup_iterations, std::int64_t{10});
    fallback("log-every", o.log_every, std::int64_t{5});
    fallback("png-images", o.png_images, std::int64_t{4});
    if (!given.count("shapes-size")) {
      o.shapes_min_side = 64;
      o.shapes_max_side = 96;
    }
  }
  if (o.dataset == "coco") {
    o.flip = true;
    const bool training = !o.eval_only;
    for (const auto& [flag, field] : std::vector<std::pair<std::string, const std::string*>>{
             {"train-annotations", &o.train_annotations},
             {"train-images", &o.train_images},
             {"val-annotations", &o.val_annotations},
             {"val-images", &o.val_images}}) {
      const bool needed = flag.rfind("val", 0) == 0 ? (o.evaluate || o.eval_only) : training;
      if (needed && field->empty()) throw UsageError("--dataset coco needs --" + flag);
    }
  }
  if (o.eval_only && o.checkpoint.empty()) {
    throw UsageError("--eval-only needs --checkpoint FILE (a model.pt this program wrote)");
  }
  if (o.shapes_max_side < o.shapes_min_side) {
    throw UsageError("--shapes-size: MAX must be >= MIN");
  }
  return o;
}

TrainOptions parse_options(int argc, const char* const* argv) {
  return parse_options(examples::arguments(argc, argv));
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
