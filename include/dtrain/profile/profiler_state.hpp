#pragma once
// What a recording profile owns, how it starts, stops, closes and records a step, and the helpers
// that set it up. Internal: the public surface is profile/profiler.hpp; its definitions
// (profile/profiler_impl.hpp) and the runtime's profile (profile/active_profile.hpp) use this.
#include <sched.h>
#include <unistd.h>

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <thread>

#include <fmt/format.h>

#include "dtrain/core/host_name.hpp"
#include "dtrain/profile/nvml.hpp"
#include "dtrain/profile/options.hpp"
#include "dtrain/profile/phase_times.hpp"
#include "dtrain/profile/record_writer.hpp"
#include "dtrain/profile/records.hpp"
#include "dtrain/profile/system_sampler.hpp"
#include "dtrain/runtime/engine_stats.hpp"
#include "dtrain/runtime/session.hpp"

namespace dtrain::detail {

// Everything a recording profile owns: the runtime's (Note [Zero-code profiling]) or a Profiler's.
// Scopes point here, so a Profiler can be moved while they are open; the runtime and a Profiler
// that attaches to its profile share it.
struct ProfilerState {
  using Clock = std::chrono::steady_clock;

  ProfilerOptions options;
  std::unique_ptr<RecordWriter> writer;
  Nvml nvml;
  std::unique_ptr<SystemSampler> sampler;
  PhaseTimes times;
  Clock::time_point origin;
  // Read on every phase; written by start/stop on the training thread and by close, which
  // shutdown() may call from another thread.
  std::atomic<bool> recording{false};
  bool closed = false;
  std::int64_t recorded_steps = 0;
  std::int64_t phases_outside_steps = 0;
  std::optional<EngineStats> engine_at_step_start;
  // Note [Implicit steps]: the thread whose steps, waits and updates count (unset until one
  // does), whether a program marked a step itself, and the index of the next implicit step.
  std::atomic<std::thread::id> training_thread{};
  bool explicit_steps = false;
  std::int64_t next_implicit_step = 0;
  std::int64_t explicit_step_offset = 0;  // implicit steps recorded before the first explicit one

  double seconds_since_origin(Clock::time_point t) const {
    return std::chrono::duration<double>(t - origin).count();
  }
  double now_seconds() const { return seconds_since_origin(Clock::now()); }

  // Whether the calling thread is the training thread; the first thread to ask with `claim`
  // becomes it.
  bool on_training_thread(bool claim) noexcept {
    const std::thread::id me = std::this_thread::get_id();
    std::thread::id owner = training_thread.load(std::memory_order_relaxed);
    if (owner == std::thread::id() && claim &&
        training_thread.compare_exchange_strong(owner, me, std::memory_order_relaxed))
      return true;
    return owner == me;
  }
};

// Begins (or resumes) recording; `next_step` is the index the next step will have.
inline void start_recording(ProfilerState& s, std::int64_t next_step) {
  if (s.closed || s.recording) return;
  s.writer->push(MarkRecord{MarkRecord::Kind::start, s.now_seconds(), next_step, 0});
  s.sampler->start();
  s.recording = true;
}

inline void stop_recording(ProfilerState& s) {
  if (!s.recording) return;
  s.recording = false;
  s.sampler->stop();
  s.writer->push(MarkRecord{MarkRecord::Kind::stop, s.now_seconds(), s.recorded_steps,
                            s.phases_outside_steps});
}

// Stops recording and closes the file, writing what is queued. A step still open is not
// recorded. Idempotent; never throws.
inline void close_recording(ProfilerState& s) noexcept {
  if (s.closed) return;
  s.closed = true;
  try {
    stop_recording(s);
    s.writer->push(MarkRecord{MarkRecord::Kind::end, s.now_seconds(), s.recorded_steps, 0});
  } catch (...) {  // allocation failure while stopping: the file still ends on whole lines
  }
  s.sampler.reset();
  s.writer->close();
}

// Records the step that ended at `end` (`times` accounts for it), with the engine's activity
// since its start.
inline void record_step(ProfilerState& s, PhaseTimes::Step&& times,
                        ProfilerState::Clock::time_point end, std::int64_t index,
                        std::int64_t samples, const std::optional<EngineStats>& engine_at_end) {
  StepRecord r;
  r.step = index;
  r.t = s.seconds_since_origin(end - times.total);
  r.duration = times.total;
  r.other = times.other;
  r.phases = std::move(times.phases);
  r.samples = samples;
  if (s.engine_at_step_start && engine_at_end)
    r.engine = engine_stats_delta(*engine_at_end, *s.engine_at_step_start);
  s.writer->push(std::move(r));
  ++s.recorded_steps;
}

inline std::string profile_file_name(int rank) { return fmt::format("rank-{}.jsonl", rank); }

// Creates the folder if needed; returns a problem, or an empty string.
inline std::string prepare_profile_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path p(dir);
  if (fs::exists(p, ec) && !fs::is_directory(p, ec))
    return fmt::format(
        "dtrain: the profile folder '{}' (DTRAIN_PROFILE or ProfilerOptions::dir) exists and is "
        "not a folder; name a folder, or a path where one can be created",
        dir);
  fs::create_directories(p, ec);
  if (ec)
    return fmt::format(
        "dtrain: cannot create the profile folder '{}' (DTRAIN_PROFILE or ProfilerOptions::dir): "
        "{}; name a folder this process can write",
        dir, ec.message());
  return {};
}

// The number of processes this one was launched with when dtrain is not initialized: from MPI if
// it is running, else from the launcher's environment (MPICH's PMI_SIZE, Open MPI's
// OMPI_COMM_WORLD_SIZE); 1 when nothing says otherwise.
inline int launched_world_size() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) {
    int n = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    return n;
  }
  for (const char* var : {"PMI_SIZE", "OMPI_COMM_WORLD_SIZE"})
    if (const char* v = std::getenv(var)) return std::max(1, std::atoi(v));
  return 1;
}

inline long affinity_cpu_count() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return 0;
  return CPU_COUNT(&set);
}


}  // namespace dtrain::detail
