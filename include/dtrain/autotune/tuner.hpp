#pragma once
// The autotuner's state machine. Pure logic: no MPI, no clock, no files. The engine on rank 0
// feeds it one report per training step (bytes reduced, wall time, the configuration generation
// the step ran under) and applies knobs() whenever generation() advances.
//
// Note [Tuning schedule]
// 1. Warmup: the first `autotune_warmup_samples` samples run the base configuration and are
//    discarded (first steps pay for allocation, caches, lazy initialization).
// 2. Measuring: each configuration runs for `samples_per_configuration` samples of
//    `autotune_steps_per_sample` steps; a sample's score is its bytes over its wall time, and the
//    configuration's score is the median of its samples, which one disturbed sample cannot move.
//    The first configuration is the base one, so the result is never worse than the default as
//    measured; the next few come from a low-discrepancy design, the rest from Bayesian
//    optimization on the logarithm of the score (Note [Log scores]).
// 3. After `autotune_bayes_opt_max_samples` configurations (DTRAIN_AUTOTUNE_BAYES_OPT_MAX_SAMPLES)
//    the tuner settles on the configuration with the best median and ignores further steps.
//
// Note [Configuration generations]
// Rank 0 decides; every rank must switch at the same cycle, or ranks would fuse and reduce
// differently (silent corruption or a hang). generation() starts at 0 (knobs() to apply before
// the first reported step) and increases by one whenever knobs() changes. The engine carries
// (generation, knobs) in its response message when the generation differs from the last one
// sent, and every rank applies it before executing that response. A step that began under an
// older generation mixes two configurations: reported with the generation in effect when it
// began, it is ignored. The next `settle_steps` steps are discarded too: the first use of a
// configuration pays one-time costs (a larger fusion buffer is allocated and first touched).
//
// Note [Log scores]
// The Gaussian process models log(bytes per second). Throughput differences are ratios (a knob
// makes the job 20% or 3x faster, whatever its speed), and on the log scale one configuration
// 10x slower than the rest does not flatten the differences among the good ones when outputs are
// standardized.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "dtrain/autotune/bayesian_optimizer.hpp"
#include "dtrain/autotune/knobs.hpp"
#include "dtrain/autotune/search_space.hpp"
#include "dtrain/core/config.hpp"
#include "dtrain/core/error.hpp"

namespace dtrain::autotune {

// The schedule the user sets (DTRAIN_AUTOTUNE_*: Note [Settings by component] in core/config.hpp)
// and the tuner's own constants.
struct TunerOptions : AutotuneSettings {
  int samples_per_configuration = 5;  // the median is taken over these (Horovod also uses 5)
  int settle_steps = 1;               // discarded after each change (Note [Configuration generations])
  std::uint64_t seed = 0;
};

inline TunerOptions tuner_options(const Config& c) { return TunerOptions{c}; }

struct StepReport {
  std::int64_t bytes = 0;         // bytes reduced during the step (payload, this rank)
  double seconds = 0.0;           // wall time of the step
  std::uint64_t generation = 0;   // the generation in effect when the step began
};

enum class RecordKind {
  warmup,  // a discarded sample before tuning
  sample,  // a sample of the configuration being measured
  median,  // a configuration's score: the median of its samples
  choice,  // the configuration kept when tuning ends
  reused,  // the configuration taken from a saved result instead of tuning
};

constexpr std::string_view to_string(RecordKind k) noexcept {
  switch (k) {
    case RecordKind::warmup: return "warmup";
    case RecordKind::sample: return "sample";
    case RecordKind::median: return "median";
    case RecordKind::choice: return "choice";
    case RecordKind::reused: return "reused";
  }
  return "unknown";
}

struct TuningRecord {
  RecordKind kind = RecordKind::sample;
  int configuration = -1;  // 0-based index of the configuration; -1 for warmup and reused rows
  std::uint64_t generation = 0;
  Knobs knobs;
  int steps = 0;            // warmup and sample rows: steps in the sample
  std::int64_t bytes = 0;   // warmup and sample rows
  double seconds = 0.0;     // warmup and sample rows
  double score_bytes_per_second = 0.0;
};

struct ScoredKnobs {
  Knobs knobs;
  double score_bytes_per_second = 0.0;
  int configuration = 0;
};

class Tuner {
 public:
  Tuner(SearchSpace space, TunerOptions options)
      : space_(std::move(space)), options_(validated(options)), optimizer_(space_.kinds(), [&] {
          BayesianOptimizerOptions b;
          b.gaussian_process_noise = options_.autotune_gaussian_process_noise;
          b.seed = options_.seed;
          return b;
        }()) {
    knobs_ = space_.decode(space_.encode(space_.base()));
    if (space_.dimension() == 0) {
      phase_ = Phase::done;  // nothing to tune: the base configuration stays
    } else if (options_.autotune_warmup_samples == 0) {
      phase_ = Phase::measuring;
    }
  }

  // Returns whether knobs() changed (and generation() advanced). Throws InvalidArgumentError for
  // a report no step can produce (negative bytes, a non-positive or non-finite duration).
  bool record_step(const StepReport& step) {
    if (step.bytes < 0 || !(step.seconds > 0.0) || !std::isfinite(step.seconds)) {
      throw InvalidArgumentError(fmt::format(
          "dtrain: autotune: step report with {} bytes in {} seconds: expected bytes >= 0 and a "
          "positive, finite duration",
          step.bytes, step.seconds));
    }
    if (phase_ == Phase::done || step.generation != generation_) return false;
    if (settle_remaining_ > 0) {
      --settle_remaining_;
      return false;
    }
    ++sample_steps_;
    sample_bytes_ += step.bytes;
    sample_seconds_ += step.seconds;
    if (sample_steps_ < options_.autotune_steps_per_sample) return false;

    TuningRecord row;
    row.generation = generation_;
    row.knobs = knobs_;
    row.steps = sample_steps_;
    row.bytes = sample_bytes_;
    row.seconds = sample_seconds_;
    row.score_bytes_per_second = static_cast<double>(sample_bytes_) / sample_seconds_;
    sample_steps_ = 0;
    sample_bytes_ = 0;
    sample_seconds_ = 0.0;

    if (phase_ == Phase::warmup) {
      row.kind = RecordKind::warmup;
      history_.push_back(row);
      if (++warmup_samples_seen_ >= options_.autotune_warmup_samples) phase_ = Phase::measuring;
      return false;
    }
    row.kind = RecordKind::sample;
    row.configuration = configurations_measured_;
    history_.push_back(row);
    samples_.push_back(row.score_bytes_per_second);
    if (static_cast<int>(samples_.size()) < options_.samples_per_configuration) return false;
    return finish_configuration();
  }

  // The configuration to apply now.
  const Knobs& knobs() const noexcept { return knobs_; }
  std::uint64_t generation() const noexcept { return generation_; }
  bool done() const noexcept { return phase_ == Phase::done; }
  int configurations_measured() const noexcept { return configurations_measured_; }
  // The best configuration measured so far (the choice, once done()).
  const std::optional<ScoredKnobs>& best() const noexcept { return best_; }
  // Every warmup, sample, median and choice row so far, in order.
  const std::vector<TuningRecord>& history() const noexcept { return history_; }
  const SearchSpace& space() const noexcept { return space_; }
  const TunerOptions& options() const noexcept { return options_; }
  const BayesianOptimizer& optimizer() const noexcept { return optimizer_; }

 private:
  enum class Phase { warmup, measuring, done };

  static TunerOptions validated(const TunerOptions& o) {
    auto check = [](bool ok, std::string_view what, int value, std::string_view expected) {
      if (!ok) {
        throw InvalidArgumentError(fmt::format("dtrain: autotune: {} = {}: expected {}", what,
                                               value, expected));
      }
    };
    check(o.autotune_warmup_samples >= 0, "autotune_warmup_samples", o.autotune_warmup_samples,
          "0 or more");
    check(o.autotune_steps_per_sample >= 1, "autotune_steps_per_sample",
          o.autotune_steps_per_sample, "1 or more");
    check(o.samples_per_configuration >= 1, "samples_per_configuration",
          o.samples_per_configuration, "1 or more");
    check(o.autotune_bayes_opt_max_samples >= 1, "autotune_bayes_opt_max_samples",
          o.autotune_bayes_opt_max_samples, "1 or more");
    check(o.settle_steps >= 0, "settle_steps", o.settle_steps, "0 or more");
    return o;
  }

  static double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const std::size_t n = v.size();
    return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  }

  bool finish_configuration() {
    const double score = median(samples_);
    samples_.clear();
    TuningRecord row;
    row.kind = RecordKind::median;
    row.configuration = configurations_measured_;
    row.generation = generation_;
    row.knobs = knobs_;
    row.score_bytes_per_second = score;
    history_.push_back(row);
    if (!best_ || score > best_->score_bytes_per_second) {
      best_ = ScoredKnobs{knobs_, score, configurations_measured_};
    }
    // A score of 0 (no bytes at all) is floored so its logarithm stays finite.
    optimizer_.observe(space_.encode(knobs_), std::log(std::max(score, 1.0)));
    ++configurations_measured_;

    if (configurations_measured_ >= options_.autotune_bayes_opt_max_samples) {
      phase_ = Phase::done;
      const bool changed = switch_to(best_->knobs);
      TuningRecord choice;
      choice.kind = RecordKind::choice;
      choice.configuration = best_->configuration;
      choice.generation = generation_;
      choice.knobs = best_->knobs;
      choice.score_bytes_per_second = best_->score_bytes_per_second;
      history_.push_back(choice);
      return changed;
    }
    return switch_to(space_.decode(optimizer_.propose()));
  }

  bool switch_to(const Knobs& next) {
    if (next == knobs_) return false;
    knobs_ = next;
    ++generation_;
    settle_remaining_ = options_.settle_steps;
    return true;
  }

  SearchSpace space_;
  TunerOptions options_;
  BayesianOptimizer optimizer_;
  Phase phase_ = Phase::warmup;
  Knobs knobs_;
  std::uint64_t generation_ = 0;
  int settle_remaining_ = 0;
  int warmup_samples_seen_ = 0;
  int sample_steps_ = 0;
  std::int64_t sample_bytes_ = 0;
  double sample_seconds_ = 0.0;
  std::vector<double> samples_;
  int configurations_measured_ = 0;
  std::optional<ScoredKnobs> best_;
  std::vector<TuningRecord> history_;
};

}  // namespace dtrain::autotune
