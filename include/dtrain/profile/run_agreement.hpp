#pragma once
// What the ranks agree on when a profile opens (Note [Profiler threading]): whether profiling is
// on everywhere, whether every rank could open its file, and the run's identity. The exchange
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

  // Throws on every rank alike when the ranks disagree or one of them failed.
  void throw_if_inconsistent(const std::string& dir) const {
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
  }
};

inline std::int64_t profiler_agreement_count() {
  static std::int64_t count = 0;
  return count++;
}

// What this rank contributes to the agreement: four integers.
inline std::vector<std::int64_t> run_agreement_contribution(bool on, bool ok) {
  const std::int64_t now_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                                  std::chrono::system_clock::now().time_since_epoch())
                                  .count();
  return {on ? 1 : 0, ok ? 1 : 0, now_ns, static_cast<std::int64_t>(getpid())};
}

// The agreement from every rank's contribution, in rank order.
inline RunAgreement run_agreement_from(const std::vector<std::int64_t>& all, int rank) {
  RunAgreement a;
  for (int r = 0; r < static_cast<int>(all.size() / 4); ++r) {
    const std::int64_t* v = &all[static_cast<std::size_t>(r) * 4];
    (v[0] ? a.on_ranks : a.off_ranks).push_back(r);
    if (!v[1] && r != rank) a.failed_ranks.push_back(r);
  }
  a.run_id = fmt::format("{:x}-{:x}", all.at(2), all.at(3));
  return a;
}

}  // namespace dtrain::detail
