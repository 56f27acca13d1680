#pragma once
// LogLevel and its names, as settings and messages spell them.
#include <optional>
#include <string_view>

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

}  // namespace detail
}  // namespace dtrain
