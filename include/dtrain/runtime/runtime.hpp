#pragma once
// Lifecycle (init, shutdown, Session) and topology queries.
#include <mpi.h>

#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "dtrain/comm/mpi_datatype.hpp"
#include "dtrain/core/config.hpp"
#include "dtrain/core/logging.hpp"
#include "dtrain/runtime/engine.hpp"
#include "dtrain/runtime/topology.hpp"

namespace dtrain {
namespace detail {

struct Runtime {
  Config config;
  Topology topology;
  MPI_Comm world = MPI_COMM_NULL;  // dtrain's own duplicate of MPI_COMM_WORLD
  bool owns_mpi = false;           // dtrain initialized MPI, so dtrain finalizes it
  std::unique_ptr<Engine> engine;
};

inline std::mutex& runtime_mutex() {
  static std::mutex m;
  return m;
}
inline std::unique_ptr<Runtime>& runtime_slot() {
  static std::unique_ptr<Runtime> r;
  return r;
}

inline Runtime& runtime(std::string_view caller) {
  auto& r = runtime_slot();
  if (!r)
    throw NotInitializedError(fmt::format(
        "dtrain::{}() was called before dtrain::init(): call dtrain::init() (or create a "
        "dtrain::Session) at the start of main(), before any other dtrain call",
        caller));
  return *r;
}

inline Engine& engine(std::string_view caller) { return *runtime(caller).engine; }

inline void init_impl(const Config& config, int* argc, char*** argv) {
  std::lock_guard lock(runtime_mutex());
  if (runtime_slot()) return;  // already initialized: init is idempotent
  config.validate();
  set_log_level(config.log_level);

  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized)
    throw Error("dtrain::init(): MPI has already been finalized in this process and cannot be "
                "initialized again; call dtrain::init() before MPI_Finalize()");
  auto rt = std::make_unique<Runtime>();
  rt->config = config;
  int initialized = 0, provided = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    mpi_check(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
    rt->owns_mpi = true;
  } else {
    MPI_Query_thread(&provided);
  }
  if (provided < MPI_THREAD_MULTIPLE) {
    if (rt->owns_mpi) MPI_Finalize();
    throw Error(fmt::format(
        "dtrain::init(): MPI provides thread level {} but dtrain needs MPI_THREAD_MULTIPLE "
        "({}) because its engine thread calls MPI while your threads may too. {}",
        provided, MPI_THREAD_MULTIPLE,
        rt->owns_mpi ? "This MPI library was built without thread support; use an MPI with "
                       "MPI_THREAD_MULTIPLE (MPICH and Open MPI provide it)."
                     : "Initialize MPI with MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...) or let "
                       "dtrain::init() initialize it."));
  }
  mpi_check(MPI_Comm_dup(MPI_COMM_WORLD, &rt->world), "MPI_Comm_dup");
  MPI_Comm_set_errhandler(rt->world, MPI_ERRORS_RETURN);
  half_ops().create();
  rt->topology = make_topology(rt->world, config.host_id);
  log_rank.store(rt->topology.rank);
  rt->engine = std::make_unique<Engine>(config, rt->world, &rt->topology);
  runtime_slot() = std::move(rt);
}

}  // namespace detail

// Initializes dtrain (and MPI, unless the program already did). Reads the DTRAIN_* / HOROVOD_*
// environment. Calling init() again while initialized does nothing.
inline void init() { detail::init_impl(Config::from_env(), nullptr, nullptr); }
inline void init(int& argc, char**& argv) { detail::init_impl(Config::from_env(), &argc, &argv); }
inline void init(const Config& config) { detail::init_impl(config, nullptr, nullptr); }
inline void init(const Config& config, int& argc, char**& argv) {
  detail::init_impl(config, &argc, &argv);
}

inline bool is_initialized() noexcept {
  std::lock_guard lock(detail::runtime_mutex());
  return detail::runtime_slot() != nullptr;
}

// Collective: waits for every rank to call shutdown(), stops the engine, and finalizes MPI if
// dtrain initialized it. Idempotent.
inline void shutdown() {
  std::lock_guard lock(detail::runtime_mutex());
  auto& slot = detail::runtime_slot();
  if (!slot) return;
  std::unique_ptr<detail::Runtime> rt = std::move(slot);
  rt->engine->shutdown();
  rt->engine.reset();
  rt->topology.free_comms();
  MPI_Comm_free(&rt->world);
  detail::half_ops().destroy();
  detail::log_rank.store(-1);
  if (rt->owns_mpi) MPI_Finalize();
}

// RAII: init() in the constructor, shutdown() in the destructor (which never throws).
class Session {
 public:
  Session() { init(); }
  Session(int& argc, char**& argv) { init(argc, argv); }
  explicit Session(const Config& config) { init(config); }
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;
  ~Session() {
    try {
      shutdown();
    } catch (const std::exception& e) {
      detail::log(LogLevel::error, "dtrain::shutdown() failed in ~Session: {}", e.what());
    }
  }
};

inline int rank() { return detail::runtime("rank").topology.rank; }
inline int size() { return detail::runtime("size").topology.size; }
inline int local_rank() { return detail::runtime("local_rank").topology.local_rank; }
inline int local_size() { return detail::runtime("local_size").topology.local_size; }
inline int cross_rank() { return detail::runtime("cross_rank").topology.cross_rank; }
inline int cross_size() { return detail::runtime("cross_size").topology.cross_size; }
inline bool is_homogeneous() { return detail::runtime("is_homogeneous").topology.homogeneous; }

// The configuration dtrain was initialized with.
inline const Config& config() { return detail::runtime("config").config; }

inline EngineStats engine_stats() { return detail::engine("engine_stats").stats(); }

// Timeline control at run time. Rank 0 writes the file; other ranks ignore the call.
inline void start_timeline(const std::string& path) {
  detail::engine("start_timeline").start_timeline(path);
}
inline void stop_timeline() { detail::engine("stop_timeline").stop_timeline(); }

}  // namespace dtrain
