#pragma once
// What the profiler records and where: ProfilerOptions, filled from the Config (DTRAIN_PROFILE,
// DTRAIN_PROFILE_INTERVAL_MS) or in code.
#include <chrono>
#include <cmath>
#include <string>

#include <fmt/format.h>

#include "dtrain/core/config.hpp"
#include "dtrain/core/error.hpp"

namespace dtrain {

struct ProfilerOptions {
  // Folder for the profiles, created if missing: each run writes its per-rank files
  // (rank-<r>.jsonl) into a folder of its own there, <run-id>/ or, under dtrainrun,
  // <job-id>/attempt-<n>/ (Note [Profile layout]). Empty: profiling is off and every profiler
  // call costs a branch.
  std::string dir;
  // How often the sampler thread reads CPU, memory, network, disk and GPU counters.
  std::chrono::milliseconds sample_interval{500};
  // Record from construction. Otherwise recording begins at Profiler::start(), so a program can
  // profile a chosen range of steps (after warm-up, say).
  bool start_recording = true;
  // The GPU this rank uses, as an NVML device index; -1: local_rank modulo the device count (one
  // GPU per local rank, as dtrain::cuda::set_device_from_local_rank() arranges).
  int gpu_index = -1;
  // Where NVML is loaded from at run time. A missing library only leaves GPU metrics out.
  std::string nvml_library = "libnvidia-ml.so.1";

  // Throws InvalidArgumentError naming the field, its value and what is accepted.
  void validate() const;
};

inline constexpr std::chrono::milliseconds min_profile_interval{100};
inline constexpr std::chrono::milliseconds max_profile_interval{60000};

namespace detail {
// `subject` names where the value came from, for the error message.
inline void check_profile_interval(double ms, std::string_view subject) {
  if (!(std::isfinite(ms) && ms >= static_cast<double>(min_profile_interval.count()) &&
        ms <= static_cast<double>(max_profile_interval.count())))
    throw InvalidArgumentError(fmt::format(
        "dtrain: {} = {} is out of range: the profiler samples every 100 to 60000 milliseconds "
        "(shorter periods would cost the training job CPU, longer ones miss whole phases of a "
        "run); e.g. 500",
        subject, ms));
}
}  // namespace detail

inline void ProfilerOptions::validate() const {
  detail::check_profile_interval(static_cast<double>(sample_interval.count()),
                                 "ProfilerOptions::sample_interval (milliseconds)");
  if (gpu_index < -1)
    throw InvalidArgumentError(fmt::format(
        "dtrain: ProfilerOptions::gpu_index = {}: expected an NVML device index, or -1 to use "
        "local_rank modulo the device count",
        gpu_index));
}

// DTRAIN_PROFILE / DTRAIN_PROFILE_INTERVAL_MS as read into a Config. The interval is checked
// here even when profiling is off, so a bad value is reported before anyone relies on it.
inline ProfilerOptions profiler_options_from(const Config& config) {
  detail::check_profile_interval(config.profile_interval_ms,
                                 "DTRAIN_PROFILE_INTERVAL_MS (Config::profile_interval_ms)");
  ProfilerOptions o;
  o.dir = config.profile_dir;
  o.sample_interval = std::chrono::milliseconds(std::llround(config.profile_interval_ms));
  return o;
}

}  // namespace dtrain
