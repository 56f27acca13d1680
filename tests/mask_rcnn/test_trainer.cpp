// The trainer binary end to end: flags, the smoke run (losses, evaluation files, checkpoint),
// evaluating a checkpoint, a COCO-format folder, and 2 ranks against 1 rank with the doubled batch.

#include "torch_test.hpp"  // first: see its note

#include <stb_image_write.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "model.hpp"
#include "shapes.hpp"
#include "support/messages.hpp"
#include "support/parameter_drift.hpp"
#include "support/run_command.hpp"
#include "support/temp_dir.hpp"
#include "trainer_paths.hpp"  // MASK_RCNN_TRAIN, MASK_RCNN_MPIEXEC, MASK_RCNN_SMOKE_DIR

namespace {

using namespace mask_rcnn;
using dtrain::test::CommandResult;
using dtrain::test::contains;
using dtrain::test::run_command;
using dtrain::test::TempDir;
namespace fs = std::filesystem;

// Runs the trainer as one process (ranks = 0: without a launcher) or under mpiexec; `environment`
// (NAME=value ...) goes before the command.
CommandResult run_trainer(const std::vector<std::string>& args, int ranks = 0,
                          const std::string& environment = "") {
  std::string command = "'" MASK_RCNN_TRAIN "'";
  if (ranks > 0) command = MASK_RCNN_MPIEXEC " " + std::to_string(ranks) + " " + command;
  if (!environment.empty()) command = "env " + environment + " " + command;
  for (const auto& arg : args) command += " '" + arg + "'";
  return run_command(command);
}

struct Progress {
  int iteration = 0;
  std::array<double, 6> losses{};  // total, rpn_obj, rpn_box, cls, box, mask
};

std::vector<Progress> progress_lines(const std::string& output) {
  std::vector<Progress> lines;
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);) {
    Progress p;
    int total = 0;
    auto& l = p.losses;
    if (std::sscanf(line.c_str(), "iter %d/%d loss %lf rpn_obj %lf rpn_box %lf cls %lf box %lf mask %lf",
                    &p.iteration, &total, &l[0], &l[1], &l[2], &l[3], &l[4], &l[5]) == 8) {
      lines.push_back(p);
    }
  }
  return lines;
}

std::string read_file(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

TEST_CASE("trainer: a bad flag is refused with exit status 2; --help exits 0") {
  const auto bad = run_trainer({"--bogus"});
  CHECK(bad.exit_code == 2);
  CHECK(contains(bad.output, "mask_rcnn_train: The following argument was not expected: --bogus"));
  CHECK(contains(bad.output, "Run with --help"));
  const auto coco = run_trainer({"--dataset", "coco"});
  CHECK(coco.exit_code == 2);
  CHECK(contains(coco.output, "--dataset coco needs --train-annotations"));
  const auto help = run_trainer({"--help"});
  CHECK(help.exit_code == 0);
  CHECK(contains(help.output, "--eval-only"));
}

TEST_CASE("trainer smoke: 2 ranks train, losses fall, evaluation files are written; the checkpoint evaluates alike") {
  const fs::path out = MASK_RCNN_SMOKE_DIR;
  fs::remove_all(out);
  TempDir profile;
  const auto result = run_trainer({"--smoke", "--threads", "1", "--out", out.string()}, 2,
                                  "DTRAIN_PROFILE='" + profile.path().string() + "'");
  INFO(result.output);
  REQUIRE(result.exit_code == 0);
  CHECK(contains(result.output, "2 ranks x batch 2 = 4 images per step, 40 iterations"));
  const auto lines = progress_lines(result.output);
  REQUIRE(lines.size() == 8);  // every 5 of 40 iterations
  for (const auto& p : lines)
    for (const double loss : p.losses) CHECK(std::isfinite(loss));
  CHECK(lines.back().losses[0] < lines.front().losses[0]);
  CHECK(contains(result.output, "evaluation on 16 images"));
  CHECK(contains(result.output, "type |   AP   |  AP50  |  AP75  |  APs   |  APm   |  APl\nbbox |"));
  for (const char* file : {"ground_truth.json", "detections.json", "evaluation.json", "predictions.png", "model.pt"}) {
    CAPTURE(file);
    CHECK(fs::file_size(out / file) > 0);
  }
  CHECK(read_file(out / "predictions.png").substr(1, 3) == "PNG");

  // The profiler saw every step of every rank, each with the five phases of the training loop.
  // In the run's own folder inside the profile folder (Note [Profile layout]).
  std::vector<fs::path> runs;
  for (const auto& e : fs::directory_iterator(profile.path())) runs.push_back(e.path());
  REQUIRE(runs.size() == 1);
  for (const char* rank_file : {"rank-0.jsonl", "rank-1.jsonl"}) {
    CAPTURE(rank_file);
    std::istringstream in(read_file(runs.front() / rank_file));
    int steps = 0;
    for (std::string line; std::getline(in, line);) {
      if (!contains(line, "\"type\":\"step\"")) continue;
      ++steps;
      for (const char* phase : {"\"data\":", "\"forward\":", "\"backward\":", "\"communication_wait\":", "\"optimizer\":"}) {
        CAPTURE(phase);
        CHECK(contains(line, phase));
      }
    }
    CHECK(steps == 40);
  }

  // The checkpoint, evaluated on its own by one process: the same detections, the same numbers.
  TempDir again;
  const auto eval = run_trainer({"--smoke", "--threads", "1", "--eval-only", "--checkpoint",
                                 (out / "model.pt").string(), "--out", again.path().string()});
  INFO(eval.output);
  REQUIRE(eval.exit_code == 0);
  CHECK(progress_lines(eval.output).empty());
  CHECK(read_file(again / "evaluation.json") == read_file(out / "evaluation.json"));
  CHECK(read_file(again / "detections.json") == read_file(out / "detections.json"));
}

TEST_CASE("trainer: 2 ranks with batch b end with the weights of 1 rank with batch 2b, sharded or not") {
  // Images of one size in size order (--no-shuffle): the 2-rank step t holds exactly the images
  // of the 1-rank step t. Group norm and losses normalized over the global batch make the
  // gradients the same up to rounding.
  TempDir dir;
  auto args = [&](const std::string& batch, const std::string& name) {
    return std::vector<std::string>{"--shapes-train", "32", "--shapes-size", "96,96", "--iterations", "4",
                                    "--warmup-iterations", "2", "--batch-size", batch, "--lr", "0.02",
                                    "--no-shuffle", "--no-eval", "--threads", "1", "--seed", "9",
                                    "--log-every", "2", "--out", (dir / name).string()};
  };
  const auto one = run_trainer(args("4", "one"), 1);
  INFO(one.output);
  REQUIRE(one.exit_code == 0);
  const auto two = run_trainer(args("2", "two"), 2);
  INFO(two.output);
  REQUIRE(two.exit_code == 0);
  // The logged losses agree too.
  const auto a = progress_lines(one.output), b = progress_lines(two.output);
  REQUIRE(a.size() == 2);
  REQUIRE(b.size() == 2);
  for (std::size_t i = 0; i < 2; ++i) CHECK(a[i].losses[0] == doctest::Approx(b[i].losses[0]).epsilon(1e-3));

  CheckpointInfo info;
  const auto reference = load_checkpoint(dir / "one" / "model.pt", info)->named_parameters();
  const auto distributed = load_checkpoint(dir / "two" / "model.pt", info)->named_parameters();
  torch::manual_seed(9);  // the trainer's --seed: its initial weights
  const auto initial = MaskRcnn(preset_config("tiny", 3))->named_parameters();
  const auto drift = dtrain::test::parameter_drift(reference, distributed, initial);
  CHECK(drift.worst < 1e-4);
  CHECK(drift.moved > 1e-3);  // training did change the weights: the comparison is not vacuous

  // --shard optimizer: each rank steps half the momentum; the weights stay the unsharded run's.
  auto sharded_args = args("2", "sharded");
  sharded_args.insert(sharded_args.end(), {"--shard", "optimizer"});
  const auto sharded = run_trainer(sharded_args, 2);
  INFO(sharded.output);
  REQUIRE(sharded.exit_code == 0);
  const auto resharded = dtrain::test::parameter_drift(
      distributed, load_checkpoint(dir / "sharded" / "model.pt", info)->named_parameters(),
      initial);
  CHECK(resharded.worst < 1e-4);
}

TEST_CASE("trainer --norm syncbn: 2 ranks with batch b end with the weights of 1 rank with batch "
          "2b and batch norm") {
  // As above, with batch norm: synchronized over the ranks, it normalizes with the statistics
  // of the whole batch, in the backbone and in the mask head, whose regions differ in number on
  // each rank (and may be none). Plain batch norm on 2 ranks would not match.
  TempDir dir;
  auto args = [&](const std::string& batch, const std::string& norm, const std::string& name) {
    return std::vector<std::string>{
        "--shapes-train", "32", "--shapes-size", "96,96", "--iterations", "4",
        "--warmup-iterations", "2", "--batch-size", batch, "--lr", "0.02", "--no-shuffle",
        "--no-eval", "--threads", "1", "--seed", "9", "--log-every", "2", "--norm", norm,
        "--out", (dir / name).string()};
  };
  const auto one = run_trainer(args("4", "batch", "one"), 1);
  INFO(one.output);
  REQUIRE(one.exit_code == 0);
  const auto two = run_trainer(args("2", "syncbn", "two"), 2);
  INFO(two.output);
  REQUIRE(two.exit_code == 0);
  CHECK(contains(two.output, "parameters, syncbn norm)"));

  CheckpointInfo info;
  const auto reference = load_checkpoint(dir / "one" / "model.pt", info);
  CHECK(info.norm == Norm::batch);
  const auto distributed = load_checkpoint(dir / "two" / "model.pt", info);
  CHECK(info.norm == Norm::sync_batch);
  torch::manual_seed(9);
  const auto initial = MaskRcnn(preset_config("tiny", 3, Norm::batch));
  const auto weights = dtrain::test::parameter_drift(
      reference->named_parameters(), distributed->named_parameters(), initial->named_parameters());
  CHECK(weights.worst < 1e-4);
  CHECK(weights.moved > 1e-3);
  // The running statistics too (num_batches_tracked aside: the 1-rank run skips the mask head in
  // a step without positive regions, the synchronized one runs it on empty batches).
  auto statistics = [](const MaskRcnn& m) {
    torch::OrderedDict<std::string, torch::Tensor> out;
    for (const auto& item : m->named_buffers())
      if (item.key().find("num_batches_tracked") == std::string::npos)
        out.insert(item.key(), item.value());
    return out;
  };
  const auto buffers = dtrain::test::parameter_drift(statistics(reference), statistics(distributed),
                                                     statistics(initial));
  CHECK(buffers.worst < 1e-4);
  CHECK(buffers.moved > 1e-3);

  const auto bad = run_trainer({"--norm", "layer"});
  CHECK(bad.exit_code == 2);
  CHECK(contains(bad.output, "--norm: layer not in {group,batch,syncbn}"));
}

namespace {

// A COCO-format folder made from generated shapes: PNG images and an instances file whose objects
// are polygons (the squares' corners) or compressed RLE.
void write_coco_folder(const fs::path& dir, std::int64_t count) {
  fs::create_directories(dir / "images");
  const ShapesDataset shapes({.count = count, .seed = 4, .min_side = 64, .max_side = 96});
  auto gt = shapes.ground_truth([&] {
    std::vector<std::int64_t> all;
    for (std::int64_t i = 0; i < count; ++i) all.push_back(i);
    return all;
  }());
  for (std::int64_t i = 0; i < count; ++i) {
    const auto image = generate_shapes_image(shapes.options(), i);
    REQUIRE(stbi_write_png((dir / "images" / gt.images[static_cast<std::size_t>(i)].file_name).string().c_str(),
                           static_cast<int>(image.width), static_cast<int>(image.height), 3, image.rgb.data(),
                           static_cast<int>(image.width * 3)));
  }
  for (auto& a : gt.annotations) {
    if (a.category_id != 2) continue;  // squares as polygons: their box's corners
    const auto& b = a.bbox;
    a.segmentation = {{{b[0], b[1], b[0] + b[2], b[1], b[0] + b[2], b[1] + b[3], b[0], b[1] + b[3]}}, {}, false};
  }
  write_coco_annotations(gt, dir / "instances.json");
}

}  // namespace

TEST_CASE("trainer: trains and evaluates on a COCO-format folder; a missing image is named, every rank stops") {
  TempDir dir;
  write_coco_folder(dir.path(), 12);
  const std::vector<std::string> coco = {"--dataset", "coco", "--train-annotations", (dir / "instances.json").string(),
                                         "--train-images", (dir / "images").string(), "--val-annotations",
                                         (dir / "instances.json").string(), "--val-images", (dir / "images").string(),
                                         "--min-size", "64", "--max-size", "128"};
  auto args = coco;
  for (const char* a : {"--iterations", "6", "--batch-size", "2", "--log-every", "3", "--threads", "1"}) args.push_back(a);
  args.push_back("--out");
  args.push_back((dir / "out").string());
  const auto result = run_trainer(args);
  INFO(result.output);
  REQUIRE(result.exit_code == 0);
  CHECK(contains(result.output, "on coco (shorter side 64, longer at most 128): 12 train / 12 eval images, 3 classes"));
  CHECK(progress_lines(result.output).size() == 2);
  CHECK(contains(result.output, "evaluation on 12 images"));
  CHECK(fs::file_size(dir / "out" / "detections.json") > 0);

  fs::remove(dir / "images" / "shapes_5.png");
  const auto missing = run_trainer(args);
  CHECK(missing.exit_code == 1);
  CHECK(contains(missing.output, (dir / "images" / "shapes_5.png").string() + ": image file not found (image id 6"));
  // At 2 ranks the rank that reads it stops the other, which would otherwise wait for it in the
  // next allreduce until the test's timeout. (Only the exit status is checked: MPICH's launcher
  // may drop output that has not reached it yet when MPI_Abort ends the job.)
  const auto two_ranks = run_trainer(args, 2);
  CHECK(two_ranks.exit_code != 0);
}
