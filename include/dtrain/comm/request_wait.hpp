#pragma once
// How the engine waits for its nonblocking MPI requests. See Note [Waiting without burning cores]
// in runtime/engine/wait_policy.hpp for the control messages; this is the same idea for the data.
//
// Note [Waiting for data collectives]
// MPICH (ch4/UCX) waits inside a blocking collective by polling, on the core the rank would run
// backward on: while a link-bound allreduce was in flight across hosts, a rank whose main thread
// slept used 0.99 of a core, and compute beside it took 2.05x as long (docs/scaling.md). MPICH
// 4.0.2 has no progress throttle, and its asynchronous progress thread spins too. So every host
// data collective is posted in its nonblocking form and tested here: hot for a short while (a
// peer in step answers within it, so a small collective never sleeps), then with sleeps of a
// quarter of the time waited so far, up to `max_sleep`. Across hosts the bytes move without us:
// the kernel drains the sockets' buffers while the thread sleeps, so a sleep costs bandwidth only
// when it outlasts that drain (about 10 ms for 4 MB at 3.4 Gbit/s; the cap is far below, measured
// in docs/scaling.md). Within a host MPI moves the bytes itself, through shared memory, during its
// progress calls: a sleeping rank stalls its peer. So only communicators that span hosts wait with
// sleeps; within a host the wait stays hot, as MPI's own blocking calls are.
// Measured across two namespace hosts, each rank pinned to its core (docs/scaling.md, "wait"): a
// rank waiting this way for a 64 MiB allreduce over 400 Mbit/s uses about 0.1 core instead of
// 1.0, and compute beside it runs about 1.13x as long as alone instead of 2x. But MPICH 4.0.2's
// nonblocking allreduce over UCX's TCP transport carries the link at about two thirds of the
// rate its blocking MPI_Allreduce reaches (2.1 s against 1.44 s), hot or sleeping, whichever
// algorithm, and ResNet-18 across two hosts trained slower for it (docs/scaling.md). So allreduce
// pieces are MPI's blocking calls by default (DTRAIN_MPI_NONBLOCKING=0: the full rate, the core
// polled while MPI waits); DTRAIN_MPI_NONBLOCKING=1 posts them nonblocking and waits this way.
// Every other host collective is always nonblocking.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <span>
#include <string_view>
#include <thread>

#include "dtrain/comm/mpi_error.hpp"

namespace dtrain::detail {

struct RequestWait {
  using Clock = std::chrono::steady_clock;

  Clock::duration hot_poll = std::chrono::microseconds(50);  // test without sleeping this long
  Clock::duration min_sleep = std::chrono::microseconds(5);
  Clock::duration max_sleep = Clock::duration::zero();  // zero: never sleep (within a host)
  int backoff_divisor = 4;  // sleep 1/n of the time waited so far
  // DTRAIN_MPI_NONBLOCKING=0 (the default): allreduce pieces are MPI's blocking calls, which wait
  // inside MPI (polling) at MPI's full link rate (Note [Waiting for data collectives]).
  bool blocking_allreduce = false;

  // Hot testing only: for communicators within one host (Note [Waiting for data collectives]).
  static RequestWait hot() noexcept { return RequestWait{}; }
  // Sleeps of at most `cap` once the hot phase is over.
  static RequestWait sleeping(Clock::duration cap) noexcept {
    RequestWait w;
    w.max_sleep = cap;
    return w;
  }
  bool sleeps() const noexcept { return max_sleep > Clock::duration::zero(); }

  // Paces a loop that tests requests: call idle() after a round in which nothing completed,
  // progressed() after one in which something did.
  class Pacer {
   public:
    explicit Pacer(const RequestWait& wait) : wait_(wait), since_(Clock::now()) {}
    void progressed() { since_ = Clock::now(); }
    void idle() {
      if (!wait_.sleeps()) return;
      const Clock::duration waited = Clock::now() - since_;
      if (waited < wait_.hot_poll) return;
      std::this_thread::sleep_for(
          std::clamp<Clock::duration>(waited / wait_.backoff_divisor, wait_.min_sleep,
                                      wait_.max_sleep));
    }

   private:
    const RequestWait& wait_;
    Clock::time_point since_;
  };

  // Returns once every request is complete (each then MPI_REQUEST_NULL). `call` names the MPI
  // call in an error.
  void wait_all(std::span<MPI_Request> requests, std::string_view call) const {
    Pacer pacer(*this);
    while (true) {
      int done = 0;
      mpi_check(MPI_Testall(static_cast<int>(requests.size()), requests.data(), &done,
                            MPI_STATUSES_IGNORE),
                call);
      if (done) return;
      pacer.idle();
    }
  }
  void wait(MPI_Request& request, std::string_view call) const {
    wait_all(std::span<MPI_Request>(&request, 1), call);
  }
};

}  // namespace dtrain::detail
