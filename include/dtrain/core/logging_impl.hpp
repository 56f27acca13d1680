#pragma once
// Definitions of core/logging.hpp (Note [Build modes] in core/build_mode.hpp).
#include <chrono>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>

#include "dtrain/core/log_sink.hpp"
#include "dtrain/core/logging.hpp"

namespace dtrain {

DTRAIN_API void set_log_level(LogLevel level) noexcept {
  detail::log_level_value.store(static_cast<int>(level), std::memory_order_relaxed);
}

DTRAIN_API LogLevel log_level() noexcept {
  return static_cast<LogLevel>(detail::log_level_value.load(std::memory_order_relaxed));
}

}  // namespace dtrain

namespace dtrain::detail {

DTRAIN_API bool log_enabled(LogLevel level) noexcept {
  return static_cast<int>(level) >= log_level_value.load(std::memory_order_relaxed);
}

DTRAIN_API void set_log_sink(std::function<void(std::string_view line)> sink) {
  LogSinkState& state = log_sink_state();
  std::lock_guard lock(state.mutex);
  state.sink = std::move(sink);
}

DTRAIN_API void emit_log_line(LogLevel level, std::string_view message) {
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

DTRAIN_API bool log_once(LogLevel level, std::string message) {
  if (!log_enabled(level)) return false;
  {
    LogSinkState& state = log_sink_state();
    std::lock_guard lock(state.mutex);
    if (!state.said_once.insert(message).second) return false;
  }
  emit_log_line(level, message);
  return true;
}

}  // namespace dtrain::detail
