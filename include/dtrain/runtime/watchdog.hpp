#pragma once
// The engine's watchdog thread: enforces DTRAIN_OP_TIMEOUT_SECONDS on the collective the engine
// thread is executing, and exchanges heartbeats with the peers (Note [Peer liveness] in
// runtime/liveness.hpp). Either failure stops the engine for good (Note [Engine failure] in
// runtime/engine.hpp). It wakes at least once a second, never per op, so it costs nothing on the
// hot path.
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "dtrain/core/error.hpp"
#include "dtrain/core/logging.hpp"
#include "dtrain/runtime/entry.hpp"
#include "dtrain/runtime/op_state.hpp"
#include "dtrain/runtime/liveness.hpp"

namespace dtrain::detail {

class Watchdog {
 public:
  using Clock = std::chrono::steady_clock;
  // Fails every op of the engine with the given cause (Engine::fail_everything).
  using FailAll = std::function<void(const std::string& why)>;

  // `monitor` (null on a one-rank job) must outlive the watchdog.
  Watchdog(double op_timeout_seconds, int rank, PeerMonitor* monitor, FailAll fail_all)
      : op_timeout_seconds_(op_timeout_seconds), rank_(rank), monitor_(monitor),
        fail_all_(std::move(fail_all)), thread_([this] { run(); }) {}
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;
  ~Watchdog() { stop(); }

  // The engine thread starts executing `name` (of `kind`), whose entries are `owned`; they fail
  // with TimeoutError if it outlives the op timeout. `owned` must live until finished().
  void executing(std::string name, std::string_view kind,
                 std::vector<std::shared_ptr<Entry>>* owned) {
    std::lock_guard lock(mutex_);
    executing_ = std::move(name);
    kind_ = kind;
    started_ = Clock::now();
    owned_ = owned;
  }
  void finished() {
    std::lock_guard lock(mutex_);
    executing_.clear();
    owned_ = nullptr;
  }

  // A peer died or left: MPI calls that involve every rank may never return.
  bool peer_lost() const noexcept { return peer_lost_.load(); }

  void stop() {
    if (!thread_.joinable()) return;
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  void run() {
    const auto timeout = std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double>(op_timeout_seconds_));
    auto period = std::chrono::duration_cast<Clock::duration>(PeerMonitor::kHeartbeatPeriod);
    if (op_timeout_seconds_ > 0) period = std::min<Clock::duration>(period, timeout / 4);
    std::optional<Clock::time_point> lost_at;
    auto last_wake = Clock::now();
    std::unique_lock lock(mutex_);
    while (!cv_.wait_for(lock, period, [&] { return stop_; })) {
      const auto now = Clock::now();
      // Woken much later than asked: this process was not running (stopped, or starved of CPU).
      // That time is nobody's silence and no op's fault (Note [Peer liveness]).
      const auto overslept = now - last_wake - period;
      last_wake = now;
      const auto paused = overslept > kOwnPauseAtLeast ? overslept : Clock::duration::zero();
      if (paused > Clock::duration::zero()) {
        if (!executing_.empty()) started_ += paused;
        log(LogLevel::info, "dtrain: rank {} was not running for {:.1f} s (stopped or starved of "
            "CPU); that time is not counted against its peers or its op", rank_,
            std::chrono::duration<double>(paused).count());
      }
      if (op_timeout_seconds_ > 0 && !executing_.empty() && now - started_ >= timeout &&
          !timed_out_) {
        timed_out_ = true;
        const std::string what = fmt::format(
            "dtrain: {} '{}' on rank {} did not complete within {} s (DTRAIN_OP_TIMEOUT_SECONDS) "
            "after every rank had submitted it: a peer died or hangs inside the collective. MPI "
            "cannot cancel a collective, so this rank's engine has stopped; save what you need "
            "and exit.",
            kind_, executing_, rank_, op_timeout_seconds_);
        fail_executing(std::make_exception_ptr(TimeoutError(what)));
        lock.unlock();
        fail_all_(what);
        lock.lock();
      }
      if (monitor_ && !lost_at) {
        lock.unlock();
        auto lost = monitor_->tick(now, paused);
        lock.lock();
        if (lost) {
          lost_at = now;
          peer_lost_ = true;
          // The collective under way may involve the lost rank and never return: its ops fail
          // now, like every other op, so the program can save and exit before the grace ends.
          fail_executing(std::make_exception_ptr(ShutdownError(*lost)));
          lock.unlock();
          fail_all_(*lost);
          lock.lock();
        }
      }
      if (lost_at && now - *lost_at >= PeerMonitor::kExitGrace) {
        lock.unlock();
        log(LogLevel::fatal,
            "dtrain: rank {} is still running {} s after a peer was lost; ending the job "
            "(a survivor may be blocked in an MPI call with the lost rank)",
            rank_, std::chrono::duration_cast<std::chrono::seconds>(PeerMonitor::kExitGrace).count());
        MPI_Abort(MPI_COMM_WORLD, 1);
        return;
      }
    }
  }

  // Completes the entries of the collective being executed (mutex_ held).
  void fail_executing(const std::exception_ptr& error) {
    if (owned_)
      for (auto& e : *owned_)
        if (e) e->state->complete(error);
  }

  // A wake-up this much later than asked means the process did not run: scheduling delays on a
  // busy machine stay well below it.
  static constexpr auto kOwnPauseAtLeast = std::chrono::seconds(1);

  const double op_timeout_seconds_;
  const int rank_;
  PeerMonitor* const monitor_;
  const FailAll fail_all_;

  std::mutex mutex_;
  std::condition_variable cv_;
  std::string executing_;  // empty: the engine thread executes nothing
  std::string_view kind_;
  Clock::time_point started_;
  std::vector<std::shared_ptr<Entry>>* owned_ = nullptr;
  bool timed_out_ = false;
  bool stop_ = false;
  std::atomic<bool> peer_lost_{false};
  std::thread thread_;  // last: starts once everything above is initialized
};

}  // namespace dtrain::detail
