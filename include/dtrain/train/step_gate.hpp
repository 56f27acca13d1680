#pragma once
// The step()/skip_synchronize() bookkeeping both DistributedOptimizers share (the generic one in
// distributed_optimizer.hpp and libtorch's in <dtrain/torch/optimizer.hpp>): which backward pass
// completes an accumulation window (Note [Gradient accumulation]) and whether the next update
// reuses gradients an explicit synchronize() already reduced; and telling a profile that an
// update ended (Note [Implicit steps]). The optimizers differ only in how they synchronize and
// step, which they pass in.
#include <cstdint>

#include "dtrain/profile/optimizer_steps.hpp"

namespace dtrain::detail {

class StepGate {
 public:
  explicit StepGate(int backward_passes_per_step) : passes_per_step_(backward_passes_per_step) {}

  // Counts one backward pass. Every passes_per_step-th one calls synchronize() (unless a
  // SkipScope is open) and then apply(), marks the end of a step for the profile, and returns
  // true; the others return false.
  template <class Synchronize, class Apply>
  bool step(Synchronize&& synchronize, Apply&& apply) {
    if (++passes_ % passes_per_step_ != 0) return false;
    if (!skip_next_) synchronize();
    skip_next_ = false;
    apply();
    optimizer_stepped();
    return true;
  }

  // While it lives, the next step() uses the gradients as they are instead of reducing them again.
  class SkipScope {
   public:
    explicit SkipScope(StepGate& gate) : gate_(&gate) { gate_->skip_next_ = true; }
    SkipScope(const SkipScope&) = delete;
    SkipScope& operator=(const SkipScope&) = delete;
    ~SkipScope() { gate_->skip_next_ = false; }

   private:
    StepGate* gate_;
  };

  [[nodiscard]] SkipScope skip_synchronize() { return SkipScope(*this); }

 private:
  int passes_per_step_;
  std::int64_t passes_ = 0;
  bool skip_next_ = false;
};

}  // namespace dtrain::detail
