#pragma once
// The space the tuner searches: which knobs are tuned in this job, their ranges, and the mapping
// between Knobs and points of the unit cube [0,1]^d that the Gaussian process works in.
//
// Note [Search space]
// - Fusion threshold: log scale over [1 MiB, 1 GiB] by default. Horovod stops at 64 MiB; large
//   models on fast networks want more, and the log scale gives each doubling the same room.
//   "Fusion off" (threshold 0) is not searched: at 1 MiB, tensors of 1 MiB and more already go
//   alone, so "off" only stops packing the small ones, which is what makes many-small-tensor
//   models an order of magnitude slower (figures in docs/autotune.md); a sample spent there
//   costs real training time and teaches the model little. A user who wants it sets
//   DTRAIN_FUSION_THRESHOLD=0 (then fixed).
// - Cycle time: log scale over [0.1, 25] ms.
// - Pieces in flight (DTRAIN_MPI_PIECES_IN_FLIGHT): integers on a log scale over [1, 8]; each
//   doubling changes the overlap between one piece's arithmetic and the next piece's transfer
//   about as much, and beyond 8 the pieces only queue. Tuned only where the host path is MPI's:
//   over Gloo (Note [Choosing the host library]) the knob moves nothing, nor does hierarchical
//   allreduce.
// - Binary knobs (hierarchical allreduce, response cache, fusion pipeline) are 0/1 coordinates.
//   The optimizer treats them as categories: it enumerates their combinations when it maximizes
//   expected improvement, so it never proposes a point between two categories, and the kernel
//   gives each its own length scale, so the fit learns how much a category changes throughput
//   (Note [Categorical knobs] in bayesian_optimizer.hpp). Hierarchical allreduce is tuned only
//   on jobs spanning several hosts; on one host it changes nothing.
// - A knob in `fixed` (set by the user, or one the engine knows has no effect in this job) keeps
//   its base value and is not a dimension at all.
// Decoded values are rounded (thresholds to 4 KiB, cycle times to 1 us, pieces to integers) so
// that the log, the saved result and the engine all see the same numbers; encode(decode(u)) is
// then the point the Gaussian process is told about.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "dtrain/autotune/knobs.hpp"
#include "dtrain/core/error.hpp"

namespace dtrain::autotune {

struct SearchSpaceOptions {
  Knobs base;               // values of the knobs not tuned; also the first configuration measured
  KnobSet fixed;            // knobs the tuner must leave at their base value
  bool multi_host = false;  // hierarchical allreduce is tuned only when the job spans hosts
  std::int64_t min_fusion_threshold_bytes = std::int64_t{1} << 20;
  std::int64_t max_fusion_threshold_bytes = std::int64_t{1} << 30;
  double min_cycle_time_ms = 0.1;
  double max_cycle_time_ms = 25.0;
  int min_pieces_in_flight = 1;
  int max_pieces_in_flight = 8;
};

enum class DimensionKind { continuous, binary };

class SearchSpace {
 public:
  static constexpr std::int64_t threshold_granularity_bytes = 4096;
  static constexpr double cycle_time_steps_per_ms = 1000.0;  // 1 us granularity

  explicit SearchSpace(SearchSpaceOptions options) : o_(std::move(options)) {
    if (!(o_.min_fusion_threshold_bytes > 0 &&
          o_.min_fusion_threshold_bytes < o_.max_fusion_threshold_bytes)) {
      throw InvalidArgumentError(fmt::format(
          "dtrain: autotune: fusion threshold range [{}, {}] bytes is empty or not positive: "
          "expected 0 < min < max",
          o_.min_fusion_threshold_bytes, o_.max_fusion_threshold_bytes));
    }
    if (!(std::isfinite(o_.max_cycle_time_ms) && o_.min_cycle_time_ms > 0 &&
          o_.min_cycle_time_ms < o_.max_cycle_time_ms)) {
      throw InvalidArgumentError(fmt::format(
          "dtrain: autotune: cycle time range [{}, {}] ms is empty or not positive: expected "
          "0 < min < max",
          o_.min_cycle_time_ms, o_.max_cycle_time_ms));
    }
    if (!(o_.min_pieces_in_flight >= 1 && o_.min_pieces_in_flight < o_.max_pieces_in_flight)) {
      throw InvalidArgumentError(fmt::format(
          "dtrain: autotune: pieces in flight range [{}, {}] is empty or below 1: expected "
          "1 <= min < max",
          o_.min_pieces_in_flight, o_.max_pieces_in_flight));
    }
    for (Knob knob : all_knobs) {
      if (o_.fixed.contains(knob)) continue;
      if (knob == Knob::hierarchical_allreduce && !o_.multi_host) continue;
      tuned_.push_back(knob);
    }
  }

  std::size_t dimension() const noexcept { return tuned_.size(); }
  const std::vector<Knob>& tuned() const noexcept { return tuned_; }
  bool tunes(Knob knob) const noexcept {
    return std::find(tuned_.begin(), tuned_.end(), knob) != tuned_.end();
  }
  const Knobs& base() const noexcept { return o_.base; }
  const SearchSpaceOptions& options() const noexcept { return o_; }

  std::vector<DimensionKind> kinds() const {
    std::vector<DimensionKind> k;
    for (Knob knob : tuned_) {
      k.push_back(is_binary(knob) ? DimensionKind::binary : DimensionKind::continuous);
    }
    return k;
  }

  // Values outside a range map to its nearest end.
  std::vector<double> encode(const Knobs& k) const {
    std::vector<double> u;
    for (Knob knob : tuned_) {
      switch (knob) {
        case Knob::fusion_threshold:
          u.push_back(to_unit(static_cast<double>(k.fusion_threshold_bytes),
                              static_cast<double>(o_.min_fusion_threshold_bytes),
                              static_cast<double>(o_.max_fusion_threshold_bytes)));
          break;
        case Knob::cycle_time:
          u.push_back(to_unit(k.cycle_time_ms, o_.min_cycle_time_ms, o_.max_cycle_time_ms));
          break;
        case Knob::hierarchical_allreduce: u.push_back(k.hierarchical_allreduce ? 1.0 : 0.0); break;
        case Knob::response_cache: u.push_back(k.response_cache ? 1.0 : 0.0); break;
        case Knob::fusion_pipeline: u.push_back(k.fusion_pipeline ? 1.0 : 0.0); break;
        case Knob::pieces_in_flight:
          u.push_back(to_unit(k.pieces_in_flight, o_.min_pieces_in_flight,
                              o_.max_pieces_in_flight));
          break;
      }
    }
    return u;
  }

  // Binary coordinates are on at 0.5 and above.
  Knobs decode(std::span<const double> u) const {
    Knobs k = o_.base;
    for (std::size_t i = 0; i < tuned_.size() && i < u.size(); ++i) {
      const double v = std::clamp(u[i], 0.0, 1.0);
      switch (tuned_[i]) {
        case Knob::fusion_threshold: {
          const double lo = static_cast<double>(o_.min_fusion_threshold_bytes);
          const double hi = static_cast<double>(o_.max_fusion_threshold_bytes);
          const double bytes = from_unit(v, lo, hi);
          const double g = static_cast<double>(threshold_granularity_bytes);
          k.fusion_threshold_bytes = std::clamp(static_cast<std::int64_t>(std::llround(bytes / g)) *
                                                    threshold_granularity_bytes,
                                                o_.min_fusion_threshold_bytes,
                                                o_.max_fusion_threshold_bytes);
          break;
        }
        case Knob::cycle_time: {
          // Divided rather than multiplied by the granularity, so 2.345 is the double
          // nearest 2.345 and prints as such.
          const double ms = from_unit(v, o_.min_cycle_time_ms, o_.max_cycle_time_ms);
          k.cycle_time_ms = std::clamp(std::round(ms * cycle_time_steps_per_ms) /
                                           cycle_time_steps_per_ms,
                                       o_.min_cycle_time_ms, o_.max_cycle_time_ms);
          break;
        }
        case Knob::hierarchical_allreduce: k.hierarchical_allreduce = v >= 0.5; break;
        case Knob::response_cache: k.response_cache = v >= 0.5; break;
        case Knob::fusion_pipeline: k.fusion_pipeline = v >= 0.5; break;
        case Knob::pieces_in_flight:
          k.pieces_in_flight = std::clamp(
              static_cast<int>(std::lround(
                  from_unit(v, o_.min_pieces_in_flight, o_.max_pieces_in_flight))),
              o_.min_pieces_in_flight, o_.max_pieces_in_flight);
          break;
      }
    }
    return k;
  }

  // Whether `k` is a configuration this space can produce: untuned knobs at their base values,
  // tuned numbers within their ranges. A saved result must pass this before it is applied.
  bool contains(const Knobs& k) const {
    for (Knob knob : all_knobs) {
      if (!tunes(knob)) {
        if (knob_value_text(k, knob) != knob_value_text(o_.base, knob)) return false;
        continue;
      }
      if (knob == Knob::fusion_threshold &&
          (k.fusion_threshold_bytes < o_.min_fusion_threshold_bytes ||
           k.fusion_threshold_bytes > o_.max_fusion_threshold_bytes)) {
        return false;
      }
      if (knob == Knob::cycle_time &&
          !(k.cycle_time_ms >= o_.min_cycle_time_ms && k.cycle_time_ms <= o_.max_cycle_time_ms)) {
        return false;
      }
      if (knob == Knob::pieces_in_flight && (k.pieces_in_flight < o_.min_pieces_in_flight ||
                                             k.pieces_in_flight > o_.max_pieces_in_flight)) {
        return false;
      }
    }
    return true;
  }

  // One line naming every knob with its range or fixed value. Part of a saved result's key:
  // a result tuned over another space (another fixed knob, another range) is not reused.
  std::string description() const {
    std::string out;
    for (Knob knob : all_knobs) {
      if (!out.empty()) out += ' ';
      out += to_string(knob);
      if (!tunes(knob)) {
        out += '=' + knob_value_text(o_.base, knob);
      } else if (knob == Knob::fusion_threshold) {
        out += fmt::format(":{}..{}", o_.min_fusion_threshold_bytes, o_.max_fusion_threshold_bytes);
      } else if (knob == Knob::cycle_time) {
        out += fmt::format(":{}..{}", o_.min_cycle_time_ms, o_.max_cycle_time_ms);
      } else if (knob == Knob::pieces_in_flight) {
        out += fmt::format(":{}..{}", o_.min_pieces_in_flight, o_.max_pieces_in_flight);
      } else {
        out += ":0|1";
      }
    }
    return out;
  }

 private:
  static double to_unit(double value, double lo, double hi) {
    if (!(value > lo)) return 0.0;
    return std::clamp(std::log(value / lo) / std::log(hi / lo), 0.0, 1.0);
  }
  static double from_unit(double u, double lo, double hi) {
    return lo * std::exp(u * std::log(hi / lo));
  }

  SearchSpaceOptions o_;
  std::vector<Knob> tuned_;
};

}  // namespace dtrain::autotune
