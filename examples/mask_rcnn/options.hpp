#pragma once
// Command-line options of the Mask R-CNN trainer, and its learning-rate schedule. Free of libtorch
// so that parsing is cheap to test.

#include <cstdint>
#include <string>
#include <vector>

#include "common/command_line.hpp"

namespace mask_rcnn {

// A flag the trainer does not accept, or a value it cannot use.
using examples::UsageError;

struct TrainOptions {
  std::string dataset = "shapes";  // shapes | coco
  // coco: instances files and image folders (COCO 2017: annotations/instances_train2017.json
  // and train2017/, annotations/instances_val2017.json and val2017/).
  std::string train_annotations, train_images, val_annotations, val_images;
  std::int64_t min_size = 800;   // coco: shorter image side
  std::int64_t max_size = 1333;  // coco: longer image side at most
  std::int64_t shapes_train = 20000;  // shapes: training images (a set fixed by --seed)
  std::int64_t shapes_val = 200;      // shapes: held-out images (another seed)
  std::int64_t shapes_min_side = 64;
  std::int64_t shapes_max_side = 96;

  std::string model = "tiny";
  std::string norm = "group";      // group | batch | syncbn (backbone and mask head)
  std::int64_t iterations = 1200;  // global steps
  std::int64_t batch_size = 2;     // images per step on each rank
  double lr = 0.02;                // for the global batch (ranks x --batch-size images)
  double momentum = 0.9;
  double weight_decay = 1e-4;
  std::int64_t warmup_iterations = 100;
  bool flip = false;               // random horizontal flips (default on for coco)
  bool shuffle = true;
  std::uint64_t seed = 1;
  std::int64_t threads = 0;        // 0: the host's cores / ranks on the host
  std::string device = "cpu";      // cpu | cuda

  std::string out = "mask_rcnn_output";
  std::string checkpoint;          // --eval-only: the checkpoint to evaluate
  bool eval_only = false;
  bool evaluate = true;            // --no-eval: skip the evaluation after training
  std::int64_t eval_images = 0;    // 0: the whole evaluation set
  std::int64_t png_images = 8;     // validation images drawn into predictions.png
  std::int64_t log_every = 50;
  bool smoke = false;
  bool help = false;
};

// The usage text, `program` being argv[0].
std::string usage(const std::string& program);

// Accepts `--flag value` and `--flag=value`. --smoke sets small defaults (a few dozen iterations
// on a few hundred generated images) that explicit flags still override. Throws UsageError
// naming the flag and what it accepts.
TrainOptions parse_options(const std::vector<std::string>& args);
TrainOptions parse_options(int argc, const char* const* argv);

// The learning rate at a step: a linear ramp from lr / 100 to lr over the warmup, then lr
// divided by 10 at 3/4 and again at 11/12 of the run (Detectron's schedule, scaled to its length).
double learning_rate(const TrainOptions& options, std::int64_t iteration);

}  // namespace mask_rcnn
