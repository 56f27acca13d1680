#pragma once
// Lifecycle (init, shutdown, Session) and topology queries. Declared here and defined with the
// engine (runtime/detail/session_impl.hpp; Note [Build modes] in core/build_mode.hpp).
#include <string>

#include "dtrain/core/build_mode.hpp"
#include "dtrain/core/config.hpp"
#include "dtrain/core/logging.hpp"
#include "dtrain/runtime/engine_stats.hpp"

namespace dtrain {

// Initializes dtrain (and MPI, unless the program already did). Reads the DTRAIN_* / HOROVOD_*
// environment. Calling init() again while initialized does nothing; init(config) with settings
// other than the running ones is an error.
DTRAIN_API void init();
DTRAIN_API void init(int& argc, char**& argv);
DTRAIN_API void init(const Config& config);
DTRAIN_API void init(const Config& config, int& argc, char**& argv);

DTRAIN_API bool is_initialized() noexcept;

// Collective: waits for every rank to call shutdown(), stops the engine, and finalizes MPI if
// dtrain initialized it. Idempotent. After a failure (Note [Engine failure]) it is local.
DTRAIN_API void shutdown();

// RAII: init() in the constructor; shutdown() in the destructor (which never throws) if this
// Session is the one that started dtrain, so a nested Session leaves the outer one running.
class Session {
 public:
  Session() : owns_(!is_initialized()) { init(); }
  Session(int& argc, char**& argv) : owns_(!is_initialized()) { init(argc, argv); }
  explicit Session(const Config& config) : owns_(!is_initialized()) { init(config); }
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;
  ~Session() {
    if (!owns_) return;
    try {
      shutdown();
    } catch (const std::exception& e) {
      detail::log(LogLevel::error, "dtrain::shutdown() failed in ~Session: {}", e.what());
    }
  }

 private:
  bool owns_;
};

DTRAIN_API int rank();
DTRAIN_API int size();
DTRAIN_API int local_rank();
DTRAIN_API int local_size();
DTRAIN_API int cross_rank();
DTRAIN_API int cross_size();
DTRAIN_API bool is_homogeneous();

// The configuration dtrain was initialized with.
DTRAIN_API Config config();

DTRAIN_API EngineStats engine_stats();

namespace detail {
// Whether this job's fused responses reduce tensors of kFusionDirectMinBytes and more in their own
// memory (runtime/fusion_layout.hpp): the setting every rank agreed on at init().
DTRAIN_API bool direct_segments(const char* caller);
}  // namespace detail

// Timeline control at run time. Rank 0 writes the file; other ranks ignore the call.
DTRAIN_API void start_timeline(const std::string& path);
DTRAIN_API void stop_timeline();

}  // namespace dtrain

#ifdef DTRAIN_HEADER_ONLY
#include "dtrain/runtime/detail/session_impl.hpp"
#endif
