#pragma once
// Note [Peer liveness]
// MPI does not tell a process that a peer died: a collective with a dead rank blocks for ever.
// MPICH's launcher, with its default cleanup, kills the whole job at once when a rank dies, but a
// launcher that keeps the survivors alive so they can report (dtrainrun, `mpiexec
// -disable-auto-cleanup`) leaves them blocked. So every rank exchanges heartbeats on a
// communicator of its own, from the watchdog thread, independently of the engine thread (which may
// be blocked inside a collective): each rank sends one to rank 0 every kHeartbeatPeriod, and rank 0
// one to every rank. Rank 0 declares a rank lost after DTRAIN_PEER_TIMEOUT_SECONDS without a
// heartbeat and tells the others; the others declare rank 0 lost after the same silence. Every
// rank uses rank 0's value (Note [Agreed settings]); 0 turns the check off. A rank that leaves
// main() without dtrain::shutdown() tells everyone before it exits, whatever the setting. Each
// survivor then fails its ops with a ShutdownError naming the rank and its host, and ends its
// process kExitGrace later if the program has not ended it by then (it may be blocked in its own
// MPI call with the lost rank), so a lost rank ends the job everywhere within the peer timeout +
// kExitGrace.
//
// Silence is counted in the watcher's own running time. A process that was itself stopped (SIGSTOP,
// a debugger, Ctrl-Z, SLURM suspend, a VM pause, heavy swapping) heard nothing because it was not
// running, not because its peers died: the watchdog notices the gap between its own wake-ups and
// does not count it (Watchdog::run). So a job whose ranks are all stopped and resumed together
// carries on; a rank stopped alone looks, to the others, exactly like a frozen one, and is lost
// after the peer timeout (docs/reliability.md says what to set while debugging).
//
// Sends never wait for a peer: a heartbeat is skipped while the previous one to the same peer has
// not completed, so nothing piles up behind a dead rank; a death notice has a slot of its own and
// goes out once.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "dtrain/comm/communicator.hpp"
#include "dtrain/comm/mpi_error.hpp"

namespace dtrain::detail {

class PeerMonitor {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr auto kHeartbeatPeriod = std::chrono::seconds(1);
  static constexpr auto kExitGrace = std::chrono::seconds(15);

  // `hosts[r]` names rank r's host, for the reports. `silence`: how long a peer may go unheard
  // before it is lost; zero: never (heartbeats are then neither sent nor checked).
  PeerMonitor(MPI_Comm world, std::vector<std::string> hosts, Clock::duration silence)
      : comm_(Communicator::duplicate(world)), hosts_(std::move(hosts)), silence_(silence) {
    MPI_Comm_rank(comm_.get(), &rank_);
    MPI_Comm_size(comm_.get(), &size_);
    const auto now = Clock::now();
    last_heard_.assign(static_cast<std::size_t>(size_), now);
    heartbeats_.resize(static_cast<std::size_t>(size_));
    notices_.resize(static_cast<std::size_t>(size_));
  }
  PeerMonitor(const PeerMonitor&) = delete;
  PeerMonitor& operator=(const PeerMonitor&) = delete;
  // Never closed: a peer was lost, and freeing could wait for it (Note [Owned communicators]).
  ~PeerMonitor() { comm_.abandon(); }

  // Frees the communicator; only when every peer is known to be alive. `all_closing`: every rank
  // is closing now (a clean shutdown), so heartbeats still on their way are drained first and MPI
  // does not find them unreceived at finalize.
  void close(bool all_closing) noexcept {
    std::lock_guard lock(mutex_);
    if (!comm_) return;
    if (all_closing && size_ > 1) {
      // Every rank has stopped sending; once all are past the barrier, what was sent has arrived.
      if (MPI_Barrier(comm_.get()) == MPI_SUCCESS) (void)receive(Clock::now());
    }
    for (auto* slots : {&heartbeats_, &notices_})
      for (auto& s : *slots)
        if (s.request != MPI_REQUEST_NULL) MPI_Request_free(&s.request);
    comm_.reset();
  }

  int size() const noexcept { return size_; }

  // Sends due heartbeats and reads what arrived. Returns the report when a peer is gone (once).
  // `paused`: how long this process itself was not running since the last tick; not counted as
  // the peers' silence (Note [Peer liveness]).
  std::optional<std::string> tick(Clock::time_point now, Clock::duration paused = {}) {
    std::lock_guard lock(mutex_);
    if (size_ < 2 || reported_ || !comm_) return std::nullopt;
    if (paused > Clock::duration::zero())
      for (auto& heard : last_heard_) heard = std::min(now, heard + paused);
    const bool watching = silence_ > Clock::duration::zero();
    if (watching && now - last_sent_ >= kHeartbeatPeriod) {
      last_sent_ = now;
      if (rank_ == 0) {
        for (int r = 1; r < size_; ++r) send(heartbeats_, r, "H");
      } else {
        send(heartbeats_, 0, "H");
      }
    }
    if (auto notice = receive(now)) return report(*notice);
    if (!watching) return std::nullopt;
    // Rank 0 watches everyone; the others watch rank 0, which tells them about the rest.
    for (int r = 0; r < size_; ++r) {
      if (r == rank_ || (rank_ != 0 && r != 0)) continue;
      if (now - last_heard_[static_cast<std::size_t>(r)] < silence_) continue;
      const std::string why = fmt::format(
          "dtrain: rank {} on host {} stopped responding: no heartbeat for {} s "
          "(DTRAIN_PEER_TIMEOUT_SECONDS). It died (killed, crashed, out of memory), is frozen, or "
          "was stopped (a debugger, SIGSTOP); the job cannot continue. While debugging, set "
          "DTRAIN_PEER_TIMEOUT_SECONDS=0.",
          r, host(r),
          std::chrono::duration_cast<std::chrono::seconds>(now - last_heard_[static_cast<std::size_t>(r)]).count());
      if (rank_ == 0)
        for (int k = 1; k < size_; ++k)
          if (k != r) send(notices_, k, "D" + why);
      return report(why);
    }
    return std::nullopt;
  }

  // Tells every peer that this rank is leaving, and gives the messages a moment to go out.
  void announce_exit(const std::string& why) noexcept {
    std::lock_guard lock(mutex_);
    if (!comm_ || size_ < 2) return;
    reported_ = true;
    for (int r = 0; r < size_; ++r)
      if (r != rank_) send(notices_, r, "D" + why);
    const auto deadline = Clock::now() + std::chrono::milliseconds(500);
    while (Clock::now() < deadline) {
      bool pending = false;
      for (auto& s : notices_) {
        if (s.request == MPI_REQUEST_NULL) continue;
        int done = 0;
        MPI_Test(&s.request, &done, MPI_STATUS_IGNORE);
        pending |= done == 0;
      }
      if (!pending) return;
    }
  }

  std::string host(int r) const {
    return r >= 0 && r < static_cast<int>(hosts_.size()) ? hosts_[static_cast<std::size_t>(r)]
                                                          : std::string("?");
  }

 private:
  struct Send {
    MPI_Request request = MPI_REQUEST_NULL;
    std::string payload;
  };

  void send(std::vector<Send>& slots, int to, std::string payload) noexcept {
    Send& s = slots[static_cast<std::size_t>(to)];
    if (s.request != MPI_REQUEST_NULL) {
      int done = 0;
      MPI_Test(&s.request, &done, MPI_STATUS_IGNORE);
      if (!done) return;  // the previous one is still on its way; its buffer must stay
    }
    s.payload = std::move(payload);
    if (MPI_Isend(s.payload.data(), static_cast<int>(s.payload.size()), MPI_CHAR, to, kTag,
                  comm_.get(), &s.request) != MPI_SUCCESS)
      s.request = MPI_REQUEST_NULL;
  }

  // Drains arrived messages; returns a death notice if one came.
  std::optional<std::string> receive(Clock::time_point now) {
    std::optional<std::string> notice;
    while (true) {
      int flag = 0;
      MPI_Message handle;
      MPI_Status status;
      if (MPI_Improbe(MPI_ANY_SOURCE, kTag, comm_.get(), &flag, &handle, &status) != MPI_SUCCESS ||
          !flag)
        return notice;
      int count = 0;
      MPI_Get_count(&status, MPI_CHAR, &count);
      std::string payload(static_cast<std::size_t>(count), '\0');
      if (MPI_Mrecv(payload.data(), count, MPI_CHAR, &handle, MPI_STATUS_IGNORE) != MPI_SUCCESS)
        return notice;
      last_heard_[static_cast<std::size_t>(status.MPI_SOURCE)] = now;
      if (!payload.empty() && payload[0] == 'D' && !notice) notice = payload.substr(1);
    }
  }

  std::string report(const std::string& why) {
    reported_ = true;
    return why;
  }

  static constexpr int kTag = 7;
  Communicator comm_;
  int rank_ = 0, size_ = 1;
  std::vector<std::string> hosts_;
  const Clock::duration silence_;
  std::vector<Clock::time_point> last_heard_;
  std::mutex mutex_;  // the watchdog ticks; a thread leaving main() announces its exit
  std::vector<Send> heartbeats_;
  std::vector<Send> notices_;
  Clock::time_point last_sent_{};
  bool reported_ = false;
};

}  // namespace dtrain::detail
