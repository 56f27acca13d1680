#include "coco_eval.hpp"

#include <algorithm>
#include <cstdio>
#include <map>
#include <numeric>
#include <optional>
#include <utility>

namespace mask_rcnn {
namespace {

constexpr int num_iou_thresholds = 10;
constexpr int num_recall_points = 101;
constexpr std::array<int, 3> max_detections = {1, 10, 100};
constexpr std::array<std::pair<double, double>, 4> area_ranges = {{
    {0.0, 1e5 * 1e5}, {0.0, 32.0 * 32.0}, {32.0 * 32.0, 96.0 * 96.0}, {96.0 * 96.0, 1e5 * 1e5}}};
enum Area { all_areas = 0, small, medium, large };

// The thresholds as numpy's linspace computes them (start + i * step, the last one exactly the
// stop value), so comparisons against IoUs and recalls fall on the same side as in pycocotools.
std::array<double, num_iou_thresholds> iou_thresholds() {
  std::array<double, num_iou_thresholds> t{};
  const double step = (0.95 - 0.5) / (num_iou_thresholds - 1);
  for (int i = 0; i < num_iou_thresholds; ++i) t[i] = static_cast<double>(i) * step + 0.5;
  t[num_iou_thresholds - 1] = 0.95;
  return t;
}

std::array<double, num_recall_points> recall_points() {
  std::array<double, num_recall_points> r{};
  const double step = 1.0 / (num_recall_points - 1);
  for (int i = 0; i < num_recall_points; ++i) r[i] = static_cast<double>(i) * step;
  r[num_recall_points - 1] = 1.0;
  return r;
}

// numpy's pairwise summation (what np.mean uses), so the averages agree to the last bit.
double pairwise_sum(const double* a, std::size_t n) {
  if (n < 8) {
    double sum = 0.0;
    for (std::size_t i = 0; i < n; ++i) sum += a[i];
    return sum;
  }
  if (n <= 128) {
    std::array<double, 8> r{};
    for (std::size_t j = 0; j < 8; ++j) r[j] = a[j];
    std::size_t i = 8;
    for (; i < n - n % 8; i += 8) {
      for (std::size_t j = 0; j < 8; ++j) r[j] += a[i + j];
    }
    double sum = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; ++i) sum += a[i];
    return sum;
  }
  std::size_t half = n / 2;
  half -= half % 8;
  return pairwise_sum(a, half) + pairwise_sum(a + half, n - half);
}

double mean_of_valid(const std::vector<double>& values) {
  std::vector<double> valid;
  for (const double v : values) {
    if (v > -1) valid.push_back(v);
  }
  if (valid.empty()) return -1.0;
  return pairwise_sum(valid.data(), valid.size()) / static_cast<double>(valid.size());
}

// One image, one category, one area range (pycocotools' evaluateImg with maxDet = 100).
struct CellResult {
  std::vector<double> scores;                     // detections, best first
  std::vector<std::vector<char>> matched;         // [threshold][detection]
  std::vector<std::vector<char>> ignored;         // [threshold][detection]
  std::vector<char> ground_truth_ignored;         // [ground truth]
};

struct Cell {
  std::vector<const EvalGroundTruth*> ground_truth;  // file order
  std::vector<const EvalDetection*> detections;      // file order
};

std::vector<std::vector<double>> cell_ious(const std::vector<const EvalGroundTruth*>& gts,
                                           const std::vector<const EvalDetection*>& dts,
                                           IouType type) {
  std::vector<std::vector<double>> ious(dts.size(), std::vector<double>(gts.size(), 0.0));
  for (std::size_t d = 0; d < dts.size(); ++d) {
    for (std::size_t g = 0; g < gts.size(); ++g) {
      ious[d][g] = type == IouType::bbox
                       ? box_iou_xywh(dts[d]->bbox, gts[g]->bbox, gts[g]->iscrowd)
                       : rle_iou(dts[d]->mask, gts[g]->mask, gts[g]->iscrowd);
    }
  }
  return ious;
}

CellResult evaluate_cell(const std::vector<const EvalGroundTruth*>& gts,
                         const std::vector<const EvalDetection*>& dts,  // best first, <= 100
                         const std::vector<std::vector<double>>& ious,  // [dts][gts file order]
                         std::pair<double, double> area_range,
                         const std::array<double, num_iou_thresholds>& thresholds) {
  const auto outside = [&](double area) {
    return area < area_range.first || area > area_range.second;
  };
  std::vector<char> gt_ignored_by_index(gts.size());
  for (std::size_t g = 0; g < gts.size(); ++g) {
    gt_ignored_by_index[g] = gts[g]->iscrowd || outside(gts[g]->area);
  }
  // Ground truths that count come first; matching stops at the ignored ones once a match counts.
  std::vector<std::size_t> order(gts.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return gt_ignored_by_index[a] < gt_ignored_by_index[b];
  });

  CellResult r;
  const std::size_t D = dts.size(), G = gts.size();
  r.ground_truth_ignored.resize(G);
  for (std::size_t g = 0; g < G; ++g) r.ground_truth_ignored[g] = gt_ignored_by_index[order[g]];
  for (const auto* d : dts) r.scores.push_back(d->score);
  r.matched.assign(num_iou_thresholds, std::vector<char>(D, 0));
  r.ignored.assign(num_iou_thresholds, std::vector<char>(D, 0));

  for (int t = 0; t < num_iou_thresholds; ++t) {
    std::vector<char> gt_matched(G, 0);
    for (std::size_t d = 0; d < D && G > 0; ++d) {
      double best = std::min(thresholds[t], 1 - 1e-10);
      std::optional<std::size_t> match;
      for (std::size_t g = 0; g < G; ++g) {
        const bool crowd = gts[order[g]]->iscrowd;
        if (gt_matched[g] && !crowd) continue;
        if (match && !r.ground_truth_ignored[*match] && r.ground_truth_ignored[g]) break;
        const double iou = ious[d][order[g]];
        if (iou < best) continue;
        best = iou;
        match = g;
      }
      if (!match) continue;
      r.ignored[t][d] = r.ground_truth_ignored[*match];
      r.matched[t][d] = 1;
      gt_matched[*match] = 1;
    }
    for (std::size_t d = 0; d < D; ++d) {
      if (!r.matched[t][d] && outside(dts[d]->area)) r.ignored[t][d] = 1;
    }
  }
  return r;
}

}  // namespace

CocoStats evaluate(const EvalInput& input, IouType type) {
  const auto thresholds = iou_thresholds();
  const auto recalls = recall_points();

  std::vector<std::int64_t> images = input.image_ids;
  std::sort(images.begin(), images.end());
  images.erase(std::unique(images.begin(), images.end()), images.end());
  std::vector<std::int64_t> categories = input.category_ids;
  std::sort(categories.begin(), categories.end());
  categories.erase(std::unique(categories.begin(), categories.end()), categories.end());
  std::map<std::int64_t, std::size_t> image_index, category_index;
  for (std::size_t i = 0; i < images.size(); ++i) image_index[images[i]] = i;
  for (std::size_t k = 0; k < categories.size(); ++k) category_index[categories[k]] = k;

  const std::size_t I = images.size(), K = categories.size();
  std::vector<Cell> cells(I * K);  // [category][image]
  auto cell_of = [&](std::int64_t image, std::int64_t category) -> Cell* {
    const auto i = image_index.find(image);
    const auto k = category_index.find(category);
    if (i == image_index.end() || k == category_index.end()) return nullptr;
    return &cells[k->second * I + i->second];
  };
  for (const auto& g : input.ground_truth) {
    if (auto* c = cell_of(g.image_id, g.category_id)) c->ground_truth.push_back(&g);
  }
  for (const auto& d : input.detections) {
    if (auto* c = cell_of(d.image_id, d.category_id)) c->detections.push_back(&d);
  }

  // results[category][area][image]; empty optional where the cell has neither kind of object.
  std::vector<std::vector<std::vector<std::optional<CellResult>>>> results(
      K, std::vector<std::vector<std::optional<CellResult>>>(area_ranges.size(),
                                                             std::vector<std::optional<CellResult>>(I)));
  for (std::size_t k = 0; k < K; ++k) {
    for (std::size_t i = 0; i < I; ++i) {
      const Cell& cell = cells[k * I + i];
      if (cell.ground_truth.empty() && cell.detections.empty()) continue;
      auto dts = cell.detections;
      std::stable_sort(dts.begin(), dts.end(), [](const EvalDetection* a, const EvalDetection* b) {
        return a->score > b->score;
      });
      if (dts.size() > static_cast<std::size_t>(max_detections.back())) {
        dts.resize(static_cast<std::size_t>(max_detections.back()));
      }
      const auto ious = cell_ious(cell.ground_truth, dts, type);
      for (std::size_t a = 0; a < area_ranges.size(); ++a) {
        results[k][a][i] = evaluate_cell(cell.ground_truth, dts, ious, area_ranges[a], thresholds);
      }
    }
  }

  // precision[t][r][k][a][m] and recall[t][k][a][m], -1 where a category has no ground truth.
  const std::size_t T = num_iou_thresholds, R = num_recall_points, A = area_ranges.size(),
                    M = max_detections.size();
  std::vector<double> precision(T * R * K * A * M, -1.0), recall(T * K * A * M, -1.0);
  auto p_at = [&](std::size_t t, std::size_t r, std::size_t k, std::size_t a, std::size_t m) -> double& {
    return precision[(((t * R + r) * K + k) * A + a) * M + m];
  };
  auto r_at = [&](std::size_t t, std::size_t k, std::size_t a, std::size_t m) -> double& {
    return recall[((t * K + k) * A + a) * M + m];
  };

  for (std::size_t k = 0; k < K; ++k) {
    for (std::size_t a = 0; a < A; ++a) {
      for (std::size_t m = 0; m < M; ++m) {
        const auto limit = static_cast<std::size_t>(max_detections[m]);
        std::vector<double> scores;
        std::vector<std::pair<std::size_t, std::size_t>> source;  // (image, detection)
        std::size_t counted_ground_truth = 0;
        bool any = false;
        for (std::size_t i = 0; i < I; ++i) {
          const auto& e = results[k][a][i];
          if (!e) continue;
          any = true;
          for (std::size_t d = 0; d < std::min(limit, e->scores.size()); ++d) {
            scores.push_back(e->scores[d]);
            source.emplace_back(i, d);
          }
          counted_ground_truth += static_cast<std::size_t>(
              std::count(e->ground_truth_ignored.begin(), e->ground_truth_ignored.end(), 0));
        }
        if (!any || counted_ground_truth == 0) continue;
        std::vector<std::size_t> rank(scores.size());
        std::iota(rank.begin(), rank.end(), std::size_t{0});
        std::stable_sort(rank.begin(), rank.end(),
                         [&](std::size_t x, std::size_t y) { return -scores[x] < -scores[y]; });
        const double positives = static_cast<double>(counted_ground_truth);
        for (std::size_t t = 0; t < T; ++t) {
          const std::size_t n = rank.size();
          std::vector<double> rc(n), pr(n);
          double tp = 0, fp = 0;
          for (std::size_t j = 0; j < n; ++j) {
            const auto [i, d] = source[rank[j]];
            const auto& e = *results[k][a][i];
            if (!e.ignored[t][d]) {
              if (e.matched[t][d]) tp += 1; else fp += 1;
            }
            rc[j] = tp / positives;
            pr[j] = tp / (fp + tp + 2.220446049250313e-16);  // np.spacing(1)
          }
          r_at(t, k, a, m) = n > 0 ? rc[n - 1] : 0.0;
          for (std::size_t j = n; j-- > 1;) {
            if (pr[j] > pr[j - 1]) pr[j - 1] = pr[j];
          }
          for (std::size_t r = 0; r < R; ++r) {
            const auto at = std::lower_bound(rc.begin(), rc.end(), recalls[r]) - rc.begin();
            if (static_cast<std::size_t>(at) >= n) {
              for (std::size_t rest = r; rest < R; ++rest) p_at(t, rest, k, a, m) = 0.0;
              break;
            }
            p_at(t, r, k, a, m) = pr[static_cast<std::size_t>(at)];
          }
        }
      }
    }
  }

  auto average_precision = [&](std::optional<std::size_t> only_t, std::size_t a) {
    std::vector<double> values;
    for (std::size_t t = 0; t < T; ++t) {
      if (only_t && *only_t != t) continue;
      for (std::size_t r = 0; r < R; ++r)
        for (std::size_t k = 0; k < K; ++k) values.push_back(p_at(t, r, k, a, M - 1));
    }
    return mean_of_valid(values);
  };
  auto average_recall = [&](std::size_t a, std::size_t m) {
    std::vector<double> values;
    for (std::size_t t = 0; t < T; ++t)
      for (std::size_t k = 0; k < K; ++k) values.push_back(r_at(t, k, a, m));
    return mean_of_valid(values);
  };
  CocoStats stats;
  stats.values[ap] = average_precision(std::nullopt, all_areas);
  stats.values[ap50] = average_precision(0, all_areas);
  stats.values[ap75] = average_precision(5, all_areas);
  stats.values[ap_small] = average_precision(std::nullopt, small);
  stats.values[ap_medium] = average_precision(std::nullopt, medium);
  stats.values[ap_large] = average_precision(std::nullopt, large);
  stats.values[ar1] = average_recall(all_areas, 0);
  stats.values[ar10] = average_recall(all_areas, 1);
  stats.values[ar100] = average_recall(all_areas, 2);
  stats.values[ar_small] = average_recall(small, 2);
  stats.values[ar_medium] = average_recall(medium, 2);
  stats.values[ar_large] = average_recall(large, 2);
  return stats;
}

std::string format_table(const std::vector<std::pair<IouType, CocoStats>>& rows) {
  std::string out = "type |   AP   |  AP50  |  AP75  |  APs   |  APm   |  APl\n";
  char line[160];
  for (const auto& [type, s] : rows) {
    std::snprintf(line, sizeof line, "%-4s | %6.3f | %6.3f | %6.3f | %6.3f | %6.3f | %6.3f\n",
                  to_string(type), s[ap], s[ap50], s[ap75], s[ap_small], s[ap_medium],
                  s[ap_large]);
    out += line;
  }
  return out;
}

std::string format_summary(const CocoStats& stats) {
  struct Row {
    bool precision;
    const char* iou;
    const char* area;
    int max_dets;
  };
  constexpr std::array<Row, 12> rows = {{{true, "0.50:0.95", "all", 100},
                                         {true, "0.50", "all", 100},
                                         {true, "0.75", "all", 100},
                                         {true, "0.50:0.95", "small", 100},
                                         {true, "0.50:0.95", "medium", 100},
                                         {true, "0.50:0.95", "large", 100},
                                         {false, "0.50:0.95", "all", 1},
                                         {false, "0.50:0.95", "all", 10},
                                         {false, "0.50:0.95", "all", 100},
                                         {false, "0.50:0.95", "small", 100},
                                         {false, "0.50:0.95", "medium", 100},
                                         {false, "0.50:0.95", "large", 100}}};
  std::string out;
  char line[160];
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    std::snprintf(line, sizeof line, " %-18s %s @[ IoU=%-9s | area=%6s | maxDets=%3d ] = %0.3f\n",
                  r.precision ? "Average Precision" : "Average Recall",
                  r.precision ? "(AP)" : "(AR)", r.iou, r.area, r.max_dets, stats.values[i]);
    out += line;
  }
  return out;
}

}  // namespace mask_rcnn
