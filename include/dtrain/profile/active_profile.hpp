#pragma once
// The profile a job records into, and what reaches it with no code in the program: init() opens
// it, shutdown() closes it, optimizer updates mark its steps and waits on handles are their
// communication wait. Internal: profile/profiler_impl.hpp and profile/optimizer_steps_impl.hpp
// include it, and including it fills the runtime's hooks (Note [Profile hooks]).
//
// Note [Zero-code profiling]
// With DTRAIN_PROFILE set, a program that uses dtrain is profiled without a line of its own:
//  - init() opens the job's profile, collectively as a Profiler does (Note [Profiler
//    threading]): the ranks exchange their part on dtrain's own communicator before the engine
//    starts, also when no rank profiles, so that a rank profiling alone is an error on every
//    rank. The sampler records the system and the engine's counters once per period.
//  - Every DistributedOptimizer update marks a step (Note [Implicit steps]).
//  - The training thread's waits on handles (Handle::wait and wait_for, and what is built on them:
//    synchronous collectives, DistributedOptimizer::synchronize and step) are the step's
//    communication_wait phase. Inside a phase the program marked, a wait is charged exclusively
//    (Note [Exclusive phase time]): inside its own communication_wait it changes nothing, inside
//    "optimizer" it moves the wait out of the optimizer's time.
//  - shutdown() closes the profile while the engine still runs, so the last sample has the
//    engine's counters and the file ends with its end record.
// What a program marks refines that. A Profiler built while the job's profile is open attaches to
// it rather than open a second file: locally (every rank has the profile, agreed at init), its
// phases and steps go to the job's file, its start() and stop() pause and resume that profile,
// and destroying it leaves the profile open until shutdown(). Its options are the job's, except
// start_recording = false (recording pauses until its start()); a folder other than
// DTRAIN_PROFILE's gets a warning. A Profiler built with no job profile opens its own, as before,
// and receives the waits and updates while it lives.
//
// Note [Implicit steps]
// A program that marks no step still has steps: an implicit step runs from the end of one
// DistributedOptimizer update to the end of the next, on the training thread. An update is a
// step() call that applied the gradients (with backward_passes_per_step = k, every k-th call), so
// an implicit step holds one iteration of the training loop whatever its shape: zero_grad, data,
// forward, backward, the gradient exchange, the update, and whatever else runs between two
// updates (metric averaging, a checkpoint). The training thread is the thread that builds a
// Profiler, or else the first that completes an update; marks and waits of other threads are
// not charged.
// The time before the first update ends is no step but initialization: for the report, from the
// process's start (header process_uptime_ms) to the start of step 0, which is the end of the first
// update. It so includes the first iteration, where first allocations, negotiations and kernel
// compilation happen anyway. The time after the last update is no step either (no update ends
// it): N updates make N - 1 steps, numbered from 0. Implicit steps carry no sample count.
// Explicit steps take precedence: from a program's first Profiler::step() on, updates mark
// nothing; an implicit step under way is dropped, and the program's steps are numbered after the
// implicit ones already recorded, so that no index repeats in a file.
#include <mpi.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "dtrain/comm/mpi_error.hpp"
#include "dtrain/core/config.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/profile/open_recording.hpp"
#include "dtrain/profile/options.hpp"
#include "dtrain/profile/phase.hpp"
#include "dtrain/profile/profiler_state.hpp"
#include "dtrain/runtime/engine/profile_hooks.hpp"
#include "dtrain/runtime/execution/topology.hpp"

namespace dtrain::detail {

struct ActiveProfiles {
  std::mutex mutex;
  std::shared_ptr<ProfilerState> job;  // opened by init() under DTRAIN_PROFILE
  bool job_owned = false;  // false: init() took over a Profiler built before it (one process)
  std::shared_ptr<ProfilerState> active;  // the one waits and updates are charged to
};

inline ActiveProfiles& active_profiles() {
  static ActiveProfiles profiles;
  return profiles;
}

// Caller holds the mutex.
inline void make_active(ActiveProfiles& p, std::shared_ptr<ProfilerState> state) {
  p.active = std::move(state);
  profile_hooks.observe_waits.store(p.active != nullptr, std::memory_order_relaxed);
}

inline std::shared_ptr<ProfilerState> active_profile() noexcept {
  auto& p = active_profiles();
  std::lock_guard lock(p.mutex);
  return p.active;
}

inline std::shared_ptr<ProfilerState> job_profile() {
  auto& p = active_profiles();
  std::lock_guard lock(p.mutex);
  return p.job;
}

// A Profiler that opened its own file receives the waits and updates while it lives.
inline void activate_own_profile(const std::shared_ptr<ProfilerState>& state) {
  auto& p = active_profiles();
  std::lock_guard lock(p.mutex);
  if (!p.job) make_active(p, state);
}

inline void deactivate_own_profile(const ProfilerState* state) noexcept {
  auto& p = active_profiles();
  std::lock_guard lock(p.mutex);
  if (p.job.get() == state && !p.job_owned) p.job.reset();
  if (p.active.get() == state) make_active(p, p.job);
}

// ProfileHooks::open: init() under DTRAIN_PROFILE (Note [Zero-code profiling]).
inline void open_job_recording(const Config& config, MPI_Comm world, const Topology& topology) {
  auto& p = active_profiles();
  {
    std::lock_guard lock(p.mutex);
    if (p.active && topology.size == 1) {  // a Profiler built before init(): it is the profile
      p.job = p.active;
      p.job_owned = false;
      return;
    }
  }
  ProfilerOptions options;
  std::string problem;
  try {
    // The interval is checked even when profiling is off: a bad value fails init() on every rank.
    options = profiler_options_from(config);
  } catch (const InvalidArgumentError& e) {
    problem = e.what();
  }
  ProfilePlace place;
  place.distributed = true;
  place.rank = topology.rank;
  place.size = topology.size;
  place.local_rank = topology.layout.local_rank;
  place.local_size = topology.layout.local_size;
  place.host_id = config.host_id;
  place.allgather = [world, size = topology.size](const std::vector<std::int64_t>& mine) {
    std::vector<std::int64_t> all(mine.size() * static_cast<std::size_t>(size));
    mpi_check(MPI_Allgather(mine.data(), static_cast<int>(mine.size()), MPI_INT64_T, all.data(),
                            static_cast<int>(mine.size()), MPI_INT64_T, world),
              "MPI_Allgather (profile agreement)");
    return all;
  };
  auto state = open_recording(std::move(options), std::move(problem), place);
  if (!state) return;
  std::lock_guard lock(p.mutex);
  p.job = state;
  p.job_owned = true;
  make_active(p, std::move(state));
}

// ProfileHooks::close: shutdown().
inline void close_job_recording() noexcept {
  auto& p = active_profiles();
  std::shared_ptr<ProfilerState> closing;
  {
    std::lock_guard lock(p.mutex);
    if (!p.job || !p.job_owned) {
      p.job.reset();
      return;
    }
    closing = std::move(p.job);
    p.job_owned = false;
    if (p.active == closing) make_active(p, nullptr);
  }
  close_recording(*closing);
}

// ProfileHooks::waited: the training thread's wait, inside a step, is communication wait.
inline void charge_wait(ProfileHooks::Clock::time_point begin,
                        ProfileHooks::Clock::time_point end) noexcept {
  const std::shared_ptr<ProfilerState> s = active_profile();
  if (!s || !s->on_training_thread(false)) return;
  if (!s->recording.load(std::memory_order_relaxed) || !s->times.in_step()) return;
  try {
    s->times.enter(PhaseTimes::slot_of(Phase::communication_wait), begin);
  } catch (...) {  // out of memory for one more open phase: this wait goes uncharged
    return;
  }
  s->times.exit(end);
}

// An update ended on the training thread (Note [Implicit steps]).
inline void mark_implicit_step(ProfilerState& s) noexcept {
  if (s.explicit_steps) return;
  const auto now = ProfilerState::Clock::now();
  try {
    if (!s.recording.load(std::memory_order_relaxed)) {
      if (s.times.in_step()) (void)s.times.end_step(now);  // paused: not recorded
      return;
    }
    const std::optional<EngineStats> engine = engine_snapshot();
    if (s.times.in_step())
      record_step(s, s.times.end_step(now), now, s.next_implicit_step++, 0, engine);
    s.engine_at_step_start = engine;
    s.times.begin_step(now);
  } catch (...) {  // out of memory: lose this step, never throw from an optimizer's step()
  }
}

inline bool install_profile_hooks() noexcept {
  profile_hooks.open = &open_job_recording;
  profile_hooks.close = &close_job_recording;
  profile_hooks.waited = &charge_wait;
  return true;
}

// Fills the runtime's hooks wherever this header is part of the program (Note [Profile hooks]).
inline const bool profile_hooks_installed = install_profile_hooks();

}  // namespace dtrain::detail
