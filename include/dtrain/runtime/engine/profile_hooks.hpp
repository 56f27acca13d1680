#pragma once
// Where the runtime reaches the profiler: init() opens the job's profile, shutdown() closes it,
// and a handle's wait is charged to the communication wait of the step under way. Internal: only
// the *_impl.hpp headers of the runtime and the profile layer include it.
//
// Note [Profile hooks]
// The profile layer sits below the runtime (a profile agrees on its run through the collectives,
// and reads the engine's counters), so the runtime cannot include it; it calls the profiler
// through this table, which the profile layer fills when it is part of the program
// (profile/active_profile.hpp, Note [Zero-code profiling]). It always is in the compiled mode
// (src/dtrain.cpp compiles both) and in a header-only program that includes <dtrain/dtrain.hpp>
// or <dtrain/profile/profiler.hpp>; a header-only program built from narrower headers has no
// profiler, and init() says so when DTRAIN_PROFILE asks for one rather than ignore it.
//
// The table is constant-initialized (no constructor runs), so it is valid before any static
// initializer, including the one that fills it. A wait costs one relaxed load of `observe_waits`
// while nothing is profiled; while something is, two clock reads and the call.
#include <mpi.h>

#include <atomic>
#include <chrono>

#include "dtrain/core/config.hpp"
#include "dtrain/core/logging.hpp"

namespace dtrain::detail {

struct Topology;

struct ProfileHooks {
  using Clock = std::chrono::steady_clock;
  // Opens the profile the Config asks for (DTRAIN_PROFILE), or checks that every rank agrees
  // that there is none. Collective over `world` (dtrain's own duplicate of MPI_COMM_WORLD, used
  // by no other thread during init()); throws on every rank alike.
  void (*open)(const Config& config, MPI_Comm world, const Topology& topology) = nullptr;
  // Closes the profile init() opened: the rest of its records reach the file. Local.
  void (*close)() noexcept = nullptr;
  // The calling thread waited on a handle from `begin` to `end`.
  void (*waited)(Clock::time_point begin, Clock::time_point end) noexcept = nullptr;
  // Whether anything records waits now: set by the profile layer while a profile is open.
  std::atomic<bool> observe_waits{false};
};

inline constinit ProfileHooks profile_hooks{};

// Times a wait on a handle for the profile, including one that ends by throwing the op's error.
class WaitTimer {
 public:
  WaitTimer() noexcept : begin_(ProfileHooks::Clock::now()) {}
  WaitTimer(const WaitTimer&) = delete;
  WaitTimer& operator=(const WaitTimer&) = delete;
  ~WaitTimer() {
    if (auto waited = profile_hooks.waited) waited(begin_, ProfileHooks::Clock::now());
  }

 private:
  ProfileHooks::Clock::time_point begin_;
};

inline bool waits_observed() noexcept {
  return profile_hooks.observe_waits.load(std::memory_order_relaxed);
}

// init(): after the topology, before the engine starts.
inline void open_job_profile(const Config& config, MPI_Comm world, const Topology& topology) {
  if (profile_hooks.open) {
    profile_hooks.open(config, world, topology);
    return;
  }
  if (!config.profile_dir.empty())
    log(LogLevel::warning,
        "dtrain: DTRAIN_PROFILE={} is ignored: this program was built header-only without "
        "dtrain's profiler; include <dtrain/dtrain.hpp> (or <dtrain/profile/profiler.hpp>) in "
        "one of its files, or link dtrain::dtrain",
        config.profile_dir);
}

inline void close_job_profile() noexcept {
  if (profile_hooks.close) profile_hooks.close();
}

}  // namespace dtrain::detail
