#pragma once
// The thread that advances Adasum ops between their exchanges (Note [Adasum tree] in
// runtime/detail/adasum_tree.hpp). An exchange completes on the engine thread, which must not
// spend its time combining vectors nor submit from inside a completion; it only hands the op here.
// Tasks never wait for a peer, so one thread serves every op in flight, in any order.
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

namespace dtrain::detail {

class AdasumWorker {
 public:
  AdasumWorker() = default;
  AdasumWorker(const AdasumWorker&) = delete;
  AdasumWorker& operator=(const AdasumWorker&) = delete;

  // Runs `task` on the worker thread, after those posted before it. From any thread; dropped once
  // the process is exiting.
  void post(std::function<void()> task) {
    {
      std::lock_guard lock(mutex_);
      if (stopping_) return;
      tasks_.push_back(std::move(task));
      if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
    }
    cv_.notify_one();
  }

  // Finishes the running task and drops the others. Their ops never complete, which is why only
  // the process's exit calls this.
  void stop() {
    std::thread thread;
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
      thread = std::move(thread_);
    }
    cv_.notify_all();
    if (thread.joinable()) thread.join();
    std::lock_guard lock(mutex_);
    tasks_.clear();
  }

 private:
  void run() {
    while (true) {
      std::function<void()> task;
      {
        std::unique_lock lock(mutex_);
        cv_.wait(lock, [&] { return stopping_ || !tasks_.empty(); });
        if (stopping_) return;
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      task();  // without the lock: a task submits ops, whose completions post here
    }
  }

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  bool stopping_ = false;
  std::thread thread_;  // started by the first task
};

// The process's worker. Completions that arrive late (the engine thread may outlive static
// destruction) hold it alive through their shared_ptr and find it stopped; the thread itself is
// joined when the process exits.
inline std::shared_ptr<AdasumWorker> adasum_worker() {
  struct Owner {
    std::shared_ptr<AdasumWorker> worker = std::make_shared<AdasumWorker>();
    ~Owner() { worker->stop(); }
  };
  static Owner owner;
  return owner.worker;
}

}  // namespace dtrain::detail
