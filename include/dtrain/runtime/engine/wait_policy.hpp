#pragma once
// How the engine thread waits for work. See Note [Waiting without burning cores].
//
// Note [Waiting without burning cores]
// User threads only enqueue and then block on their handle. The engine thread blocks on a
// condition variable while nothing is in flight (rank 0 wakes once a second to notice ranks that
// wait on it, for stall reports). While something is in flight it polls MPI for 50 microseconds
// (a peer that is in step answers within that window, so a lone small op never sleeps), then
// sleeps for a quarter of the time it has waited so far, between 10 microseconds and 1 ms, and
// polls again: a message that arrives during a sleep costs at most ~25% more latency, and a rank
// that waits on a straggler costs almost no CPU. There is no yield phase: on a loaded 2-core
// machine sched_yield either returns at once (a spin that steals the core a peer rank needs) or
// gives the core away for a whole scheduler tick (4 ms); both were measured to cost more than
// short sleeps (docs/performance.md). Timed sleeps overshoot by the thread's timer slack, 50 us by
// default, so the engine thread lowers its own to keep the short sleeps short.
#if defined(__linux__)
#include <sys/prctl.h>
#endif

#include <algorithm>
#include <chrono>

namespace dtrain::detail {

// The engine loop's waiting parameters; the engine reads them on every wait, so they may be
// changed between waits (by the engine thread).
struct WaitPolicy {
  using Clock = std::chrono::steady_clock;

  Clock::duration hot_poll = std::chrono::microseconds(50);  // poll without sleeping this long
  Clock::duration min_sleep = std::chrono::microseconds(10);
  Clock::duration max_sleep = std::chrono::milliseconds(1);
  Clock::duration idle_wake = std::chrono::seconds(1);  // nothing awaited (rank 0: stall checks)
  int backoff_divisor = 4;  // sleep 1/n of the time waited so far

  // How long to sleep after `idle_for` without progress; zero: poll again at once. `awaiting`:
  // something in flight that a peer may answer.
  Clock::duration sleep_for(bool awaiting, Clock::duration idle_for) const noexcept {
    if (!awaiting) return idle_wake;
    if (idle_for < hot_poll) return Clock::duration::zero();
    return std::clamp<Clock::duration>(idle_for / backoff_divisor, min_sleep, max_sleep);
  }
};

// Keeps the calling thread's short timed sleeps short (Note [Waiting without burning cores]).
inline void lower_timer_slack() noexcept {
#if defined(__linux__)
  prctl(PR_SET_TIMERSLACK, 2000UL, 0UL, 0UL, 0UL);  // 2 us
#endif
}

}  // namespace dtrain::detail
