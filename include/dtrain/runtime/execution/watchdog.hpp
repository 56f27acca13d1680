#pragma once
// The engine's watchdog thread: enforces DTRAIN_OP_TIMEOUT_SECONDS on the collective the engine
// thread is executing, and exchanges heartbeats with the peers (Note [Peer liveness] in
// runtime/execution/liveness.hpp). Either failure stops the engine for good (Note [Engine failure]
// in runtime/engine/engine.hpp). It wakes at least once a second, never per op, so it costs nothing
// on the hot path.
#include <fcntl.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
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
#include "dtrain/runtime/execution/entry.hpp"
#include "dtrain/runtime/execution/liveness.hpp"
#include "dtrain/runtime/execution/op_deadline.hpp"
#include "dtrain/runtime/execution/op_state.hpp"

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

  // executing() until the scope ends, however it ends: the watchdog never keeps `owned` past it.
  class Scope {
   public:
    Scope(Watchdog& w, std::string name, std::string_view kind,
          std::vector<std::shared_ptr<Entry>>* owned)
        : w_(w) {
      w_.executing(std::move(name), kind, owned);
    }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;
    ~Scope() { w_.finished(); }

   private:
    Watchdog& w_;
  };

  // A peer died or left: MPI calls that involve every rank may never return.
  bool peer_lost() const noexcept { return peer_lost_.load(); }

  // This process's own pauses so far (Note [Own pauses]), for the deadlines of the device paths.
  const OwnPauses& own_pauses() const noexcept { return pauses_; }

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
    auto last_waited = run_queue_wait();
    std::unique_lock lock(mutex_);
    while (!cv_.wait_for(lock, period, [&] { return stop_; })) {
      const auto now = Clock::now();
      const auto waited = run_queue_wait();
      const auto paused = own_pause(now - last_wake - period, last_waited, waited);
      last_wake = now;
      last_waited = waited;
      if (paused > Clock::duration::zero()) {
        pauses_.add(paused);  // the device paths' deadlines read it (Note [One op deadline])
        if (!executing_.empty()) started_ += paused;
        log(LogLevel::info, "dtrain: rank {} was not running for {:.1f} s (stopped, or its machine "
            "was); that time is not counted against its peers or its op", rank_,
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

  // Note [Own pauses]
  // Woken much later than asked, the watchdog was either not running (its process stopped: SIGSTOP,
  // a debugger, SLURM suspend; or its machine paused) or runnable but kept off the CPUs by other
  // work. The first is nobody's silence and no op's fault (Note [Peer liveness]); the second is
  // real time in which peers and ops should have progressed, and counting it as a pause on a busy
  // machine pushes every deadline back for as long as the machine stays busy (measured: a frozen
  // peer went unreported for over 90 s with 3 ranks polling on 2 cores). The kernel tells them
  // apart: /proc/thread-self/schedstat counts the time this thread spent runnable but waiting for
  // a CPU, which a stopped thread does not accrue. So the pause is the lateness less that wait,
  // and only a pause of at least kOwnPauseAtLeast counts. Where the kernel does not say, all the
  // lateness counts, as before.
  static constexpr auto kOwnPauseAtLeast = std::chrono::seconds(1);

 public:
  // The time this process was not running between two wake-ups (Note [Own pauses]): `late` past
  // the period, of which the thread spent `waited_after - waited_before` waiting for a CPU.
  static Clock::duration own_pause(Clock::duration late,
                                   std::optional<std::chrono::nanoseconds> waited_before,
                                   std::optional<std::chrono::nanoseconds> waited_after) noexcept {
    Clock::duration not_running = late;
    if (waited_before && waited_after && *waited_after >= *waited_before)
      not_running -= std::chrono::duration_cast<Clock::duration>(*waited_after - *waited_before);
    return not_running >= kOwnPauseAtLeast ? not_running : Clock::duration::zero();
  }

  // How long the calling thread has been runnable but waiting for a CPU, since it started; nothing
  // where the kernel does not report it.
  static std::optional<std::chrono::nanoseconds> run_queue_wait() noexcept {
    const int fd = ::open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return std::nullopt;
    char text[128];
    const ssize_t n = ::read(fd, text, sizeof text - 1);
    ::close(fd);
    if (n <= 0) return std::nullopt;
    text[n] = '\0';
    unsigned long long on_cpu = 0, waiting = 0;
    if (std::sscanf(text, "%llu %llu", &on_cpu, &waiting) != 2) return std::nullopt;
    return std::chrono::nanoseconds(static_cast<std::int64_t>(waiting));
  }

 private:

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
  OwnPauses pauses_;
  std::thread thread_;  // last: starts once everything above is initialized
};

}  // namespace dtrain::detail
