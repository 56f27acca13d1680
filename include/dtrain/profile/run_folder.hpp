#pragma once
// Where a run's profile files go inside the profile folder, and the dtrainrun job and attempt a
// run belongs to (Note [Profile layout]). Internal: profile/open_recording.hpp uses it.
//
// Note [Profile layout]
// Several runs may share one profile folder: two jobs started with the same DTRAIN_PROFILE, or the
// attempts of one job that dtrainrun started again after a failure or a resize. Each run writes
// into a folder of its own, so that no run overwrites or interleaves another's files:
//   <folder>/<run-id>/rank-<r>.jsonl               started without dtrainrun
//   <folder>/<job-id>/attempt-<n>/rank-<r>.jsonl   started by dtrainrun
// The run id is rank 0's start time and process id in hex, agreed by every rank (Note [Profiler
// threading]), so run folders sort by start time. dtrainrun gives every rank DTRAINRUN_JOB_ID,
// the same for every attempt of one invocation, and DTRAINRUN_ATTEMPT: 0 for the first world, one
// more for each relaunch (a --restarts restart, an elastic restart or resize). A job's attempts
// so sit side by side, and the attempt that crashed keeps its files when the next one starts.
// A process that opens a second profile in one attempt (Profilers built one after another)
// writes attempt-<n>.<k>, k counting from 1; every rank opens its profiles in the same order
// (opening is collective), so every rank counts alike.
// Files are created exclusively: one that exists already belongs to another run (a job given
// another's DTRAINRUN_JOB_ID by hand) and is an error on every rank, never overwritten. The header
// carries job_id and attempt, so dtrain-report groups a job's attempts wherever the files moved;
// it also reads the layout before this one, rank files directly in the folder.
#include <algorithm>
#include <charconv>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "dtrain/core/dtrainrun_job.hpp"
#include "dtrain/core/env.hpp"
#include "dtrain/core/fnv1a.hpp"

namespace dtrain::detail {

// The job's identity as one integer the ranks can compare in the agreement (FNV-1a, 64 bits);
// 0 outside dtrainrun.
inline std::int64_t job_fingerprint(const DtrainrunJob& job) {
  if (!job.under_dtrainrun()) return 0;
  const std::uint64_t h = fnv1a(fmt::format("{}\n{}", job.job_id, job.attempt));
  return static_cast<std::int64_t>(h | 1);  // never 0
}

// The run's folder relative to the profile folder. `sequence`: how many profiles this process
// opened before this one.
inline std::filesystem::path run_subfolder(const std::string& run_id, const DtrainrunJob& job,
                                           std::int64_t sequence) {
  if (!job.under_dtrainrun()) return run_id;
  const std::string attempt = sequence > 0 ? fmt::format("attempt-{}.{}", job.attempt, sequence)
                                           : fmt::format("attempt-{}", job.attempt);
  return std::filesystem::path(job.job_id) / attempt;
}

// How many profiles this process opened so far in the job and attempt of `job`: the `sequence`
// of the next one. Counts only profiles that opened on every rank.
inline std::int64_t& profiles_opened_in(const DtrainrunJob& job) {
  static std::map<std::int64_t, std::int64_t> counts;  // by job_fingerprint
  return counts[job_fingerprint(job)];
}

}  // namespace dtrain::detail
