#pragma once
// Note [Knob table]: every setting of Config named once, with its variable, its range and its
// help text; parsing the environment, validating a Config, comparing two and detecting typos in
// variable names all read this table. Internal: core/config.hpp is the public surface.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "dtrain/core/config.hpp"
#include "dtrain/core/env.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/horovod_knobs.hpp"
#include "dtrain/core/logging.hpp"

namespace dtrain {
namespace detail {

// Each entry: the variable suffix (after DTRAIN_/HOROVOD_), the Config field, and for numbers
// the accepted range and a phrase for "expected ..." in error messages. Durations and other
// floats are capped at 1e9 so that later conversions to std::chrono counts cannot overflow.
template <class T>
struct IntKnob {
  std::string_view suffix;
  std::string_view field;
  T Config::*member;
  std::int64_t min;
  std::int64_t max;
  std::string_view expected;
};

struct FloatKnob {
  std::string_view suffix;
  std::string_view field;
  double Config::*member;
  double min;
  bool min_exclusive;
  double max;
  std::string_view expected;
  double floor_unless_zero = 0;  // > 0: the value is 0 or at least this
};

struct BoolKnob {
  std::string_view suffix;
  std::string_view field;
  bool Config::*member;
};

struct StringKnob {
  std::string_view suffix;
  std::string_view field;
  std::string Config::*member;
};

// A string from a fixed list, e.g. which library carries host tensors.
struct ChoiceKnob {
  std::string_view suffix;
  std::string_view field;
  std::string Config::*member;
  std::string_view choices;  // "a, b or c", for error messages
  std::initializer_list<std::string_view> values;
  bool allows(const std::string& v) const {
    return std::find(values.begin(), values.end(), v) != values.end();
  }
};

struct LogLevelKnob {
  std::string_view suffix;
  std::string_view field;
  LogLevel Config::*member;
};

inline constexpr std::int64_t int64_max = std::numeric_limits<std::int64_t>::max();
inline constexpr std::int64_t int_max = std::numeric_limits<int>::max();
inline constexpr double float_knob_max = 1e9;

template <class Visitor>
void for_each_knob(Visitor&& visit) {
  visit(IntKnob<std::int64_t>{
      "FUSION_THRESHOLD", "fusion_threshold_bytes", &Config::fusion_threshold_bytes, 0, int64_max,
      "bytes as a non-negative integer with an optional K, M or G suffix, e.g. 134217728 or "
      "64M; 0 disables fusion"});
  visit(FloatKnob{"CYCLE_TIME", "cycle_time_ms", &Config::cycle_time_ms, 0, false,
                  float_knob_max, "milliseconds as a non-negative decimal, e.g. 1 or 0.5"});
  visit(IntKnob<std::int64_t>{"CACHE_CAPACITY", "cache_capacity", &Config::cache_capacity, 0,
                              int64_max,
                              "a non-negative number of entries, e.g. 1024; 0 disables the cache"});
  visit(BoolKnob{"HIERARCHICAL_ALLREDUCE", "hierarchical_allreduce",
                 &Config::hierarchical_allreduce});
  visit(StringKnob{"TIMELINE", "timeline_path", &Config::timeline_path});
  visit(BoolKnob{"TIMELINE_MARK_CYCLES", "timeline_mark_cycles", &Config::timeline_mark_cycles});
  visit(IntKnob<std::int64_t>{
      "TIMELINE_MAX_BYTES", "timeline_max_bytes", &Config::timeline_max_bytes, 0, int64_max,
      "bytes as a non-negative integer with an optional K, M or G suffix, e.g. 1G; 0 means no "
      "cap"});
  visit(BoolKnob{"AUTOTUNE", "autotune", &Config::autotune});
  visit(StringKnob{"AUTOTUNE_LOG", "autotune_log", &Config::autotune_log});
  visit(StringKnob{"AUTOTUNE_CACHE", "autotune_cache", &Config::autotune_cache});
  visit(IntKnob<int>{"AUTOTUNE_WARMUP_SAMPLES", "autotune_warmup_samples",
                     &Config::autotune_warmup_samples, 0, int_max,
                     "a non-negative integer, e.g. 3"});
  visit(IntKnob<int>{"AUTOTUNE_STEPS_PER_SAMPLE", "autotune_steps_per_sample",
                     &Config::autotune_steps_per_sample, 1, int_max,
                     "a positive integer, e.g. 10"});
  visit(IntKnob<int>{"AUTOTUNE_BAYES_OPT_MAX_SAMPLES", "autotune_bayes_opt_max_samples",
                     &Config::autotune_bayes_opt_max_samples, 1, int_max,
                     "a positive integer, e.g. 20"});
  visit(FloatKnob{"AUTOTUNE_GAUSSIAN_PROCESS_NOISE", "autotune_gaussian_process_noise",
                  &Config::autotune_gaussian_process_noise, 0, false, float_knob_max,
                  "a non-negative decimal, e.g. 0.8"});
  visit(BoolKnob{"STALL_CHECK_DISABLE", "stall_check_disable", &Config::stall_check_disable});
  // At least a second: the check runs at most that often, and shorter checks only flood the log.
  visit(FloatKnob{"STALL_CHECK_TIME_SECONDS", "stall_check_time_seconds",
                  &Config::stall_check_time_seconds, 1, false, float_knob_max,
                  "seconds as a decimal of at least 1, e.g. 60"});
  visit(FloatKnob{"STALL_SHUTDOWN_TIME_SECONDS", "stall_shutdown_time_seconds",
                  &Config::stall_shutdown_time_seconds, 0, false, float_knob_max,
                  "seconds as a non-negative decimal, 0 to never shut down, otherwise at least "
                  "the stall check time, e.g. 600"});
  visit(LogLevelKnob{"LOG_LEVEL", "log_level", &Config::log_level});
  visit(IntKnob<int>{"NUM_NCCL_STREAMS", "num_nccl_streams", &Config::num_nccl_streams, 1, 64,
                     "an integer from 1 to 64"});
  visit(StringKnob{"PROFILE", "profile_dir", &Config::profile_dir});
  visit(FloatKnob{"PROFILE_INTERVAL_MS", "profile_interval_ms", &Config::profile_interval_ms, 0,
                  true, float_knob_max, "milliseconds as a positive decimal, e.g. 500"});
  // Shorter than a second, an op times out before ranks on a busy machine can even negotiate it.
  visit(FloatKnob{"OP_TIMEOUT_SECONDS", "op_timeout_seconds", &Config::op_timeout_seconds, 0,
                  false, float_knob_max,
                  "seconds as a decimal, 0 for no deadline or at least 1, e.g. 600", 1});
  // Heartbeats go out once a second: under two seconds, one late heartbeat would lose a peer.
  visit(FloatKnob{"PEER_TIMEOUT_SECONDS", "peer_timeout_seconds", &Config::peer_timeout_seconds,
                  0, false, float_knob_max,
                  "seconds as a decimal, 0 to never declare a silent peer lost, or at least 2, "
                  "e.g. 60",
                  2});
  visit(IntKnob<std::int64_t>{"MPI_CHUNK_BYTES", "mpi_chunk_bytes", &Config::mpi_chunk_bytes,
                              4096, std::int64_t{1} << 30,
                              "bytes from 4096 (4K) to 1073741824 (1G) with an optional K, M or "
                              "G suffix, e.g. 4M"});
  // Note [Pieces in flight] in comm/pieces_in_flight.hpp.
  visit(IntKnob<int>{"MPI_PIECES_IN_FLIGHT", "mpi_pieces_in_flight",
                     &Config::mpi_pieces_in_flight, 1, 16, "an integer from 1 to 16, e.g. 2"});
  // Note [Waiting for data collectives] in comm/request_wait.hpp: the cap must stay well below the
  // time the sockets' buffers take to drain at the link's rate.
  visit(FloatKnob{"WAIT_MAX_SLEEP_US", "wait_max_sleep_us", &Config::wait_max_sleep_us, 0, false,
                  100000, "microseconds from 0 (never sleep) to 100000, e.g. 500"});
  visit(BoolKnob{"MPI_NONBLOCKING", "mpi_nonblocking", &Config::mpi_nonblocking});
  visit(BoolKnob{"FUSION_PIPELINE", "fusion_pipeline", &Config::fusion_pipeline});
  visit(StringKnob{"HOST_ID", "host_id", &Config::host_id});
  // Note [Gloo on the host path] in comm/gloo_group.hpp.
  visit(ChoiceKnob{"CPU_OPERATIONS", "cpu_operations", &Config::cpu_operations,
                   "auto, mpi or gloo", {"auto", "mpi", "gloo"}});
  visit(StringKnob{"GLOO_IFACE", "gloo_iface", &Config::gloo_iface});
}

// DTRAIN_ variables read by other parts of dtrain (the launcher's cluster entrypoint mode, and the
// ones dtrainrun's elastic mode gives every rank: train/elastic.hpp). They are not Config fields
// but must not be reported as misspellings.
inline constexpr std::string_view other_env_suffixes[] = {
    "HOSTS", "CURRENT_HOST", "ELASTIC", "ELASTIC_NOTIFY", "ELASTIC_GENERATION"};

inline std::vector<std::string> known_env_names() {
  std::vector<std::string> names;
  for_each_knob([&](const auto& knob) {
    names.push_back(std::string(env_prefix) + std::string(knob.suffix));
  });
  for (std::string_view suffix : other_env_suffixes) {
    names.push_back(std::string(env_prefix) + std::string(suffix));
  }
  return names;
}

// Bounds violations share one wording for variables and fields; only the subject differs:
// `DTRAIN_X="v"` when read from the environment, `Config::x = v` when set in code.
inline std::string range_problem(const FloatKnob& knob, double value) {
  if (!std::isfinite(value)) return "is not a finite number";
  if (value > knob.max) return fmt::format("is too large (the limit is {})", knob.max);
  return "is out of range";
}

template <class T>
std::string range_problem(const IntKnob<T>& knob, std::int64_t value) {
  if (value > knob.max) return fmt::format("is too large (the limit is {})", knob.max);
  return "is out of range";
}

inline bool in_range(const FloatKnob& knob, double value) {
  if (!std::isfinite(value) || value > knob.max) return false;
  if (knob.floor_unless_zero > 0 && value != 0 && value < knob.floor_unless_zero) return false;
  return knob.min_exclusive ? value > knob.min : value >= knob.min;
}

template <class T>
bool in_range(const IntKnob<T>& knob, std::int64_t value) {
  return value >= knob.min && value <= knob.max;
}

// The one rule that links two fields. `shutdown_subject`/`check_subject` name where each value
// came from (a variable, a field, or a default).
inline std::optional<std::string> stall_rule_problem(const Config& c,
                                                     std::string_view shutdown_subject,
                                                     std::string_view check_subject) {
  if (c.stall_shutdown_time_seconds > 0 &&
      c.stall_shutdown_time_seconds < c.stall_check_time_seconds) {
    return fmt::format(
        "{} is shorter than {}: expected 0 (never shut down) or a shutdown time at least as long "
        "as the stall check time, so a stall is reported before it stops the job",
        shutdown_subject, check_subject);
  }
  return std::nullopt;
}

inline std::string join_problems(const std::vector<std::string>& problems) {
  if (problems.size() == 1) return problems.front();
  std::string out = fmt::format("{} invalid dtrain settings:", problems.size());
  for (const std::string& p : problems) out += "\n  " + p;
  return out;
}

inline std::string format_value(const std::string& s) { return fmt::format("\"{}\"", s); }
inline std::string format_value(double v) { return fmt::format("{}", v); }
inline std::string format_value(std::int64_t v) { return fmt::format("{}", v); }
inline std::string format_value(int v) { return fmt::format("{}", v); }
inline std::string format_value(bool v) { return v ? "true" : "false"; }
inline std::string format_value(LogLevel v) {
  const std::string_view name = to_string(v);
  return name == "unknown" ? fmt::format("LogLevel({})", static_cast<int>(v)) : std::string(name);
}

// Warnings about the environment itself: a HOROVOD_ alias overridden by a different DTRAIN_
// value, DTRAIN_ names that are not settings (typos), and HOROVOD_ names dtrain does not read:
// Horovod's own knobs, said to be ignored with what dtrain does instead, and typos. Each
// distinct warning appears once per process.
inline std::vector<std::string> env_warnings(const EnvSource& env) {
  std::vector<std::string> warnings;
  std::vector<std::string> aliases;
  for_each_knob([&](const auto& knob) {
    aliases.push_back(std::string(env_alias_prefix) + std::string(knob.suffix));
    const EnvLookup found = lookup_env(env, knob.suffix);
    if (found.ignored_alias) {
      warnings.push_back(fmt::format(
          "{}={} and {}={} are both set; using {} (the DTRAIN_ spelling wins)", found.chosen->name,
          format_value(found.chosen->value), found.ignored_alias->name,
          format_value(found.ignored_alias->value), found.chosen->name));
    }
  });
  const std::vector<std::string> known = known_env_names();
  std::vector<std::string> names = env.names();
  std::sort(names.begin(), names.end());
  for (const std::string& name : names) {
    if (name.rfind(env_alias_prefix, 0) == 0) {
      if (std::find(aliases.begin(), aliases.end(), name) != aliases.end()) continue;
      if (const HorovodKnob* knob = find_horovod_unmapped_knob(name)) {
        warnings.push_back(fmt::format(
            "{} is a Horovod setting that dtrain does not use and is ignored: {}", name,
            knob->instead));
      } else {
        warnings.push_back(unknown_horovod_warning(name, aliases));
      }
      continue;
    }
    // DTRAINRUN_ variables are dtrainrun's messages to its ranks, not settings: the underscore
    // after DTRAIN keeps them out.
    if (name.rfind(env_prefix, 0) != 0) continue;
    if (std::find(known.begin(), known.end(), name) != known.end()) continue;
    if (const std::optional<std::string> best = typo_of(name, env_prefix, known)) {
      warnings.push_back(fmt::format(
          "{} is not a dtrain setting and is ignored; did you mean {}?", name, *best));
    } else {
      warnings.push_back(fmt::format(
          "{} is not a dtrain setting and is ignored (see docs/configuration.md for the list)",
          name));
    }
  }
  return warnings;
}

// Gloo is optional at build time (Note [Gloo on the host path] in comm/gloo_group.hpp).
inline std::optional<std::string> gloo_build_problem(const Config& config,
                                                     std::string_view subject) {
#if DTRAIN_WITH_GLOO
  (void)config, (void)subject;
  return std::nullopt;
#else
  if (config.cpu_operations != "gloo") return std::nullopt;
  return fmt::format("{}: this dtrain was built without Gloo; install libgloo-dev and configure "
                     "dtrain with -DDTRAIN_WITH_GLOO=ON, or use mpi", subject);
#endif
}

inline Config config_from_env(const EnvSource& env) {
  Config config;
  std::vector<std::string> problems;
  // Where each value came from, for the cross-field rule.
  std::string shutdown_subject = "the default stall shutdown time";
  std::string check_subject = "the default stall check time (60 seconds)";

  for_each_knob([&](const auto& knob) {
    using Knob = std::decay_t<decltype(knob)>;
    const EnvLookup found = lookup_env(env, knob.suffix);
    if (!found.chosen) return;
    const std::string& name = found.chosen->name;
    const std::string& text = found.chosen->value;
    const std::string subject = fmt::format("{}={}", name, format_value(text));
    if constexpr (std::is_same_v<Knob, BoolKnob>) {
      if (auto value = parse_bool_text(text)) {
        config.*knob.member = *value;
      } else {
        problems.push_back(
            fmt::format("{} is not a boolean: expected one of {}", subject, bool_choices));
      }
    } else if constexpr (std::is_same_v<Knob, StringKnob>) {
      config.*knob.member = text;
    } else if constexpr (std::is_same_v<Knob, ChoiceKnob>) {
      if (knob.allows(text)) {
        config.*knob.member = text;
      } else {
        problems.push_back(fmt::format("{} is not one of the choices: expected {}", subject,
                                       knob.choices));
      }
    } else if constexpr (std::is_same_v<Knob, LogLevelKnob>) {
      if (auto value = try_parse_log_level(text)) {
        config.*knob.member = *value;
      } else {
        problems.push_back(fmt::format("{} is not a log level: expected one of {}", subject,
                                       log_level_choices));
      }
    } else if constexpr (std::is_same_v<Knob, FloatKnob>) {
      const ParsedFloat parsed = parse_float_text(text);
      if (parsed.status == ParseStatus::not_a_number) {
        problems.push_back(
            fmt::format("{} is not a number: expected {}", subject, knob.expected));
      } else if (parsed.status == ParseStatus::out_of_range || !in_range(knob, parsed.value)) {
        const std::string what = parsed.status == ParseStatus::out_of_range
                                     ? std::string("is out of range")
                                     : range_problem(knob, parsed.value);
        problems.push_back(fmt::format("{} {}: expected {}", subject, what, knob.expected));
      } else {
        config.*knob.member = parsed.value;
        if (knob.member == &Config::stall_shutdown_time_seconds) shutdown_subject = subject;
        if (knob.member == &Config::stall_check_time_seconds) check_subject = subject;
      }
    } else {
      const ParsedInt parsed = parse_int_text(text);
      if (parsed.status == ParseStatus::not_a_number) {
        problems.push_back(
            fmt::format("{} is not an integer: expected {}", subject, knob.expected));
      } else if (parsed.status == ParseStatus::out_of_range) {
        problems.push_back(fmt::format("{} is too large: expected {}", subject, knob.expected));
      } else if (!in_range(knob, parsed.value)) {
        problems.push_back(fmt::format("{} {}: expected {}", subject,
                                       range_problem(knob, parsed.value), knob.expected));
      } else {
        using Field = std::remove_cvref_t<decltype(config.*knob.member)>;
        config.*knob.member = static_cast<Field>(parsed.value);
      }
    }
  });

  if (problems.empty()) {
    if (auto problem = stall_rule_problem(config, shutdown_subject, check_subject)) {
      problems.push_back(*problem);
    }
  }

  // The environment's own DTRAIN_LOG_LEVEL already applies to warnings about the environment.
  if (config.log_level <= LogLevel::warning) {
    for (std::string& warning : env_warnings(env)) log_once(LogLevel::warning, std::move(warning));
  }

  if (problems.empty()) {
    if (auto problem = gloo_build_problem(config, "DTRAIN_CPU_OPERATIONS=gloo"))
      problems.push_back(*problem);
  }
  if (!problems.empty()) throw InvalidArgumentError(join_problems(problems));
  return config;
}

// Throws InvalidArgumentError naming every bad field, its value and what is accepted.
inline void validate_config(const Config& config) {
  std::vector<std::string> problems;
  for_each_knob([&](const auto& knob) {
    using Knob = std::decay_t<decltype(knob)>;
    const auto& value = config.*knob.member;
    const std::string subject =
        fmt::format("Config::{} = {}", knob.field, format_value(value));
    if constexpr (std::is_same_v<Knob, FloatKnob>) {
      if (!in_range(knob, value)) {
        problems.push_back(fmt::format("{} {}: expected {}", subject,
                                       range_problem(knob, value), knob.expected));
      }
    } else if constexpr (std::is_same_v<Knob, LogLevelKnob>) {
      const int v = static_cast<int>(value);
      if (v < static_cast<int>(LogLevel::trace) || v > static_cast<int>(LogLevel::fatal)) {
        problems.push_back(fmt::format("{} is not a log level: expected one of {}", subject,
                                       log_level_choices));
      }
    } else if constexpr (std::is_same_v<Knob, ChoiceKnob>) {
      if (!knob.allows(value)) {
        problems.push_back(fmt::format("{} is not one of the choices: expected {}", subject,
                                       knob.choices));
      }
    } else if constexpr (!std::is_same_v<Knob, BoolKnob> &&
                         !std::is_same_v<Knob, StringKnob>) {
      if (!in_range(knob, static_cast<std::int64_t>(value))) {
        problems.push_back(fmt::format("{} {}: expected {}", subject,
                                       range_problem(knob, value), knob.expected));
      }
    }
  });
  if (problems.empty()) {
    const auto shutdown = fmt::format("Config::stall_shutdown_time_seconds = {}",
                                      config.stall_shutdown_time_seconds);
    const auto check =
        fmt::format("Config::stall_check_time_seconds = {}", config.stall_check_time_seconds);
    if (auto problem = stall_rule_problem(config, shutdown, check)) {
      problems.push_back(*problem);
    }
    if (auto problem = gloo_build_problem(config, "Config::cpu_operations = \"gloo\""))
      problems.push_back(*problem);
  }
  if (!problems.empty()) throw InvalidArgumentError(join_problems(problems));
}

// The fields in which `requested` differs from `running`, as "Config::x = a (running) vs b".
inline std::vector<std::string> config_differences(const Config& running, const Config& requested) {
  std::vector<std::string> out;
  for_each_knob([&](const auto& knob) {
    const auto& a = running.*knob.member;
    const auto& b = requested.*knob.member;
    if (!(a == b))
      out.push_back(fmt::format("Config::{} = {} (running) vs {} (requested)", knob.field,
                                format_value(a), format_value(b)));
  });
  return out;
}

}  // namespace detail
}  // namespace dtrain
