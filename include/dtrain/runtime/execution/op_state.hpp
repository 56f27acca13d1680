#pragma once
// The completion state of one op. The engine completes an OpState exactly once (the first
// completion wins, so a deadline watchdog and a late MPI return cannot race); waiters block on a
// condition variable, so a waiting caller does not burn a core. Internal: handles reach it
// through the functions declared in runtime/handle.hpp.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <utility>

#include "dtrain/core/error.hpp"

namespace dtrain::detail {

class OpState {
 public:
  // Returns false if the op had already completed.
  bool complete(std::exception_ptr error = nullptr) noexcept {
    {
      std::lock_guard lock(mutex_);
      if (done_.load(std::memory_order_relaxed)) return false;
      error_ = error;
      done_.store(true, std::memory_order_release);
    }
    cv_.notify_all();
    if (then) then(error);
    return true;
  }
  bool done() const noexcept { return done_.load(std::memory_order_acquire); }

  void wait() {
    // Block at once. The op is finished by the engine thread and the peer ranks, which on a small
    // machine share these cores: a waiter that spins or yields takes the core they need, and on a
    // loaded machine costs a scheduler tick (4 ms) where a futex wake costs microseconds
    // (docs/performance.md, "Where a lone op's extra time goes").
    if (!done()) {
      std::unique_lock lock(mutex_);
      cv_.wait(lock, [&] { return done(); });
    }
    rethrow();
  }
  template <class Rep, class Period>
  bool wait_for(std::chrono::duration<Rep, Period> d) {
    std::unique_lock lock(mutex_);
    if (!cv_.wait_for(lock, d, [&] { return done(); })) return false;
    lock.unlock();
    rethrow();
    return true;
  }
  void rethrow() const {
    if (error_) std::rethrow_exception(error_);
  }

  // Runs once on completion, on the completing thread (set before the op is submitted).
  std::function<void(std::exception_ptr)> then;

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  std::atomic<bool> done_{false};
  std::exception_ptr error_;
};

}  // namespace dtrain::detail
