#pragma once
// Diagnostics for the user: one line per message, `[dtrain 10:11:27.123 rank 1] warning: text`,
// written whole so lines from threads and ranks sharing a terminal do not interleave.
#include <fmt/format.h>

#include <functional>
#include <string>
#include <string_view>

#include "dtrain/core/build_mode.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/log_level.hpp"

namespace dtrain {

inline LogLevel parse_log_level(std::string_view text) {
  if (auto level = detail::try_parse_log_level(text)) return *level;
  throw InvalidArgumentError(fmt::format("dtrain: \"{}\" is not a log level: expected one of {}",
                                         text, detail::log_level_choices));
}

DTRAIN_API void set_log_level(LogLevel level) noexcept;
DTRAIN_API LogLevel log_level() noexcept;

namespace detail {

// Receives each line without its newline, one call per line, never concurrently. A sink must not
// log itself. An empty function restores the default (stderr).
DTRAIN_API void set_log_sink(std::function<void(std::string_view line)> sink);

DTRAIN_API bool log_enabled(LogLevel level) noexcept;

DTRAIN_API void emit_log_line(LogLevel level, std::string_view message);

template <class... Args>
void log(LogLevel level, fmt::format_string<Args...> format, Args&&... args) {
  if (!log_enabled(level)) return;  // before any formatting: disabled messages cost one load
  emit_log_line(level, fmt::vformat(format, fmt::make_format_args(args...)));
}

// Logs `message` the first time it is passed in this process and never again, so a setting that
// is read at every init() does not repeat its warning. Returns whether it logged.
DTRAIN_API bool log_once(LogLevel level, std::string message);

}  // namespace detail
}  // namespace dtrain

#ifdef DTRAIN_HEADER_ONLY
#include "dtrain/core/logging_impl.hpp"
#endif
