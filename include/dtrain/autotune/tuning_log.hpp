#pragma once
// DTRAIN_AUTOTUNE_LOG: the tuner's history as CSV, one row per record, written by rank 0 as the
// records happen and flushed row by row, so a job that dies mid-tuning leaves a readable log.
//
// Columns (docs/autotune.md has an example):
//   kind                    warmup | sample | median | choice | reused
//   configuration           0-based index of the configuration (empty for warmup and reused)
//   generation              the configuration generation the row belongs to
//   fusion_threshold_bytes, cycle_time_ms, hierarchical_allreduce, response_cache,
//   fusion_pipeline, mpi_pieces_in_flight
//                           the knobs (binary knobs as 0/1)
//   steps, bytes, seconds   the sample's totals (warmup and sample rows; empty otherwise)
//   score_bytes_per_second  bytes / seconds for a sample, the median of the samples for a
//                           configuration, the chosen configuration's median for choice/reused
// A log that cannot be opened or written is a warning; tuning goes on without it.
#include <fmt/format.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>

#include "dtrain/autotune/knobs.hpp"
#include "dtrain/autotune/tuner.hpp"
#include "dtrain/core/logging.hpp"

namespace dtrain::autotune {

inline std::string tuning_log_header() {
  std::string h = "kind,configuration,generation";
  for (Knob knob : all_knobs) h += fmt::format(",{}", to_string(knob));
  h += ",steps,bytes,seconds,score_bytes_per_second";
  return h;
}

inline std::string tuning_log_row(const TuningRecord& r) {
  std::string row(to_string(r.kind));
  row += ',';
  if (r.configuration >= 0) row += fmt::format("{}", r.configuration);
  row += fmt::format(",{}", r.generation);
  for (Knob knob : all_knobs) row += ',' + knob_value_text(r.knobs, knob);
  if (r.kind == RecordKind::warmup || r.kind == RecordKind::sample) {
    row += fmt::format(",{},{},{}", r.steps, r.bytes, r.seconds);
  } else {
    row += ",,,";
  }
  row += fmt::format(",{}", r.score_bytes_per_second);
  return row;
}

class TuningLog {
 public:
  TuningLog() = default;  // writes nothing

  // Truncates `path` and writes the header.
  explicit TuningLog(std::string path) : path_(std::move(path)) {
    file_ = std::fopen(path_.c_str(), "w");
    if (file_ == nullptr) {
      const int err = errno;
      dtrain::detail::log(LogLevel::warning,
                  "autotune: cannot open the tuning log '{}' (DTRAIN_AUTOTUNE_LOG) for writing: "
                  "{}; tuning continues without a log",
                  path_, std::strerror(err));
      return;
    }
    write_line(tuning_log_header());
  }

  TuningLog(TuningLog&& other) noexcept
      : path_(std::move(other.path_)), file_(std::exchange(other.file_, nullptr)) {}
  TuningLog& operator=(TuningLog&& other) noexcept {
    if (this != &other) {
      close();
      path_ = std::move(other.path_);
      file_ = std::exchange(other.file_, nullptr);
    }
    return *this;
  }
  TuningLog(const TuningLog&) = delete;
  TuningLog& operator=(const TuningLog&) = delete;
  ~TuningLog() { close(); }

  bool is_open() const noexcept { return file_ != nullptr; }

  void write(const TuningRecord& record) {
    if (file_ != nullptr) write_line(tuning_log_row(record));
  }

 private:
  void write_line(const std::string& line) {
    if (std::fputs(line.c_str(), file_) < 0 || std::fputc('\n', file_) == EOF ||
        std::fflush(file_) != 0) {
      const int err = errno;
      dtrain::detail::log(LogLevel::warning,
                  "autotune: writing the tuning log '{}' (DTRAIN_AUTOTUNE_LOG) failed: {}; "
                  "the log stops here, tuning continues",
                  path_, std::strerror(err));
      close();
    }
  }

  void close() noexcept {
    if (file_ != nullptr) std::fclose(file_);
    file_ = nullptr;
  }

  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace dtrain::autotune
