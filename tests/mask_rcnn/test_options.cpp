// The trainer's command line: defaults, --smoke's defaults under the flags given, the enum flags,
// and the checks that involve more than one flag.

#include "torch_test.hpp"  // first: see its note

#include <string>
#include <vector>

#include "options.hpp"

using namespace mask_rcnn;

namespace {

std::string refused(const std::vector<std::string>& args) {
  try {
    parse_options(args);
  } catch (const CLI::ParseError& e) {
    return e.what();
  }
  return "<nothing thrown>";
}

}  // namespace

TEST_CASE("options: the defaults, and --smoke's under the flags given") {
  const TrainOptions plain = parse_options({});
  CHECK(plain.iterations == 1200);
  CHECK(plain.shapes_train == 20000);
  CHECK(plain.eval_images == 0);
  CHECK(plain.norm == Norm::group);
  CHECK(plain.device == torch::kCPU);
  CHECK(plain.shuffle);
  CHECK(plain.evaluate);

  const TrainOptions smoke = parse_options({"--smoke"});
  CHECK(smoke.iterations == 40);
  CHECK(smoke.shapes_train == 200);
  CHECK(smoke.shapes_val == 16);
  CHECK(smoke.eval_images == 16);
  CHECK(smoke.warmup_iterations == 10);
  CHECK(smoke.log_every == 5);
  CHECK(smoke.png_images == 4);

  // A flag given wins over --smoke, in either order; the others keep --smoke's.
  for (const auto& args : {std::vector<std::string>{"--smoke", "--iterations", "7"},
                           std::vector<std::string>{"--iterations=7", "--smoke"}}) {
    const TrainOptions o = parse_options(args);
    CHECK(o.iterations == 7);
    CHECK(o.shapes_train == 200);
  }
}

TEST_CASE("options: enums by name, switches, and the sides of the shapes") {
  const TrainOptions o =
      parse_options({"--norm", "syncbn", "--device", "cuda", "--no-shuffle", "--no-eval",
                     "--shapes-size", "96,160", "--model", "small"});
  CHECK(o.norm == Norm::sync_batch);
  CHECK(o.device == torch::kCUDA);
  CHECK_FALSE(o.shuffle);
  CHECK_FALSE(o.evaluate);
  CHECK(o.shapes_size == std::pair<std::int64_t, std::int64_t>{96, 160});
  CHECK(o.model == "small");
  CHECK(parse_options({"--norm=batch"}).norm == Norm::batch);
  CHECK_THROWS_AS(parse_options({"--help"}), CLI::CallForHelp);
}

TEST_CASE("options: a refused command line names the flag and what it accepts") {
  CHECK(refused({"--norm", "layer"}) == "--norm: layer not in {group,batch,syncbn}");
  CHECK(refused({"--device", "tpu"}) == "--device: tpu not in {cpu,cuda}");
  CHECK(refused({"--model", "huge"}) == "--model: huge not in {tiny,small,resnet18,resnet34}");
  CHECK(refused({"--dataset", "voc"}) == "--dataset: voc not in {shapes,coco}");
  CHECK(refused({"--iterations", "0"}) == "--iterations: must be an integer >= 1, got '0'");
  CHECK(refused({"--shapes-size", "16,96"}) == "--shapes-size: must be an integer >= 32, got '16'");
  CHECK(refused({"--shapes-size", "96,64"}) == "--shapes-size: MAX must be >= MIN");
  CHECK(refused({"--dataset", "coco"}) == "--dataset coco needs --train-annotations");
  CHECK(refused({"--eval-only"}) == "--eval-only requires --checkpoint");
  CHECK(refused({"--checkpoint", "/nonexistent/model.pt"}) ==
        "--checkpoint: File does not exist: /nonexistent/model.pt");
}
