#pragma once
// What a recording profiler owns, and the helpers that set it up. Internal: the public surface is
// profile/profiler.hpp; its definitions (profile/profiler_impl.hpp) and the runtime use this.
#include <sched.h>
#include <unistd.h>

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <system_error>

#include <fmt/format.h>

#include "dtrain/profile/nvml.hpp"
#include "dtrain/profile/options.hpp"
#include "dtrain/profile/phase_times.hpp"
#include "dtrain/profile/record_writer.hpp"
#include "dtrain/profile/records.hpp"
#include "dtrain/profile/system_sampler.hpp"
#include "dtrain/runtime/engine_stats.hpp"
#include "dtrain/runtime/session.hpp"

namespace dtrain::detail {

// Everything a recording profiler owns. Scopes point here, so a Profiler can be moved while
// they are open.
struct ProfilerState {
  using Clock = std::chrono::steady_clock;

  ProfilerOptions options;
  std::unique_ptr<RecordWriter> writer;
  Nvml nvml;
  std::unique_ptr<SystemSampler> sampler;
  PhaseTimes times;
  Clock::time_point origin;
  bool recording = false;
  std::int64_t recorded_steps = 0;
  std::int64_t phases_outside_steps = 0;
  std::optional<EngineStats> engine_at_step_start;

  double seconds_since_origin(Clock::time_point t) const {
    return std::chrono::duration<double>(t - origin).count();
  }
  double now_seconds() const { return seconds_since_origin(Clock::now()); }

  // The engine's counters now, or nothing when dtrain is not running.
  static std::optional<EngineStats> engine_snapshot() {
    if (!dtrain::is_initialized()) return std::nullopt;
    try {
      return dtrain::engine_stats();
    } catch (const NotInitializedError&) {  // shut down since the check
      return std::nullopt;
    }
  }
};

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

inline std::string host_label(const std::string& host_id) {
  if (!host_id.empty()) return host_id;
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "localhost";
  return buf;
}

}  // namespace dtrain::detail
