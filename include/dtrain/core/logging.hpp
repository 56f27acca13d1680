#pragma once
// Diagnostics for the user: one line per message, `[dtrain 10:11:27.123 rank 1] warning: text`,
// written whole so lines from threads and ranks sharing a terminal do not interleave.
#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <ctime>
#include <functional>
#include <iterator>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>

#include "dtrain/core/error.hpp"

namespace dtrain {

enum class LogLevel { trace, debug, info, warning, error, fatal };

constexpr std::string_view to_string(LogLevel level) noexcept {
  switch (level) {
    case LogLevel::trace: return "trace";
    case LogLevel::debug: return "debug";
    case LogLevel::info: return "info";
    case LogLevel::warning: return "warning";
    case LogLevel::error: return "error";
    case LogLevel::fatal: return "fatal";
  }
  return "unknown";
}

namespace detail {

inline constexpr std::string_view log_level_choices = "trace, debug, info, warning, error, fatal";

// Case-insensitive, because Horovod documents the upper-case spellings (HOROVOD_LOG_LEVEL=DEBUG).
inline std::optional<LogLevel> try_parse_log_level(std::string_view text) noexcept {
  constexpr LogLevel all[] = {LogLevel::trace,   LogLevel::debug, LogLevel::info,
                              LogLevel::warning, LogLevel::error, LogLevel::fatal};
  for (LogLevel level : all) {
    const std::string_view name = to_string(level);
    if (name.size() != text.size()) continue;
    bool same = true;
    for (std::size_t i = 0; i < name.size() && same; ++i) {
      char c = text[i];
      if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
      same = c == name[i];
    }
    if (same) return level;
  }
  return std::nullopt;
}

inline std::atomic<int> log_level_value{static_cast<int>(LogLevel::warning)};
inline std::atomic<int> log_rank{-1};  // set by the runtime at init; -1 = unknown

}  // namespace detail

inline LogLevel parse_log_level(std::string_view text) {
  if (auto level = detail::try_parse_log_level(text)) return *level;
  throw InvalidArgumentError(fmt::format("dtrain: \"{}\" is not a log level: expected one of {}", text,
                                         detail::log_level_choices));
}

inline void set_log_level(LogLevel level) noexcept {
  detail::log_level_value.store(static_cast<int>(level), std::memory_order_relaxed);
}

inline LogLevel log_level() noexcept {
  return static_cast<LogLevel>(detail::log_level_value.load(std::memory_order_relaxed));
}

namespace detail {

inline bool log_enabled(LogLevel level) noexcept {
  return static_cast<int>(level) >= log_level_value.load(std::memory_order_relaxed);
}

// `[dtrain HH:MM:SS.mmm rank R] level: message` in local time, without a trailing newline.
inline std::string format_log_line(LogLevel level, std::string_view message,
                                   std::chrono::system_clock::time_point when, int rank) {
  const std::time_t seconds = std::chrono::system_clock::to_time_t(when);
  const auto millis = std::chrono::duration_cast<std::chrono::milliseconds>(
                          when.time_since_epoch()) %
                      1000;
  std::tm local{};
  localtime_r(&seconds, &local);
  fmt::memory_buffer out;
  fmt::format_to(std::back_inserter(out), "[dtrain {:02}:{:02}:{:02}.{:03}", local.tm_hour,
                 local.tm_min, local.tm_sec, (millis.count() + 1000) % 1000);
  if (rank >= 0) fmt::format_to(std::back_inserter(out), " rank {}", rank);
  fmt::format_to(std::back_inserter(out), "] {}: {}", to_string(level), message);
  return fmt::to_string(out);
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

// Receives each line without its newline, one call per line, never concurrently. A sink must not
// log itself. An empty function restores the default (stderr).
inline void set_log_sink(std::function<void(std::string_view line)> sink) {
  LogSinkState& state = log_sink_state();
  std::lock_guard lock(state.mutex);
  state.sink = std::move(sink);
}

inline void emit_log_line(LogLevel level, std::string_view message) {
  std::string line = format_log_line(level, message, std::chrono::system_clock::now(),
                                     log_rank.load(std::memory_order_relaxed));
  LogSinkState& state = log_sink_state();
  std::lock_guard lock(state.mutex);
  if (state.sink) {
    state.sink(line);
  } else {
    line.push_back('\n');
    write_to_stderr(line);
  }
}

template <class... Args>
void log(LogLevel level, fmt::format_string<Args...> format, Args&&... args) {
  if (!log_enabled(level)) return;  // before any formatting: disabled messages cost one load
  emit_log_line(level, fmt::vformat(format, fmt::make_format_args(args...)));
}

// Logs `message` the first time it is passed in this process and never again, so a setting that
// is read at every init() does not repeat its warning. Returns whether it logged.
inline bool log_once(LogLevel level, std::string message) {
  if (!log_enabled(level)) return false;
  {
    LogSinkState& state = log_sink_state();
    std::lock_guard lock(state.mutex);
    if (!state.said_once.insert(message).second) return false;
  }
  emit_log_line(level, message);
  return true;
}

}  // namespace detail
}  // namespace dtrain
