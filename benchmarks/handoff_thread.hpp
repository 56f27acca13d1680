#pragma once
// A thread that runs what a caller hands it, with the engine's own hand-off pieces and nothing
// else of the engine: the caller enqueues under a mutex and notifies a condition variable, the
// thread (blocked on it, as an idle engine is) wakes, runs the work and completes an OpState, and
// the caller, blocked in OpState::wait(), wakes. Two futex wake-ups: what running work on a
// thread of its own costs by itself.
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

#include <dtrain/runtime/execution/op_state.hpp>
#include <dtrain/runtime/handle.hpp>

namespace bench {

class HandoffThread {
 public:
  HandoffThread() : thread_([this] { loop(); }) {}
  HandoffThread(const HandoffThread&) = delete;
  HandoffThread& operator=(const HandoffThread&) = delete;
  ~HandoffThread() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  // Runs `work` on the thread and returns once it has finished.
  void run(std::function<void()> work) {
    auto state = std::make_shared<dtrain::detail::OpState>();
    {
      std::lock_guard lock(mutex_);
      queue_.push_back({std::move(work), state});
    }
    cv_.notify_all();
    state->wait();
  }

 private:
  struct Job {
    std::function<void()> work;
    std::shared_ptr<dtrain::detail::OpState> state;
  };

  void loop() {
    std::unique_lock lock(mutex_);
    while (true) {
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      Job job = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      job.work();
      job.state->complete();
      lock.lock();
    }
  }

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Job> queue_;
  bool stop_ = false;
  std::thread thread_;  // last: starts once the members it uses exist
};

}  // namespace bench
