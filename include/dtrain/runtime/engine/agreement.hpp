#pragma once
// Note [Agreed settings]
// Some settings decide which MPI calls a rank makes: the chunk size cuts large messages into
// pieces, hierarchical allreduce replaces one call with three on other communicators, the NCCL
// stream count picks communicators, and whether fused responses reduce large tensors in their own
// memory (Note [Direct segments]) depends on the cores each process may use. Ranks that decide
// these differently make different calls, and the job aborts on "Message truncated", hangs, or
// silently mixes up data. So init() gathers every rank's view once: a setting given differently on
// some ranks is an error on every rank that names the variable, the values and the ranks; a verdict
// derived from local facts (cores) becomes one verdict for all (reduce in place only if every rank
// can). Settings that only rank 0 reads, because it negotiates (fusion threshold, cycle time,
// response cache, stall checks) take rank 0's value; so do the deadlines every rank's watchdog
// enforces (the op timeout, the peer timeout), which init() hands from rank 0 to every rank, so a
// job has one deadline whatever each rank's environment said. A rank that set another value gets a
// warning, since its value is ignored.
#include <mpi.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dtrain/comm/gather_text.hpp"
#include "dtrain/comm/mpi_error.hpp"
#include "dtrain/core/config.hpp"
#include "dtrain/core/config_knobs.hpp"

namespace dtrain::detail {

// Settings every rank must give identically (Note [Agreed settings]).
inline constexpr std::string_view kSettingsAllMustShare[] = {
    "MPI_CHUNK_BYTES", "HIERARCHICAL_ALLREDUCE", "NUM_NCCL_STREAMS",
    "MPI_NONBLOCKING",  // MPI never matches a blocking collective with a nonblocking one
    "CPU_OPERATIONS"};  // one library carries every rank's host tensors
// Settings only the coordinator (rank 0) uses.
inline constexpr std::string_view kSettingsOfRankZero[] = {
    "FUSION_THRESHOLD", "CYCLE_TIME", "CACHE_CAPACITY", "STALL_CHECK_DISABLE",
    "STALL_CHECK_TIME_SECONDS", "STALL_SHUTDOWN_TIME_SECONDS", "OP_TIMEOUT_SECONDS",
    "PEER_TIMEOUT_SECONDS"};

// What every rank decided together.
struct AgreedSettings {
  bool direct_segments = false;  // Note [Direct segments]
  // Rank 0's deadlines, which every rank's watchdog enforces.
  double op_timeout_seconds = 0;
  double peer_timeout_seconds = 0;
  std::string error;             // non-empty: ranks disagree; init must fail on every rank
  std::vector<std::string> warnings;
};

namespace agreement {

inline std::string describe(const Config& config, bool direct_segments_pay) {
  std::string out;
  auto add = [&](std::string_view key, const std::string& value) {
    out += fmt::format("{}={}\n", key, value);
  };
  for_each_knob([&](const auto& knob) {
    const auto in = [&](const auto& list) {
      return std::find(std::begin(list), std::end(list), knob.suffix) != std::end(list);
    };
    if (in(kSettingsAllMustShare) || in(kSettingsOfRankZero))
      add(knob.suffix, format_value(config.*knob.member));
  });
  add("direct_segments", direct_segments_pay ? "1" : "0");
  return out;
}

inline std::map<std::string, std::string> parse(std::string_view text) {
  std::map<std::string, std::string> out;
  while (!text.empty()) {
    const auto end = text.find('\n');
    const std::string_view line = text.substr(0, end);
    const auto eq = line.find('=');
    if (eq != std::string_view::npos)
      out.emplace(std::string(line.substr(0, eq)), std::string(line.substr(eq + 1)));
    if (end == std::string_view::npos) break;
    text.remove_prefix(end + 1);
  }
  return out;
}

inline std::string values_by_rank(const std::vector<std::map<std::string, std::string>>& views,
                                  const std::string& key) {
  std::map<std::string, std::vector<int>> by_value;
  for (std::size_t r = 0; r < views.size(); ++r) {
    auto it = views[r].find(key);
    by_value[it == views[r].end() ? std::string("(unknown)") : it->second].push_back(static_cast<int>(r));
  }
  std::string out;
  for (const auto& [value, ranks] : by_value)
    out += fmt::format("{}{} on ranks [{}]", out.empty() ? "" : "; ", value, fmt::join(ranks, ", "));
  return out;
}

}  // namespace agreement

// Collective over `comm`. `direct_segments_pay`: this process has a core of its own.
inline AgreedSettings agree_on_settings(const Config& config, bool direct_segments_pay,
                                        MPI_Comm comm) {
  std::vector<std::map<std::string, std::string>> views;
  for (const std::string& text :
       allgather_text(agreement::describe(config, direct_segments_pay), comm))
    views.push_back(agreement::parse(text));

  AgreedSettings out;
  // describe() wrote the shortest text that reads back as the same double.
  const auto rank_zero_seconds = [&](const std::string& key, double fallback) {
    auto it = views.front().find(key);
    return it == views.front().end() ? fallback : std::strtod(it->second.c_str(), nullptr);
  };
  out.op_timeout_seconds = rank_zero_seconds("OP_TIMEOUT_SECONDS", config.op_timeout_seconds);
  out.peer_timeout_seconds = rank_zero_seconds("PEER_TIMEOUT_SECONDS", config.peer_timeout_seconds);
  out.direct_segments = std::all_of(views.begin(), views.end(), [](const auto& v) {
    auto it = v.find("direct_segments");
    return it != v.end() && it->second == "1";
  });
  auto differs = [&](std::string_view key) {
    const std::string k(key);
    return std::any_of(views.begin(), views.end(), [&](const auto& v) {
      auto a = v.find(k), b = views.front().find(k);
      return (a == v.end()) != (b == views.front().end()) || (a != v.end() && a->second != b->second);
    });
  };
  std::vector<std::string> problems;
  for (std::string_view key : kSettingsAllMustShare)
    if (differs(key))
      problems.push_back(fmt::format("{}{}: {}", env_prefix, key,
                                     agreement::values_by_rank(views, std::string(key))));
  if (!problems.empty()) {
    out.error = fmt::format(
        "dtrain::init(): ranks disagree on settings that decide which MPI calls they make:\n  {}\n"
        "Every rank must use the same value: set it the same way in every rank's environment "
        "(dtrainrun forwards DTRAIN_* variables to every rank) or in the Config passed to init().",
        fmt::join(problems, "\n  "));
  }
  for (std::string_view key : kSettingsOfRankZero)
    if (differs(key))
      out.warnings.push_back(fmt::format(
          "dtrain: {}{} differs across ranks ({}); rank 0's value applies to the whole job "
          "and the others are ignored",
          env_prefix, key, agreement::values_by_rank(views, std::string(key))));
  return out;
}

// Rank 0's setup error (empty: none), as every rank learns it: a failure of rank 0 alone (an
// unwritable DTRAIN_TIMELINE path) must fail init() on every rank.
inline std::string agree_on_setup(std::string error, MPI_Comm comm) {
  std::uint64_t n = error.size();
  mpi_check(MPI_Bcast(&n, 1, MPI_UINT64_T, 0, comm), "MPI_Bcast");
  error.resize(n);
  if (n > 0)
    mpi_check(MPI_Bcast(error.data(), static_cast<int>(n), MPI_CHAR, 0, comm), "MPI_Bcast");
  return error;
}

// Every rank's own failure (empty: none), gathered: empty when no rank failed, otherwise one
// message naming the ranks that failed and each distinct cause, the same on every rank.
inline std::string agree_on_failures(const std::string& mine, MPI_Comm comm) {
  const std::vector<std::string> all = allgather_text(mine, comm);
  std::map<std::string, std::vector<int>> ranks_of;
  for (std::size_t r = 0; r < all.size(); ++r)
    if (!all[r].empty()) ranks_of[all[r]].push_back(static_cast<int>(r));
  std::string out;
  for (const auto& [why, ranks] : ranks_of)
    out += fmt::format("{}rank{} {}: {}", out.empty() ? "" : "; ", ranks.size() > 1 ? "s" : "",
                       fmt::join(ranks, ", "), why);
  return out;
}

}  // namespace dtrain::detail
