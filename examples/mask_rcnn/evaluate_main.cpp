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

int main(int argc, char** argv) {
  const std::string usage =
      "usage: mask_rcnn_evaluate GROUND_TRUTH.json RESULTS.json [--json STATS.json]\n";
  std::string files[2], stats_file;
  int positional = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--json" && i + 1 < argc) {
      stats_file = argv[++i];
    } else if (arg == "-h" || arg == "--help") {
      std::fputs(usage.c_str(), stdout);
      return 0;
    } else if (arg.rfind("--", 0) != 0 && positional < 2) {
      files[positional++] = arg;
    } else {
      std::fprintf(stderr, "mask_rcnn_evaluate: unexpected argument '%s'\n%s", arg.c_str(),
                   usage.c_str());
      return 2;
    }
  }
  if (positional != 2) {
    std::fputs(usage.c_str(), stderr);
    return 2;
  }
  try {
    const auto stats = mask_rcnn::evaluate_files(files[0], files[1]);
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
