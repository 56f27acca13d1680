#pragma once
// What the ranks agree on when their Profilers are built (Note [Profiler threading]): whether
// profiling is on everywhere, whether every rank could open its file, and the run's identity.
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dtrain/runtime/collectives.hpp"
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

// Collective when `distributed`: one allgather of four integers per rank.
inline RunAgreement agree_on_run(bool on, bool ok, bool distributed, int rank, int size) {
  const std::int64_t now_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                                  std::chrono::system_clock::now().time_since_epoch())
                                  .count();
  std::vector<std::int64_t> mine = {on ? 1 : 0, ok ? 1 : 0, now_ns, static_cast<std::int64_t>(getpid())};
  std::vector<std::int64_t> all = mine;
  if (distributed && size > 1)
    all = dtrain::allgather(mine, fmt::format("dtrain.profiler.{}", profiler_agreement_count()));
  RunAgreement a;
  for (int r = 0; r < static_cast<int>(all.size() / 4); ++r) {
    const std::int64_t* v = &all[static_cast<std::size_t>(r) * 4];
    (v[0] ? a.on_ranks : a.off_ranks).push_back(r);
    if (!v[1] && r != rank) a.failed_ranks.push_back(r);
  }
  a.run_id = fmt::format("{:x}-{:x}", all[2], all[3]);
  return a;
}

}  // namespace dtrain::detail
