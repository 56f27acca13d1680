#pragma once
// The deadline of a collective once every rank has submitted it, the same on every path.
//
// Note [One op deadline]
// DTRAIN_OP_TIMEOUT_SECONDS bounds a collective after every rank has submitted it. The host path
// enforces it from the watchdog (runtime/execution/watchdog.hpp); the device paths (NCCL, and the
// staging copies of the pinned host path) enforce it themselves, in the loops that wait for the
// device, because only they can abort a NCCL communicator. One deadline means: one value, rank 0's,
// which init() hands to every rank (Note [Agreed settings] in runtime/engine/agreement.hpp), never
// the process's own Config; and one pause rule, the watchdog's (Note [Own pauses]): time in which
// this process itself was not running (SIGSTOP, a debugger, a suspended job) is no peer's fault
// and is not counted. The watchdog measures those pauses and adds them to an OwnPauses the
// backends read, so a deadline is pushed back by exactly the pauses that fell inside it.
#include <atomic>
#include <chrono>
#include <cstdint>

namespace dtrain::detail {

// The time this process was not running, summed since the engine started (Note [Own pauses] in
// runtime/execution/watchdog.hpp): written by the watchdog, read by any thread.
class OwnPauses {
 public:
  using Clock = std::chrono::steady_clock;
  void add(Clock::duration pause) noexcept {
    total_.fetch_add(pause.count(), std::memory_order_relaxed);
  }
  Clock::duration total() const noexcept {
    return Clock::duration(total_.load(std::memory_order_relaxed));
  }

 private:
  std::atomic<Clock::rep> total_{0};
};

// When an op must have finished: `seconds` after it started, not counting this process's own
// pauses since then (Note [One op deadline]). `seconds` <= 0 means never.
class OpDeadline {
 public:
  using Clock = std::chrono::steady_clock;

  OpDeadline() = default;
  static OpDeadline after(double seconds, const OwnPauses* pauses = nullptr,
                          Clock::time_point now = Clock::now()) {
    OpDeadline d;
    d.seconds_ = seconds;
    d.pauses_ = pauses;
    d.start_ = now;
    d.paused_at_start_ = pauses ? pauses->total() : Clock::duration::zero();
    if (seconds > 0)
      d.timeout_ = std::chrono::duration_cast<Clock::duration>(
          std::chrono::duration<double>(seconds));
    return d;
  }

  double seconds() const noexcept { return seconds_; }
  bool never() const noexcept { return seconds_ <= 0; }

  // The time counted against the op at `now`: elapsed, less the pauses since it started.
  Clock::duration counted(Clock::time_point now = Clock::now()) const noexcept {
    Clock::duration paused = pauses_ ? pauses_->total() - paused_at_start_ : Clock::duration::zero();
    return now - start_ - paused;
  }
  bool passed(Clock::time_point now = Clock::now()) const noexcept {
    return !never() && counted(now) >= timeout_;
  }

 private:
  double seconds_ = 0;
  const OwnPauses* pauses_ = nullptr;
  Clock::time_point start_{};
  Clock::duration paused_at_start_{};
  Clock::duration timeout_ = Clock::duration::max();
};

}  // namespace dtrain::detail
