#pragma once
// MetricAverager: named scalar metrics averaged across ranks (weighted by sample counts).
// ThroughputMeter: global samples/s (summed over ranks) and per-epoch time.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "dtrain/runtime/collectives.hpp"
#include "dtrain/runtime/session.hpp"

namespace dtrain {

class MetricAverager {
 public:
  // Adds `value` observed over `count` samples (e.g. a batch's mean loss and the batch size).
  void add(const std::string& name, double value, double count = 1.0) {
    auto& m = metrics_[name];
    m.first += value * count;
    m.second += count;
  }

  // Collective: every rank must call it with the same metric names. Returns the global mean of
  // every metric and resets the local sums.
  std::map<std::string, double> average() {
    std::vector<std::string> names;
    for (const auto& [n, m] : metrics_) names.push_back(n);
    // The name list must agree; allgather it once so a mismatch is an error, not garbage.
    check_names(names);
    std::vector<double> sums;
    for (const auto& [n, m] : metrics_) {
      sums.push_back(m.first);
      sums.push_back(m.second);
    }
    allreduce(sums, AllreduceOptions{.op = ReduceOp::Sum, .name = "MetricAverager.average"});
    std::map<std::string, double> out;
    std::size_t i = 0;
    for (const auto& n : names) {
      out[n] = sums[i + 1] > 0 ? sums[i] / sums[i + 1] : 0.0;
      i += 2;
    }
    metrics_.clear();
    return out;
  }

 private:
  void check_names(const std::vector<std::string>& names) {
    std::string joined;
    for (const auto& n : names) joined += n + '\n';
    std::vector<std::int64_t> h{static_cast<std::int64_t>(std::hash<std::string>{}(joined) >> 1)};
    auto mn = h, mx = h;
    allreduce(mn, AllreduceOptions{.op = ReduceOp::Min, .name = "MetricAverager.names.min"});
    allreduce(mx, AllreduceOptions{.op = ReduceOp::Max, .name = "MetricAverager.names.max"});
    if (mn[0] != mx[0])
      throw MismatchError(fmt::format(
          "dtrain: MetricAverager::average(): ranks added different metric names (rank {} has "
          "[{}]); add the same metrics on every rank",
          rank(), fmt::join(names, ", ")));
  }
  std::map<std::string, std::pair<double, double>> metrics_;
};

class ThroughputMeter {
 public:
  using Clock = std::chrono::steady_clock;
  void start_epoch() {
    samples_ = 0;
    start_ = Clock::now();
  }
  void add_samples(std::int64_t n) { samples_ += n; }

  struct EpochStats {
    std::int64_t global_samples = 0;  // summed over ranks
    double seconds = 0;               // slowest rank's epoch time
    double samples_per_second = 0;    // global_samples / seconds
  };

  // Collective.
  EpochStats end_epoch() {
    const double elapsed = std::chrono::duration<double>(Clock::now() - start_).count();
    std::vector<double> v{static_cast<double>(samples_)};
    std::vector<double> t{elapsed};
    allreduce(v, AllreduceOptions{.op = ReduceOp::Sum, .name = "ThroughputMeter.samples"});
    allreduce(t, AllreduceOptions{.op = ReduceOp::Max, .name = "ThroughputMeter.seconds"});
    EpochStats s;
    s.global_samples = static_cast<std::int64_t>(v[0]);
    s.seconds = t[0];
    s.samples_per_second = t[0] > 0 ? v[0] / t[0] : 0.0;
    return s;
  }

 private:
  std::int64_t samples_ = 0;
  Clock::time_point start_ = Clock::now();
};

}  // namespace dtrain
