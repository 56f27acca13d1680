#pragma once
// Opening a profile: checking its options, creating its folder, agreeing with the other ranks on
// the run (Note [Profiler threading]), creating the run's folder and file (Note [Profile layout]),
// writing the header and starting the sampler. One path for both openers: init() under
// DTRAIN_PROFILE and a Profiler built with no profile open. Internal.
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "dtrain/core/env.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/logging.hpp"
#include "dtrain/core/version.hpp"
#include "dtrain/profile/options.hpp"
#include "dtrain/profile/proc_stats.hpp"
#include "dtrain/profile/profiler_state.hpp"
#include "dtrain/profile/run_agreement.hpp"
#include "dtrain/profile/run_folder.hpp"

namespace dtrain::detail {

// This process's place in the job, and how its ranks exchange their part of the agreement.
struct ProfilePlace {
  bool distributed = false;  // dtrain runs (or is starting): the ranks agree
  int rank = 0, size = 1, local_rank = 0, local_size = 1;
  std::string host_id;  // Config::host_id; empty: the host name
  // Every rank's integers, in rank order. Collective; called on every rank alike: once also when
  // profiling is off everywhere, so that a rank that is on alone is found, and once more when it
  // is on, to agree that every rank created its file.
  std::function<std::vector<std::int64_t>(const std::vector<std::int64_t>&)> allgather;
};

// The open profile, or nullptr when profiling is off on every rank. `problem` is one found while
// reading the options. Throws InvalidArgumentError on every rank alike when any rank has a
// problem or the ranks disagree on whether to profile.
inline std::shared_ptr<ProfilerState> open_recording(ProfilerOptions options, std::string problem,
                                                     const ProfilePlace& place) {
  if (problem.empty()) {
    try {
      options.validate();
    } catch (const InvalidArgumentError& e) {
      problem = e.what();
    }
  }
  auto state = std::make_shared<ProfilerState>();
  const bool on = !options.dir.empty();
  if (on && problem.empty() && !place.distributed)
    if (const int n = launched_world_size(); n > 1)
      problem = fmt::format(
          "dtrain: a Profiler was built before dtrain::init() in a job of {} processes: each "
          "would write the same file. Build it after dtrain::init() (or a dtrain::Session), so "
          "that every rank writes its own",
          n);
  DtrainrunJob job;
  if (on && problem.empty()) problem = read_dtrainrun_job(ProcessEnv(), job);
  if (on && problem.empty()) problem = prepare_profile_dir(options.dir);
  const bool together = place.distributed && place.size > 1;
  // Every rank learns every rank's outcome before anyone throws, so no rank waits forever.
  const std::vector<std::int64_t> mine =
      run_agreement_contribution(on, problem.empty(), job_fingerprint(job));
  const RunAgreement agreed = run_agreement_from(together ? place.allgather(mine) : mine,
                                                 place.rank);
  if (!problem.empty()) throw InvalidArgumentError(problem);
  agreed.throw_if_inconsistent(
      options.dir, job.under_dtrainrun()
                       ? fmt::format("{}=\"{}\" and {}={}", job_id_variable, job.job_id,
                                     attempt_variable, job.attempt)
                       : fmt::format("neither {} nor {}", job_id_variable, attempt_variable));
  if (!on) return nullptr;

  // The run's own folder (Note [Profile layout]), known only now that the ranks agreed on the run.
  const std::filesystem::path folder = std::filesystem::path(options.dir) /
                                       run_subfolder(agreed.run_id, job, profiles_opened_in(job));
  const std::filesystem::path file = folder / profile_file_name(place.rank);
  {
    std::error_code ec;
    std::filesystem::create_directories(folder, ec);
    if (ec)
      problem = fmt::format(
          "dtrain: cannot create the run's profile folder '{}': {}; set DTRAIN_PROFILE (or "
          "ProfilerOptions::dir) to a folder this process can write",
          folder.string(), ec.message());
  }
  if (problem.empty()) {
    try {
      state->writer = std::make_unique<RecordWriter>(file.string(), /*exclusive=*/true);
    } catch (const InvalidArgumentError& e) {
      problem = e.what();
    }
  }
  const std::vector<std::int64_t> opened = run_agreement_contribution(true, problem.empty());
  const RunAgreement created = run_agreement_from(together ? place.allgather(opened) : opened,
                                                  place.rank);
  if (!problem.empty()) throw InvalidArgumentError(problem);
  if (!created.failed_ranks.empty()) {
    // No run without all its ranks: this rank's empty file goes too.
    state->writer.reset();
    std::error_code ec;
    std::filesystem::remove(file, ec);
    std::filesystem::remove(folder, ec);  // only when empty: other ranks' files stay theirs
    created.throw_if_inconsistent(options.dir);
  }
  ++profiles_opened_in(job);

  state->options = std::move(options);
  state->origin = ProfilerState::Clock::now();
  const std::optional<double> uptime = process_uptime_seconds();
  state->nvml = Nvml::open(state->options.nvml_library, state->options.gpu_index,
                           place.local_rank);
  HeaderRecord h;
  h.run_id = agreed.run_id;
  h.job_id = job.job_id;
  if (job.under_dtrainrun()) h.attempt = job.attempt;
  h.rank = place.rank;
  h.size = place.size;
  h.local_rank = place.local_rank;
  h.local_size = place.local_size;
  h.host = host_label(place.host_id);
  h.pid = static_cast<long>(getpid());
  h.cpu_count = sysconf(_SC_NPROCESSORS_ONLN);
  h.affinity_cpus = affinity_cpu_count();
  h.sample_interval_ms = static_cast<double>(state->options.sample_interval.count());
  h.start_unix_ms = std::chrono::duration<double, std::milli>(
                        std::chrono::system_clock::now().time_since_epoch())
                        .count();
  if (uptime) h.process_uptime_ms = *uptime * 1e3;
  h.dtrain_version = dtrain::version();
  h.gpu_available = state->nvml.available();
  h.gpu_reason = state->nvml.reason();
  h.gpu_index = state->nvml.index();
  h.gpu_name = state->nvml.name();
  h.gpu_memory_total_bytes = state->nvml.memory_total_bytes();
  state->writer->push(std::move(h));
  // On disk before training starts: a job killed at any point leaves a file that says whose it
  // is, never an empty one.
  state->writer->flush();
  state->sampler = std::make_unique<SystemSampler>(*state->writer, state->nvml,
                                                   state->options.sample_interval, state->origin);
  if (place.rank == 0)
    log(LogLevel::info, "profiling {} rank(s) into {}; report: dtrain-report {} -o report.html",
        place.size, folder.string(), state->options.dir);
  if (state->options.start_recording) start_recording(*state, 0);
  return state;
}

}  // namespace dtrain::detail
