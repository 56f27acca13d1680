#pragma once
// The records of a profile file and their JSON form: one object per line (JSON Lines), one file
// per rank. dtrain-report (tools/dtrain_report/profile_reader.py) reads exactly this.
//
// Note [Profile schema]
// Every line is an object whose "type" says which record it is; times `t` are seconds since the
// run's common start (agreed by all ranks when their Profilers were built), durations are
// milliseconds, sizes bytes, rates per second, CPU percentages count one core as 100.
//   header  first line: format "dtrain-profile", version, run_id (the same in every rank's
//           file of one run), job_id and attempt (DTRAINRUN_JOB_ID and DTRAINRUN_ATTEMPT, only
//           under dtrainrun: Note [Profile layout]), rank, size, local_rank, local_size, host,
//           pid, cpu_count, affinity_cpus, sample_interval_ms, start_unix_ms,
//           process_uptime_ms (how long the process had run at the run's time zero, when /proc
//           tells), dtrain_version, gpu
//           ({available, index, name, memory_total_bytes} or {available: false, reason}),
//           engine_counters (the names recorded in each step's "engine" object)
//   start   recording (re)started before step `step`
//   step    step, t (its start), duration_ms, samples (0: not given), phases_ms
//           ({phase: exclusive ms}, Note [Exclusive phase time]), other_ms, engine ({counter:
//           increase from the start to the end of this step}, Note [Engine counters in profiles];
//           counters that did not move are left out, so {} is a step without collectives)
//   sample  t, and each metric that could be read: process_cpu_pct, system_cpu_pct (0..100 of
//           the whole machine), rss_bytes, threads, procs_running, involuntary_switches_per_s,
//           net_rx_bytes_per_s, net_tx_bytes_per_s, disk_read_bytes_per_s,
//           disk_write_bytes_per_s, process_read_bytes_per_s, process_write_bytes_per_s, gpu
//           ({utilization_pct, memory_utilization_pct, memory_used_bytes, memory_total_bytes}),
//           engine (the counters' increase over the sample's period, as in steps; absent while
//           dtrain is not running)
//   stop    recording stopped after `steps` recorded steps; phases_outside_steps counts phase
//           scopes that ran outside any step and were therefore not charged
//   end     the profiler closed the file cleanly (a file without it was cut short)
// Readers ignore fields they do not know, so fields can be added without a new version, and skip
// lines of spaces (padding: Note [Complete lines only]).
//
// Note [Engine counters in profiles]
// Every EngineStats field is a counter that only grows, so a step's share is the difference of
// two snapshots (engine_stats_delta). The names in profile files are the fields' own names, from
// the one list in runtime/engine_stats.hpp; a counter the engine adds is recorded with no change
// here, and dtrain-report shows any counter it finds (it reads the names from the file, and knows
// the meaning of those it uses in its rules).
#include <chrono>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "dtrain/runtime/engine_stats.hpp"
#include "dtrain/core/json_writer.hpp"
#include "dtrain/profile/nvml.hpp"

namespace dtrain::detail {

inline constexpr int profile_format_version = 1;

struct HeaderRecord {
  std::string run_id;
  std::string job_id;                   // DTRAINRUN_JOB_ID; empty outside dtrainrun
  std::optional<std::int64_t> attempt;  // DTRAINRUN_ATTEMPT (Note [Profile layout])
  int rank = 0, size = 1, local_rank = 0, local_size = 1;
  std::string host;
  long pid = 0;
  long cpu_count = 0;
  long affinity_cpus = 0;
  double sample_interval_ms = 0;
  double start_unix_ms = 0;
  std::optional<double> process_uptime_ms;
  std::string dtrain_version;
  bool gpu_available = false;
  std::string gpu_reason;  // why not, when unavailable
  int gpu_index = -1;
  std::string gpu_name;
  std::uint64_t gpu_memory_total_bytes = 0;
};

struct StepRecord {
  std::int64_t step = 0;
  double t = 0;
  std::chrono::nanoseconds duration{};
  std::chrono::nanoseconds other{};
  std::vector<std::pair<std::string, std::chrono::nanoseconds>> phases;
  std::int64_t samples = 0;
  std::optional<EngineStats> engine;  // absent when dtrain was not initialized
};

struct SampleRecord {
  double t = 0;
  std::optional<double> process_cpu_pct, system_cpu_pct;
  std::optional<std::uint64_t> rss_bytes;
  std::optional<std::int64_t> threads, procs_running;
  std::optional<double> involuntary_switches_per_s;
  std::optional<double> net_rx_bytes_per_s, net_tx_bytes_per_s;
  std::optional<double> disk_read_bytes_per_s, disk_write_bytes_per_s;
  std::optional<double> process_read_bytes_per_s, process_write_bytes_per_s;
  std::optional<GpuReading> gpu;
  std::optional<EngineStats> engine;  // absent while dtrain is not running
};

struct MarkRecord {
  enum class Kind { start, stop, end };
  Kind kind = Kind::start;
  double t = 0;
  std::int64_t step = 0;                  // start: the next step; stop: steps recorded
  std::int64_t phases_outside_steps = 0;  // stop only
};

using ProfileRecord = std::variant<HeaderRecord, StepRecord, SampleRecord, MarkRecord>;

// Values are rounded to what the report can use (100 ns, 1 us, 0.01 %, 1 byte/s): a profile line
// stays short, and the file is not pretending to more precision than the clocks have.
// `steps` per unit: 100 rounds to hundredths. Dividing by an exact integer gives the double that
// prints shortest ("69.14", not "69.14000000000001").
inline double rounded(double v, double steps) { return std::round(v * steps) / steps; }

inline double milliseconds(std::chrono::nanoseconds d) {
  return rounded(std::chrono::duration<double, std::milli>(d).count(), 1e4);
}
inline double seconds_rounded(double t) { return rounded(t, 1e6); }

// The counters that moved: most of them, in most steps and samples, did not.
inline JsonObject engine_json(const EngineStats& e) {
  JsonObject engine;
  for_each_engine_counter([&](std::string_view name, Counter, auto member) {
    if (e.*member != 0) engine.field(name, e.*member);
  });
  return engine;
}

inline std::string to_json_line(const HeaderRecord& h) {
  JsonObject gpu;
  gpu.field("available", h.gpu_available);
  if (h.gpu_available) {
    gpu.field("index", h.gpu_index).field("name", h.gpu_name);
    gpu.field("memory_total_bytes", h.gpu_memory_total_bytes);
  } else {
    gpu.field("reason", h.gpu_reason);
  }
  std::vector<std::string_view> counters;
  for_each_engine_counter(
      [&](std::string_view name, Counter, auto) { counters.push_back(name); });
  JsonObject line;
  line.field("type", "header").field("format", "dtrain-profile");
  line.field("version", profile_format_version).field("run_id", h.run_id);
  if (!h.job_id.empty()) line.field("job_id", h.job_id);
  if (h.attempt) line.field("attempt", *h.attempt);
  line.field("rank", h.rank).field("size", h.size);
  line.field("local_rank", h.local_rank).field("local_size", h.local_size);
  line.field("host", h.host).field("pid", h.pid);
  line.field("cpu_count", h.cpu_count).field("affinity_cpus", h.affinity_cpus);
  line.field("sample_interval_ms", h.sample_interval_ms);
  line.field("start_unix_ms", h.start_unix_ms);
  if (h.process_uptime_ms) line.field("process_uptime_ms", rounded(*h.process_uptime_ms, 1));
  line.field("dtrain_version", h.dtrain_version);
  line.field("gpu", gpu).string_array("engine_counters", counters);
  return line.closed() + "\n";
}

inline std::string to_json_line(const StepRecord& s) {
  JsonObject phases;
  for (const auto& [name, d] : s.phases) phases.field(name, milliseconds(d));
  JsonObject line;
  line.field("type", "step").field("step", s.step).field("t", seconds_rounded(s.t));
  line.field("duration_ms", milliseconds(s.duration)).field("samples", s.samples);
  line.field("phases_ms", phases).field("other_ms", milliseconds(s.other));
  if (s.engine) line.field("engine", engine_json(*s.engine));
  return line.closed() + "\n";
}

inline std::string to_json_line(const SampleRecord& s) {
  JsonObject line;
  line.field("type", "sample").field("t", seconds_rounded(s.t));
  auto opt = [&](std::string_view key, const auto& v) {
    if (!v) return;
    if constexpr (std::is_floating_point_v<std::remove_cvref_t<decltype(*v)>>)
      line.field(key, rounded(*v, key.ends_with("_pct") ? 100.0 : 1.0));
    else
      line.field(key, *v);
  };
  opt("process_cpu_pct", s.process_cpu_pct);
  opt("system_cpu_pct", s.system_cpu_pct);
  opt("rss_bytes", s.rss_bytes);
  opt("threads", s.threads);
  opt("procs_running", s.procs_running);
  opt("involuntary_switches_per_s", s.involuntary_switches_per_s);
  opt("net_rx_bytes_per_s", s.net_rx_bytes_per_s);
  opt("net_tx_bytes_per_s", s.net_tx_bytes_per_s);
  opt("disk_read_bytes_per_s", s.disk_read_bytes_per_s);
  opt("disk_write_bytes_per_s", s.disk_write_bytes_per_s);
  opt("process_read_bytes_per_s", s.process_read_bytes_per_s);
  opt("process_write_bytes_per_s", s.process_write_bytes_per_s);
  if (s.gpu) {
    JsonObject gpu;
    gpu.field("utilization_pct", rounded(s.gpu->utilization_pct, 100));
    gpu.field("memory_utilization_pct", rounded(s.gpu->memory_utilization_pct, 100));
    gpu.field("memory_used_bytes", s.gpu->memory_used_bytes);
    gpu.field("memory_total_bytes", s.gpu->memory_total_bytes);
    line.field("gpu", gpu);
  }
  if (s.engine) line.field("engine", engine_json(*s.engine));
  return line.closed() + "\n";
}

inline std::string to_json_line(const MarkRecord& m) {
  JsonObject line;
  switch (m.kind) {
    case MarkRecord::Kind::start:
      line.field("type", "start").field("t", seconds_rounded(m.t)).field("step", m.step);
      break;
    case MarkRecord::Kind::stop:
      line.field("type", "stop").field("t", seconds_rounded(m.t)).field("steps", m.step);
      line.field("phases_outside_steps", m.phases_outside_steps);
      break;
    case MarkRecord::Kind::end:
      line.field("type", "end").field("t", seconds_rounded(m.t));
      break;
  }
  return line.closed() + "\n";
}

inline std::string to_json_line(const ProfileRecord& r) {
  return std::visit([](const auto& x) { return to_json_line(x); }, r);
}

}  // namespace dtrain::detail
