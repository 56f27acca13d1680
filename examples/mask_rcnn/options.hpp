#pragma once
// Command-line options of the Mask R-CNN trainer, each flag declared once on a CLI::App with what
// it accepts, and its learning-rate schedule.

#include <CLI/CLI.hpp>
#include <c10/core/DeviceType.h>
#include <dtrain/train/distributed_optimizer.hpp>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "backbone.hpp"  // Norm

namespace mask_rcnn {

struct TrainOptions {
  std::string dataset = "shapes";  // shapes | coco
  // coco: instances files and image folders (COCO 2017: annotations/instances_train2017.json
  // and train2017/, annotations/instances_val2017.json and val2017/).
  std::string train_annotations, train_images, val_annotations, val_images;
  std::int64_t min_size = 800;   // coco: shorter image side
  std::int64_t max_size = 1333;  // coco: longer image side at most
  std::int64_t shapes_train = 20000;  // shapes: training images (a set fixed by --seed)
  std::int64_t shapes_val = 200;      // shapes: held-out images (another seed)
  std::pair<std::int64_t, std::int64_t> shapes_size{64, 96};  // shapes: sides in [first, second]

  std::string model = "tiny";
  Norm norm = Norm::group;         // backbone and mask head
  std::int64_t iterations = 1200;  // global steps
  std::int64_t batch_size = 2;     // images per step on each rank
  double lr = 0.02;                // for the global batch (ranks x --batch-size images)
  double momentum = 0.9;
  double weight_decay = 1e-4;
  dtrain::Shard shard = dtrain::Shard::none;  // optimizer: each rank keeps 1/ranks of SGD's state
  std::int64_t warmup_iterations = 100;
  bool flip = false;               // random horizontal flips (always on for coco)
  bool shuffle = true;
  std::uint64_t seed = 1;
  std::int64_t threads = 0;        // 0: the host's cores / ranks on the host
  c10::DeviceType device = c10::DeviceType::CPU;

  std::string out = "mask_rcnn_output";
  std::string checkpoint;          // --eval-only: the checkpoint to evaluate
  bool eval_only = false;
  bool evaluate = true;            // --no-eval: skip the evaluation after training
  std::int64_t eval_images = 0;    // 0: the whole evaluation set
  std::int64_t png_images = 8;     // validation images drawn into predictions.png
  std::int64_t log_every = 50;
  bool smoke = false;              // small defaults for the flags not given
};

// Declares every flag on `app`, each writing its field of `options`, and what app.parse() does
// after them: --smoke's defaults under the flags given, and the checks that involve more than one
// flag (a refused command line throws a CLI::ParseError).
void add_options(CLI::App& app, TrainOptions& options);

// Parses `args` (without the program name) as mask_rcnn_train would. Throws CLI::ParseError, and
// CLI::CallForHelp for --help.
TrainOptions parse_options(std::vector<std::string> args);

// The learning rate at a step: a linear ramp from lr / 100 to lr over the warmup, then lr
// divided by 10 at 3/4 and again at 11/12 of the run (Detectron's schedule, scaled to its length).
double learning_rate(const TrainOptions& options, std::int64_t iteration);

}  // namespace mask_rcnn
