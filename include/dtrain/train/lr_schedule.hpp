#pragma once
// Learning-rate schedules for large-batch data-parallel training (Goyal et al. 2017, "Accurate,
// Large Minibatch SGD: Training ImageNet in 1 Hour").
//
// Note [Linear scaling with gradual warmup]
// With k workers the global batch is k times the single-worker batch, so the learning rate is
// scaled to peak = base_lr * k (linear scaling rule). Starting at the peak diverges early in
// training, so for the first warmup_epochs the rate ramps linearly, per step, from base_lr to
// peak: lr(e) = base_lr + (peak - base_lr) * e / warmup_epochs, with e = step / steps_per_epoch
// (fractional). After warmup the decay applies to peak:
//  - step:       peak * gamma^floor(e / step_epochs)
//  - multi_step: peak * gamma^(number of milestones <= e)
//  - cosine:     min_lr + (peak - min_lr) * (1 + cos(pi * (e - w) / (total_epochs - w))) / 2
//                for w <= e < total_epochs, min_lr afterwards (w = warmup_epochs).
// Step and multi-step epochs are counted from epoch 0, as in the paper (the drop "at epoch 30"
// happens at epoch 30 whatever the warmup); a step period or milestone inside the warmup is
// rejected because it would make the ramp jump. Cosine instead spans the end of warmup to
// total_epochs, so it starts exactly at peak and the curve is continuous at the end of warmup.
#include <cmath>
#include <cstdint>
#include <numbers>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "dtrain/core/error.hpp"

namespace dtrain {

enum class Decay { none, step, multi_step, cosine };

constexpr std::string_view to_string(Decay decay) noexcept {
  switch (decay) {
    case Decay::none: return "none";
    case Decay::step: return "step";
    case Decay::multi_step: return "multi_step";
    case Decay::cosine: return "cosine";
  }
  return "unknown";
}

struct LrScheduleOptions {
  double base_lr = 0.1;             // single-worker learning rate
  int world_size = 1;               // peak = base_lr * world_size when scale_by_world_size
  bool scale_by_world_size = true;
  double warmup_epochs = 0;         // linear ramp from base_lr to peak, per step
  std::int64_t steps_per_epoch = 1;
  Decay decay = Decay::none;
  double gamma = 0.1;               // step / multi_step factor
  double step_epochs = 30;          // step decay period
  std::vector<double> milestones;   // multi_step epochs, ascending
  double total_epochs = 90;         // cosine horizon
  double min_lr = 0;                // cosine floor
};

class LrSchedule {
 public:
  explicit LrSchedule(LrScheduleOptions options) : options_(std::move(options)) {
    validate();
    peak_ = options_.scale_by_world_size ? options_.base_lr * options_.world_size
                                         : options_.base_lr;
    if (options_.decay == Decay::cosine && options_.min_lr > peak_) {
      throw InvalidArgumentError(fmt::format(
          "dtrain: LrScheduleOptions: min_lr ({}) must not exceed the peak learning rate ({}) for "
          "cosine decay",
          options_.min_lr, peak_));
    }
  }

  double lr_at_step(std::int64_t step) const {
    if (step < 0) {
      throw InvalidArgumentError(
          fmt::format("dtrain: LrSchedule::lr_at_step: step must be >= 0, got {}", step));
    }
    return lr_at_epoch(static_cast<double>(step) /
                       static_cast<double>(options_.steps_per_epoch));
  }

  double lr_at_epoch(double epoch) const {
    if (!(epoch >= 0) || !std::isfinite(epoch)) {
      throw InvalidArgumentError(fmt::format(
          "dtrain: LrSchedule::lr_at_epoch: epoch must be finite and >= 0, got {}", epoch));
    }
    const LrScheduleOptions& o = options_;
    if (epoch < o.warmup_epochs) {
      return o.base_lr + (peak_ - o.base_lr) * epoch / o.warmup_epochs;
    }
    switch (o.decay) {
      case Decay::none: return peak_;
      case Decay::step: return peak_ * std::pow(o.gamma, std::floor(epoch / o.step_epochs));
      case Decay::multi_step: {
        int passed = 0;
        for (const double milestone : o.milestones) {
          if (epoch >= milestone) ++passed;
        }
        return peak_ * std::pow(o.gamma, passed);
      }
      case Decay::cosine: {
        if (epoch >= o.total_epochs) return o.min_lr;
        const double progress = (epoch - o.warmup_epochs) / (o.total_epochs - o.warmup_epochs);
        return o.min_lr +
               (peak_ - o.min_lr) * 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
      }
    }
    return peak_;
  }

  // The rate after warmup and before any decay: base_lr, times world_size when scaling.
  double peak_lr() const noexcept { return peak_; }

  const LrScheduleOptions& options() const noexcept { return options_; }

 private:
  static void require_finite(std::string_view name, double value) {
    if (!std::isfinite(value)) {
      throw InvalidArgumentError(
          fmt::format("dtrain: LrScheduleOptions: {} must be finite, got {}", name, value));
    }
  }

  void validate() const {
    const LrScheduleOptions& o = options_;
    require_finite("base_lr", o.base_lr);
    if (o.base_lr <= 0) {
      throw InvalidArgumentError(
          fmt::format("dtrain: LrScheduleOptions: base_lr must be > 0, got {}", o.base_lr));
    }
    if (o.world_size < 1) {
      throw InvalidArgumentError(fmt::format(
          "dtrain: LrScheduleOptions: world_size must be >= 1, got {} (pass dtrain::size())",
          o.world_size));
    }
    require_finite("warmup_epochs", o.warmup_epochs);
    if (o.warmup_epochs < 0) {
      throw InvalidArgumentError(fmt::format(
          "dtrain: LrScheduleOptions: warmup_epochs must be >= 0, got {}", o.warmup_epochs));
    }
    if (o.steps_per_epoch < 1) {
      throw InvalidArgumentError(fmt::format(
          "dtrain: LrScheduleOptions: steps_per_epoch must be >= 1, got {} (use the sampler's "
          "num_batches())",
          o.steps_per_epoch));
    }
    switch (o.decay) {
      case Decay::none:
      case Decay::step:
      case Decay::multi_step:
      case Decay::cosine: break;
      default:
        throw InvalidArgumentError(fmt::format(
            "dtrain: LrScheduleOptions: decay has the invalid value {}; use none, step, multi_step or "
            "cosine",
            static_cast<int>(o.decay)));
    }
    require_finite("gamma", o.gamma);
    if (o.gamma <= 0) {
      throw InvalidArgumentError(
          fmt::format("dtrain: LrScheduleOptions: gamma must be > 0, got {}", o.gamma));
    }
    require_finite("step_epochs", o.step_epochs);
    if (o.step_epochs <= 0) {
      throw InvalidArgumentError(
          fmt::format("dtrain: LrScheduleOptions: step_epochs must be > 0, got {}", o.step_epochs));
    }
    for (std::size_t i = 0; i < o.milestones.size(); ++i) {
      const double m = o.milestones[i];
      if (!std::isfinite(m) || m <= 0) {
        throw InvalidArgumentError(fmt::format(
            "dtrain: LrScheduleOptions: milestones[{}] must be finite and > 0, got {}", i, m));
      }
      if (i > 0 && !(m > o.milestones[i - 1])) {
        throw InvalidArgumentError(fmt::format(
            "dtrain: LrScheduleOptions: milestones must be strictly ascending, but milestones[{}] = {} "
            "follows {}",
            i, m, o.milestones[i - 1]));
      }
    }
    require_finite("total_epochs", o.total_epochs);
    if (o.total_epochs <= 0) {
      throw InvalidArgumentError(
          fmt::format("dtrain: LrScheduleOptions: total_epochs must be > 0, got {}", o.total_epochs));
    }
    require_finite("min_lr", o.min_lr);
    if (o.min_lr < 0) {
      throw InvalidArgumentError(
          fmt::format("dtrain: LrScheduleOptions: min_lr must be >= 0, got {}", o.min_lr));
    }
    // Interplay with the warmup, checked only for the decay in use.
    if (o.decay == Decay::step && o.step_epochs < o.warmup_epochs) {
      throw InvalidArgumentError(fmt::format(
          "dtrain: LrScheduleOptions: step_epochs ({}) falls inside the warmup (warmup_epochs = {}); "
          "step decay counts from epoch 0, so make step_epochs >= warmup_epochs",
          o.step_epochs, o.warmup_epochs));
    }
    if (o.decay == Decay::multi_step) {
      if (o.milestones.empty()) {
        throw InvalidArgumentError(
            "dtrain: LrScheduleOptions: decay is multi_step but milestones is empty; give the epochs "
            "at which to multiply by gamma, or use Decay::none");
      }
      if (o.milestones.front() < o.warmup_epochs) {
        throw InvalidArgumentError(fmt::format(
            "dtrain: LrScheduleOptions: milestones[0] = {} falls inside the warmup (warmup_epochs = "
            "{}); milestones count from epoch 0, so make them >= warmup_epochs",
            o.milestones.front(), o.warmup_epochs));
      }
    }
    if (o.decay == Decay::cosine && o.total_epochs <= o.warmup_epochs) {
      throw InvalidArgumentError(fmt::format(
          "dtrain: LrScheduleOptions: total_epochs ({}) must exceed warmup_epochs ({}) for cosine decay, "
          "which runs from the end of warmup to total_epochs",
          o.total_epochs, o.warmup_epochs));
    }
  }

  LrScheduleOptions options_;
  double peak_ = 0;
};

}  // namespace dtrain
