#pragma once
// The dtrainrun job a process belongs to: DTRAINRUN_JOB_ID and DTRAINRUN_ATTEMPT, which dtrainrun
// gives every rank (Note [Job identity] in tools/dtrain_launcher/mpi.py). Read here, once, for
// everything that names its files after the job (the profile's run folders, elastic commits).
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "dtrain/core/env.hpp"

namespace dtrain::detail {

inline constexpr std::string_view job_id_variable = "DTRAINRUN_JOB_ID";
inline constexpr std::string_view attempt_variable = "DTRAINRUN_ATTEMPT";

// job_id empty: not started by dtrainrun.
struct DtrainrunJob {
  std::string job_id;
  std::int64_t attempt = -1;

  bool under_dtrainrun() const { return !job_id.empty(); }
};

// A job id names a folder: one path component of letters, digits, '.', '_' and '-', not hidden.
inline bool valid_job_id(std::string_view id) {
  if (id.empty() || id.size() > 128 || id.front() == '.') return false;
  for (const char c : id) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

// Reads DTRAINRUN_JOB_ID and DTRAINRUN_ATTEMPT into `job`; returns a problem, or an empty string.
inline std::string read_dtrainrun_job(const EnvSource& env, DtrainrunJob& job) {
  const auto id = env.get(std::string(job_id_variable));
  const auto attempt = env.get(std::string(attempt_variable));
  job = {};
  if (!id && !attempt) return {};
  const std::string fix =
      fmt::format("dtrainrun sets both {} and {} for every rank; outside dtrainrun set neither",
                  job_id_variable, attempt_variable);
  if (!id || !attempt)
    return fmt::format("dtrain: {} is set but {} is not; {}",
                       id ? job_id_variable : attempt_variable,
                       id ? attempt_variable : job_id_variable, fix);
  if (!valid_job_id(*id))
    return fmt::format(
        "dtrain: {}=\"{}\" cannot name the job's folders: expected 1 to 128 letters, digits, "
        "'.', '_' or '-', not starting with '.'; {}",
        job_id_variable, *id, fix);
  const std::optional<std::int64_t> n = parse_count_text(*attempt);
  if (!n)
    return fmt::format("dtrain: {}=\"{}\" is not an attempt number: expected 0 (the first world) "
                       "or more; {}",
                       attempt_variable, *attempt, fix);
  job.job_id = *id;
  job.attempt = *n;
  return {};
}

}  // namespace dtrain::detail
