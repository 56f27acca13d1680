#pragma once
// Per-step phase accounting: which phase the training thread is in, and how long each phase took
// in the current step. Pure bookkeeping on time points handed in by the caller, so it is tested
// with exact synthetic times.
//
// Note [Exclusive phase time]
// Phases may nest (a user-named "augment" inside "data", "allreduce.layer4" inside "backward").
// Each phase is charged its exclusive time: its own duration minus that of the phases nested in
// it. The phases of a step therefore never overlap, and together with `other` (time inside the
// step that no phase covered) they add up to the step's duration exactly, which is what a stacked
// step-time chart needs. A phase still open when its step ends is charged up to the end of the
// step and continues into the next one.
#include <chrono>
#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dtrain/profile/phase.hpp"

namespace dtrain::detail {

class PhaseTimes {
 public:
  using Clock = std::chrono::steady_clock;
  using Duration = std::chrono::nanoseconds;

  // One finished step: its duration and each phase's exclusive time. `phases` has one entry per
  // slot (standard phases first, then user phases in order of first use); `other` is the rest.
  struct Step {
    Duration total{};
    Duration other{};
    std::vector<std::pair<std::string, Duration>> phases;  // only phases that ran in the step
  };

  PhaseTimes() {
    for (Phase p : standard_phases) names_.emplace_back(to_string(p));
    totals_.assign(names_.size(), Duration::zero());
    ran_.assign(names_.size(), false);
    open_.reserve(16);
  }

  // The slot that accumulates a phase. User names are looked up linearly: a step has a handful.
  static constexpr std::size_t slot_of(Phase phase) noexcept {
    return static_cast<std::size_t>(phase);
  }
  std::size_t slot_of(std::string_view name) {
    for (std::size_t i = 0; i < names_.size(); ++i)
      if (names_[i] == name) return i;
    names_.emplace_back(name);
    totals_.push_back(Duration::zero());
    ran_.push_back(false);
    return names_.size() - 1;
  }

  bool in_step() const noexcept { return in_step_; }
  std::size_t depth() const noexcept { return open_.size(); }

  void begin_step(Clock::time_point now) {
    in_step_ = true;
    step_start_ = now;
  }

  void enter(std::size_t slot, Clock::time_point now) {
    ran_[slot] = true;
    open_.push_back(Frame{slot, now, Duration::zero()});
  }

  void exit(Clock::time_point now) {
    if (open_.empty()) return;
    const Frame frame = open_.back();
    open_.pop_back();
    const Duration whole = now - frame.start;
    totals_[frame.slot] += whole - frame.nested;
    if (!open_.empty()) open_.back().nested += whole;
  }

  // Ends the step: returns its accounting and clears the totals for the next step.
  Step end_step(Clock::time_point now) {
    // Charge still-open phases up to now, innermost first, then restart them at now.
    Duration inner_open = Duration::zero();
    for (std::size_t i = open_.size(); i-- > 0;) {
      Frame& f = open_[i];
      const Duration whole = now - f.start;
      totals_[f.slot] += whole - f.nested - inner_open;
      inner_open = whole;
      f.start = now;
      f.nested = Duration::zero();
    }
    Step step;
    step.total = now - step_start_;
    Duration covered = Duration::zero();
    for (std::size_t i = 0; i < totals_.size(); ++i) {
      if (!ran_[i]) continue;
      step.phases.emplace_back(names_[i], totals_[i]);
      covered += totals_[i];
      totals_[i] = Duration::zero();
      ran_[i] = false;
    }
    for (const Frame& f : open_) ran_[f.slot] = true;  // they continue into the next step
    step.other = step.total > covered ? step.total - covered : Duration::zero();
    in_step_ = false;
    return step;
  }

 private:
  struct Frame {
    std::size_t slot;
    Clock::time_point start;
    Duration nested;  // time spent in phases nested inside this one
  };

  std::vector<std::string> names_;
  std::vector<Duration> totals_;
  std::vector<bool> ran_;  // slots whose phase ran in the current step, even for no time
  std::vector<Frame> open_;
  Clock::time_point step_start_{};
  bool in_step_ = false;
};

}  // namespace dtrain::detail
