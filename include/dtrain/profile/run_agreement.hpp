#pragma once
// What the ranks agree on when a profile opens (Note [Profiler threading]): whether profiling is
// on everywhere, whether every rank could prepare its folder, the run's identity and that every
// rank belongs to the same dtrainrun job and attempt (Note [Profile layout]). The exchange
// itself is the caller's: an allgather through the engine for a Profiler, MPI during init().
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dtrain/core/error.hpp"

namespace dtrain::detail {

struct RunAgreement {
  std::string run_id;  // rank 0's start time and process id: the same in every rank's file
  std::vector<int> on_ranks, off_ranks, failed_ranks;
  // Ranks whose dtrainrun job or attempt (Note [Profile layout]) is not rank 0's.
  std::vector<int> other_job_ranks;

  // Throws on every rank alike when the ranks disagree or one of them failed. `own_job` says
  // this rank's job and attempt.
  void throw_if_inconsistent(const std::string& dir, const std::string& own_job = "") const {
    if (!failed_ranks.empty())
      throw InvalidArgumentError(fmt::format(
          "dtrain: the profiler could not start on rank(s) {} (their error says why), so no rank "
          "profiles; the profile folder was '{}'",
          fmt::join(failed_ranks, ", "), dir));
    if (!on_ranks.empty() && !off_ranks.empty())
      throw InvalidArgumentError(fmt::format(
          "dtrain: the profiler is on for rank(s) {} but off for rank(s) {}: set DTRAIN_PROFILE "
          "(or ProfilerOptions::dir) for every rank, or for none",
          fmt::join(on_ranks, ", "), fmt::join(off_ranks, ", ")));
    if (!on_ranks.empty() && !other_job_ranks.empty())
      throw InvalidArgumentError(fmt::format(
          "dtrain: rank(s) {} have another DTRAINRUN_JOB_ID or DTRAINRUN_ATTEMPT than rank 0, so "
          "the ranks would profile into different folders; this rank has {}. Start every rank "
          "with one dtrainrun, or set neither variable outside dtrainrun",
          fmt::join(other_job_ranks, ", "), own_job));
  }
};

inline std::int64_t profiler_agreement_count() {
  static std::int64_t count = 0;
  return count++;
}

inline constexpr std::size_t run_agreement_width = 5;

// What this rank contributes to the agreement: whether it profiles, whether it could, the time
// and its process id (the run id, from rank 0's), and its job's fingerprint (job_fingerprint).
inline std::vector<std::int64_t> run_agreement_contribution(bool on, bool ok,
                                                            std::int64_t job = 0) {
  const std::int64_t now_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                                  std::chrono::system_clock::now().time_since_epoch())
                                  .count();
  return {on ? 1 : 0, ok ? 1 : 0, now_ns, static_cast<std::int64_t>(getpid()), job};
}

// The agreement from every rank's contribution, in rank order.
inline RunAgreement run_agreement_from(const std::vector<std::int64_t>& all, int rank) {
  RunAgreement a;
  const std::size_t w = run_agreement_width;
  for (int r = 0; r < static_cast<int>(all.size() / w); ++r) {
    const std::int64_t* v = &all[static_cast<std::size_t>(r) * w];
    (v[0] ? a.on_ranks : a.off_ranks).push_back(r);
    if (!v[1] && r != rank) a.failed_ranks.push_back(r);
    if (v[4] != all.at(4)) a.other_job_ranks.push_back(r);
  }
  a.run_id = fmt::format("{:x}-{:x}", all.at(2), all.at(3));
  return a;
}

}  // namespace dtrain::detail
