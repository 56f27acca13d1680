#pragma once
// The CPU time one thread has used, readable from any thread (Note [Engine CPU time]). Internal:
// the engine reads its own thread's.
//
// Note [Engine CPU time]
// Whether waiting for the peers is free shows in the engine thread's own CPU time: a thread that
// polls MPI while a collective crosses a slow link uses a whole core, one that sleeps between
// tests almost none (Note [Waiting for data collectives] in comm/request_wait.hpp). The kernel
// keeps a CPU-time clock per thread, read here from any thread in nanoseconds; the profiler
// records its increase per step and per sample (EngineStats::engine_cpu_ns), and dtrain-report
// compares it with the time the engine spent in collectives. The clock is gone once the thread
// has been joined, so the thread takes a last reading as it ends, and that reading then stands.
#if defined(__linux__)
#include <pthread.h>
#include <time.h>
#endif

#include <cstdint>
#include <mutex>
#include <thread>

namespace dtrain::detail {

class ThreadCpuClock {
 public:
  // Nanoseconds of CPU `thread` has used; its last reading once it has ended. 0 where the
  // platform has no per-thread clock.
  std::uint64_t read(std::thread& thread) const noexcept {
    std::lock_guard lock(mutex_);
#if defined(__linux__)
    if (!ended_) {
      clockid_t clock;
      timespec t{};
      if (pthread_getcpuclockid(thread.native_handle(), &clock) == 0 &&
          clock_gettime(clock, &t) == 0)
        last_ = static_cast<std::uint64_t>(t.tv_sec) * 1000000000u +
                static_cast<std::uint64_t>(t.tv_nsec);
    }
#endif
    return last_;
  }

  // Called by the thread itself as it ends, before it can be joined: its last reading.
  void thread_ends() noexcept {
    std::lock_guard lock(mutex_);
#if defined(__linux__)
    timespec t{};
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t) == 0)
      last_ = static_cast<std::uint64_t>(t.tv_sec) * 1000000000u +
              static_cast<std::uint64_t>(t.tv_nsec);
#endif
    ended_ = true;
  }

 private:
  mutable std::mutex mutex_;
  mutable std::uint64_t last_ = 0;
  bool ended_ = false;
};

}  // namespace dtrain::detail
