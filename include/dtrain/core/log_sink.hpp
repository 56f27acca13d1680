#pragma once
// Where log lines go and how they look (core/logging.hpp's internals).
#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <ctime>
#include <functional>
#include <mutex>
#include <set>
#include <string>
#include <string_view>

#include "dtrain/core/log_level.hpp"

namespace dtrain::detail {

// The logger's level and the rank its lines name (set by the runtime at init; -1 = unknown).
inline std::atomic<int> log_level_value{static_cast<int>(LogLevel::warning)};
inline std::atomic<int> log_rank{-1};

// `[dtrain HH:MM:SS.mmm rank R] level: message` in local time, without a trailing newline.
inline std::string format_log_line(LogLevel level, std::string_view message,
                                   std::chrono::system_clock::time_point when, int rank) {
  const std::time_t seconds = std::chrono::system_clock::to_time_t(when);
  const auto millis = std::chrono::duration_cast<std::chrono::milliseconds>(
                          when.time_since_epoch()) %
                      1000;
  std::tm local{};
  localtime_r(&seconds, &local);
  // fmt::format, not format_to(back_inserter): the latter compiles fmt's formatting engine into
  // every file that includes this header, where fmt::format calls the one in libfmt.
  std::string line = fmt::format("[dtrain {:02}:{:02}:{:02}.{:03}", local.tm_hour, local.tm_min,
                                 local.tm_sec, (millis.count() + 1000) % 1000);
  if (rank >= 0) line += fmt::format(" rank {}", rank);
  line += fmt::format("] {}: {}", to_string(level), message);
  return line;
}

inline void write_to_stderr(std::string_view text) noexcept {
  // One write(2) per line; the loop only continues after a signal or a short write to a pipe.
  while (!text.empty()) {
    const ssize_t n = ::write(STDERR_FILENO, text.data(), text.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return;  // nowhere left to report a failure to report
    }
    text.remove_prefix(static_cast<std::size_t>(n));
  }
}

struct LogSinkState {
  std::mutex mutex;
  std::function<void(std::string_view)> sink;  // empty: stderr
  std::set<std::string, std::less<>> said_once;
};

// Never destroyed, so code running during static destruction (an engine thread winding down at
// exit) can still log.
inline LogSinkState& log_sink_state() {
  static LogSinkState* state = new LogSinkState;
  return *state;
}

}  // namespace dtrain::detail
