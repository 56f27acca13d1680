#pragma once
// Definitions of runtime/session.hpp: init() and shutdown() with their corner cases (MPI owned by
// the program or by dtrain, MPI_Finalize called first, leaving main() without shutdown()), and the
// topology queries. Compiled once in src/dtrain.cpp, or inline in every file when header-only
// (Note [Build modes] in core/build_mode.hpp).
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dtrain/comm/gather_text.hpp"
#include "dtrain/comm/mpi_datatype.hpp"
#include "dtrain/core/config.hpp"
#include "dtrain/core/config_knobs.hpp"
#include "dtrain/core/log_sink.hpp"
#include "dtrain/core/logging.hpp"
#include "dtrain/runtime/engine/launch_check.hpp"
#include "dtrain/runtime/engine/profile_hooks.hpp"
#include "dtrain/runtime/engine/runtime_state.hpp"
#include "dtrain/runtime/session.hpp"

namespace dtrain {
namespace detail {

inline void shutdown_impl(bool inside_mpi_finalize);

// Runs at the start of MPI_Finalize (Note [Lifecycle]).
inline int shut_down_before_mpi_finalize(MPI_Comm, int, void*, void*) {
  if (!running_runtime()) return MPI_SUCCESS;
  log(LogLevel::warning, "dtrain: MPI_Finalize() was called while dtrain was running; shutting "
                         "dtrain down first. Call dtrain::shutdown() before MPI_Finalize().");
  try {
    shutdown_impl(true);
  } catch (const std::exception& e) {
    log(LogLevel::error, "dtrain: shutting down inside MPI_Finalize() failed: {}", e.what());
  }
  return MPI_SUCCESS;
}

// Runs when the process exits (Note [Lifecycle]).
inline void leave_without_shutdown(int status) {
  auto rt = running_runtime();
  if (!rt) return;
  if (rt->topology.size == 1) {
    try {
      shutdown_impl(false);  // nobody waits for this rank: stop quietly
    } catch (...) {
    }
    return;
  }
  const int rank = rt->topology.rank;
  const std::string why = fmt::format(
      "dtrain: rank {} on host {} left main() (exit status {}) without calling dtrain::shutdown(): "
      "its peers can complete no op with it, so the job ends. Call dtrain::shutdown() (or keep a "
      "dtrain::Session alive) until the end of main() on every rank.",
      rank, rt->topology.host_names.at(static_cast<std::size_t>(rank)), status);
  log(LogLevel::fatal, "{}", why);
  rt->engine->announce_exit(why);
  std::fflush(nullptr);
  std::_Exit(status != 0 ? status : 1);
}

inline void install_exit_hook() {
#if defined(__GLIBC__)
  // on_exit, unlike atexit, passes the exit status.
  ::on_exit([](int status, void*) { leave_without_shutdown(status); }, nullptr);
#else
  std::atexit([] { leave_without_shutdown(0); });
#endif
}

// Note [Settings invalid on some ranks]
// A setting that one rank's environment gives wrongly (DTRAIN_OP_TIMEOUT_SECONDS=bogus on one host)
// fails that rank's init(). Thrown there before MPI starts, it leaves the other ranks waiting in
// init() for a peer that never comes, until the launcher is killed. So init() starts MPI whatever
// the settings, and the ranks first agree on whether every rank's settings are valid (one
// allgather of each rank's error text): if any is not, init() fails on every rank at once, naming
// the ranks and their errors.
inline std::string agree_on_valid_settings(const std::string& invalid, MPI_Comm world) {
  const std::vector<std::string> all = allgather_text(invalid, world);
  std::vector<int> ranks;
  std::string details;
  for (std::size_t r = 0; r < all.size(); ++r) {
    if (all[r].empty()) continue;
    ranks.push_back(static_cast<int>(r));
    details += fmt::format("\n  rank {}: {}", r, all[r]);
  }
  if (ranks.empty()) return {};
  if (all.size() == 1) return invalid;
  return fmt::format("dtrain::init(): the settings of ranks [{}] are invalid, so dtrain does not "
                     "start on any rank:{}",
                     fmt::join(ranks, ", "), details);
}

// `invalid`: why `config` could not be read or is not valid on this rank ("" when it is).
inline void init_impl(const Config& config, int* argc, char*** argv, bool explicit_config,
                      std::string invalid = {}) {
  auto& l = lifecycle();
  std::lock_guard lock(l.init_mutex);
  if (invalid.empty()) {
    try {
      config.validate();
    } catch (const InvalidArgumentError& e) {
      invalid = e.what();
    }
  }
  if (auto rt = running_runtime()) {
    if (!invalid.empty()) throw InvalidArgumentError(invalid);
    // Already initialized: nothing to do, unless different settings were asked for explicitly.
    if (!explicit_config) return;
    const auto differences = config_differences(rt->config, config);
    if (differences.empty()) return;
    throw InvalidArgumentError(fmt::format(
        "dtrain::init(config): dtrain is already running with different settings:\n  {}\nCall "
        "dtrain::shutdown() first to restart it with new settings.",
        fmt::join(differences, "\n  ")));
  }
  if (invalid.empty()) set_log_level(config.log_level);

  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized && l.mpi_finalized_by_dtrain)
    throw Error("dtrain::init(): dtrain cannot start again in this process: it had initialized "
                "MPI, so dtrain::shutdown() also finalized it, and MPI cannot be initialized twice "
                "in one process. To stop and restart dtrain within one process, initialize MPI "
                "yourself (MPI_Init_thread with MPI_THREAD_MULTIPLE) before the first "
                "dtrain::init() and finalize it after the last dtrain::shutdown().");
  if (finalized)
    throw Error("dtrain::init(): MPI has already been finalized in this process (MPI_Finalize() "
                "was called) and cannot be initialized again; call dtrain::init() before "
                "MPI_Finalize()");
  auto rt = std::make_shared<Runtime>();
  rt->config = config;
  int initialized = 0, provided = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    mpi_check(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
    l.mpi_initialized_by_dtrain = true;
  } else {
    MPI_Query_thread(&provided);
  }
  rt->owns_mpi = l.mpi_initialized_by_dtrain;
  if (provided < MPI_THREAD_MULTIPLE) {
    if (rt->owns_mpi) {
      MPI_Finalize();
      l.mpi_initialized_by_dtrain = false;
    }
    throw Error(fmt::format(
        "dtrain::init(): MPI provides thread level {} but dtrain needs MPI_THREAD_MULTIPLE "
        "({}) because its engine thread calls MPI while your threads may too. {}",
        provided, MPI_THREAD_MULTIPLE,
        rt->owns_mpi ? "This MPI library was built without thread support; use an MPI with "
                       "MPI_THREAD_MULTIPLE (MPICH and Open MPI provide it)."
                     : "Initialize MPI with MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...) or let "
                       "dtrain::init() initialize it."));
  }
  int world_size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  if (auto why = srun_without_pmi(world_size, ProcessEnv())) {  // Note [One-rank worlds under srun]
    if (rt->owns_mpi) {
      MPI_Finalize();
      l.mpi_initialized_by_dtrain = false;
      l.mpi_finalized_by_dtrain = true;
    }
    throw InvalidArgumentError(*why);
  }
  rt->world = Communicator::duplicate(MPI_COMM_WORLD);
  half_ops().create();
  try {
    // Note [Settings invalid on some ranks]
    if (auto why = agree_on_valid_settings(invalid, rt->world.get()); !why.empty())
      throw InvalidArgumentError(why);
    rt->topology = make_topology(rt->world.get(), config.host_id);
    log_rank.store(rt->topology.rank);
    // Before the engine: DTRAIN_PROFILE profiles the job from here (Note [Profile hooks]).
    open_job_profile(config, rt->world.get(), rt->topology);
    rt->engine = std::make_unique<Engine>(config, rt->world.get(), &rt->topology);
  } catch (...) {
    close_job_profile();  // the communicators go with `rt`
    half_ops().destroy();
    log_rank.store(-1);
    throw;
  }
  if (l.finalize_keyval == MPI_KEYVAL_INVALID) {
    mpi_check(MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, shut_down_before_mpi_finalize,
                                     &l.finalize_keyval, nullptr),
              "MPI_Comm_create_keyval");
    mpi_check(MPI_Comm_set_attr(MPI_COMM_SELF, l.finalize_keyval, nullptr), "MPI_Comm_set_attr");
  }
  if (!l.exit_hook_installed) {
    install_exit_hook();
    l.exit_hook_installed = true;
  }
  std::lock_guard slot(l.slot_mutex);
  l.running = std::move(rt);
  l.state = State::running;
}

// Note [Finalize over TCP]
// MPICH 4.0.2 with UCX 1.13 (Debian 12) can hang for ever in MPI_Finalize when a message between
// two hosts is still in flight as a rank enters it: UCX's TCP transport stops progressing an
// interface while an endpoint on it is still closing (openucx/ucx#8738); the other ranks then
// wait in the PMI barrier at the end of MPI_Finalize. Measured on two network-namespace hosts
// (tests/launcher/multihost_netns.py), with MPI_Finalize straight after shutdown 7 of 8 jobs hung;
// with a barrier first 4 of 10 (its own last message is the one in flight); with a barrier and
// a 20 ms pause 0 of 10. So when dtrain finalizes MPI, every rank waits for the others and lets
// the last messages land first: 20 ms once per process. Not only for jobs that span hosts: which
// transport MPI uses between two ranks is its own choice (MPIR_CVAR_NOLOCAL=1 sends ranks on one
// host over TCP too), and the pause is cheap next to a job's start.
inline void settle_before_finalize(MPI_Comm world) {
  if (MPI_Barrier(world) != MPI_SUCCESS) return;
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
}

inline void shutdown_impl(bool inside_mpi_finalize) {
  auto& l = lifecycle();
  std::lock_guard lock(l.init_mutex);
  if (!running_runtime()) return;
  // While dtrain still runs: the profile's last sample reads the engine's counters.
  close_job_profile();
  std::shared_ptr<Runtime> rt;
  {
    std::lock_guard slot(l.slot_mutex);
    rt = std::move(l.running);
    if (!rt) return;
    l.state = State::shut_down;
  }
  using Outcome = Engine::ShutdownOutcome;
  const Outcome outcome = rt->engine->shutdown();
  detail::log_rank.store(-1);
  if (outcome == Outcome::blocked) {
    // Note [Engine failure]: the engine thread is blocked inside MPI for good. Leave the engine
    // (and MPI) as they are so the process can still exit.
    (void)rt->engine.release();
    rt->abandon_communicators();
    log(LogLevel::warning, "dtrain: shut down after a failure; MPI is left as it is (not "
                           "finalized) so that this process can exit");
    return;
  }
  rt->engine->release_communicators();  // now: another thread may still hold the engine
  if (outcome == Outcome::clean && rt->owns_mpi && !inside_mpi_finalize && rt->topology.size > 1)
    settle_before_finalize(rt->world.get());
  rt->free_communicators();
  half_ops().destroy();
  if (outcome == Outcome::after_failure && rt->engine->peer_lost()) {
    // MPI_Finalize could wait for the lost rank.
    log(LogLevel::warning, "dtrain: shut down after losing a peer; MPI is not finalized so that "
                           "this process can exit");
    return;
  }
  if (inside_mpi_finalize) return;
  if (l.finalize_keyval != MPI_KEYVAL_INVALID) {
    MPI_Comm_delete_attr(MPI_COMM_SELF, l.finalize_keyval);  // its callback finds nothing running
    MPI_Comm_free_keyval(&l.finalize_keyval);
  }
  if (rt->owns_mpi) {
    MPI_Finalize();
    l.mpi_initialized_by_dtrain = false;
    l.mpi_finalized_by_dtrain = true;
  }
}

}  // namespace detail

namespace detail {
// The environment's settings; an invalid one is agreed on with the peers before init() fails
// (Note [Settings invalid on some ranks]).
inline void init_from_env(int* argc, char*** argv) {
  Config config;
  std::string invalid;
  try {
    config = Config::from_env();
  } catch (const InvalidArgumentError& e) {
    invalid = e.what();
  }
  init_impl(config, argc, argv, false, std::move(invalid));
}
}  // namespace detail

DTRAIN_API void init() { detail::init_from_env(nullptr, nullptr); }
DTRAIN_API void init(int& argc, char**& argv) { detail::init_from_env(&argc, &argv); }
DTRAIN_API void init(const Config& config) { detail::init_impl(config, nullptr, nullptr, true); }
DTRAIN_API void init(const Config& config, int& argc, char**& argv) {
  detail::init_impl(config, &argc, &argv, true);
}

DTRAIN_API bool is_initialized() noexcept { return detail::running_runtime() != nullptr; }

DTRAIN_API void shutdown() { detail::shutdown_impl(false); }

DTRAIN_API int rank() { return detail::runtime("rank")->topology.rank; }
DTRAIN_API int size() { return detail::runtime("size")->topology.size; }
DTRAIN_API int local_rank() { return detail::runtime("local_rank")->topology.layout.local_rank; }
DTRAIN_API int local_size() { return detail::runtime("local_size")->topology.layout.local_size; }
DTRAIN_API int cross_rank() { return detail::runtime("cross_rank")->topology.layout.cross_rank; }
DTRAIN_API int cross_size() { return detail::runtime("cross_size")->topology.layout.cross_size; }
DTRAIN_API bool is_homogeneous() {
  return detail::runtime("is_homogeneous")->topology.layout.homogeneous;
}

DTRAIN_API Config config() { return detail::runtime("config")->config; }

DTRAIN_API EngineStats engine_stats() { return detail::runtime("engine_stats")->engine->stats(); }

namespace detail {
DTRAIN_API bool direct_segments(const char* caller) {
  return runtime(caller)->engine->direct_segments();
}
}  // namespace detail

DTRAIN_API void start_timeline(const std::string& path) {
  detail::runtime("start_timeline")->engine->start_timeline(path);
}
DTRAIN_API void stop_timeline() { detail::runtime("stop_timeline")->engine->stop_timeline(); }

}  // namespace dtrain
