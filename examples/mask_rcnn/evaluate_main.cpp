// Scores a COCO results file against a COCO instances file, boxes and masks, and prints the
// summary table and pycocotools' twelve lines for each:
//
//   mask_rcnn_evaluate ground_truth.json detections.json [--json stats.json]
//
// The trainer writes both files for its evaluation set; this program, pycocotools and the
// trainer's own table give the same numbers on them.

#include <cstdio>
#include <exception>
#include <string>

#include "coco_eval.hpp"
#include "coco_format.hpp"
#include "common/cli.hpp"

int main(int argc, char** argv) {
  CLI::App app("", "mask_rcnn_evaluate");
  examples::describe_program(app, "Scores COCO detections (boxes and masks) against COCO ground "
                                  "truth, as pycocotools does.");
  std::string ground_truth, results, stats_file;
  app.add_option("ground_truth", ground_truth, "COCO instances file")
      ->required()
      ->check(CLI::ExistingFile);
  app.add_option("results", results, "COCO results file")->required()->check(CLI::ExistingFile);
  app.add_option("--json", stats_file, "also write the statistics to this file")
      ->type_name("FILE");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return examples::refused_command_line(app, e, true);
  }
  try {
    const auto stats = mask_rcnn::evaluate_files(ground_truth, results);
    std::fputs(mask_rcnn::format_table(stats).c_str(), stdout);
    for (const auto& [type, s] : stats) {
      std::printf("\n%s:\n%s", mask_rcnn::to_string(type), mask_rcnn::format_summary(s).c_str());
    }
    if (!stats_file.empty()) mask_rcnn::write_stats_json(stats, stats_file);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mask_rcnn_evaluate: %s\n", e.what());
    return 1;
  }
}
