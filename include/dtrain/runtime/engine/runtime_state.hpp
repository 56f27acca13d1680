#pragma once
// The running runtime (configuration, topology, engine) and the process-wide lifecycle state that
// init() and shutdown() maintain. Internal: the public surface is runtime/session.hpp.
#include <mpi.h>

#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "dtrain/comm/communicator.hpp"
#include "dtrain/core/config.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/runtime/engine/engine.hpp"
#include "dtrain/runtime/execution/topology.hpp"

namespace dtrain::detail {

struct Runtime {
  Config config;
  Communicator world;  // dtrain's own duplicate of MPI_COMM_WORLD
  Topology topology;
  bool owns_mpi = false;  // dtrain initialized MPI, so dtrain finalizes it
  std::unique_ptr<Engine> engine;

  // Before MPI_Finalize.
  void free_communicators() noexcept {
    topology.local_comm.reset();
    topology.cross_comm.reset();
    world.reset();
  }
  // Note [Owned communicators] in comm/communicator.hpp: when not to free.
  void abandon_communicators() noexcept {
    topology.abandon_comms();
    world.abandon();
  }
};

// Note [Lifecycle]
// init() and shutdown() are serialized by one mutex; the running Runtime is published through a
// shared pointer that every call copies under a second, short-held mutex, so a thread that is
// submitting while another shuts down keeps the engine alive until its call returns (and is told
// the engine has stopped) instead of reading freed memory. Besides shutdown() itself, two exits
// are watched: MPI_Finalize() called while dtrain runs shuts dtrain down first (an attribute on
// MPI_COMM_SELF, whose delete callback MPI runs at the start of MPI_Finalize), and leaving main()
// while dtrain runs on several ranks tells the peers and ends the job with a failing status
// (Note [Peer liveness]).
enum class State { never_initialized, running, shut_down };

struct Lifecycle {
  std::mutex init_mutex;   // serializes init and shutdown
  std::mutex slot_mutex;   // guards `running` and `state`
  std::shared_ptr<Runtime> running;
  State state = State::never_initialized;
  bool mpi_initialized_by_dtrain = false;  // survives a failed init, so a retry still finalizes
  bool mpi_finalized_by_dtrain = false;    // shutdown() ended MPI: dtrain cannot start again here
  int finalize_keyval = MPI_KEYVAL_INVALID;
  bool exit_hook_installed = false;
};

inline Lifecycle& lifecycle() {
  static Lifecycle l;
  return l;
}

inline std::shared_ptr<Runtime> running_runtime() {
  auto& l = lifecycle();
  std::lock_guard lock(l.slot_mutex);
  return l.running;
}

// What a program can do once dtrain has shut down: MPI can start only once per process.
inline std::string restart_advice(const Lifecycle& l) {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (l.mpi_finalized_by_dtrain)
    return "Make the call before shutdown(). dtrain cannot start again in this process: it had "
           "initialized MPI, so shutdown() also finalized it, and MPI cannot be initialized twice "
           "in one process. To stop and restart dtrain within one process, initialize MPI "
           "yourself (MPI_Init_thread with MPI_THREAD_MULTIPLE) before the first dtrain::init() "
           "and finalize it after the last dtrain::shutdown().";
  if (finalized)
    return "Make the call before shutdown(). dtrain cannot start again in this process: MPI has "
           "been finalized.";
  return "Make the call before shutdown(), or call dtrain::init() again first (MPI is still "
         "initialized, so dtrain can start again).";
}

inline std::shared_ptr<Runtime> runtime(std::string_view caller) {
  auto& l = lifecycle();
  std::lock_guard lock(l.slot_mutex);
  if (l.running) return l.running;
  if (l.state == State::shut_down)
    throw NotInitializedError(fmt::format(
        "dtrain::{}() was called after dtrain::shutdown(): dtrain is no longer running. {}",
        caller, restart_advice(l)));
  throw NotInitializedError(fmt::format(
      "dtrain::{}() was called before dtrain::init(): call dtrain::init() (or create a "
      "dtrain::Session) at the start of main(), before any other dtrain call",
      caller));
}

}  // namespace dtrain::detail
