#pragma once
// Captures dtrain's log lines for the life of the object, then restores the stderr sink and the
// previous level and rank.
#include <string>
#include <string_view>
#include <vector>

#include "dtrain/core/log_sink.hpp"
#include "dtrain/core/logging.hpp"

namespace dtrain::test {

class LogCapture {
 public:
  explicit LogCapture(LogLevel level = LogLevel::trace)
      : saved_level_(log_level()), saved_rank_(detail::log_rank.load()) {
    set_log_level(level);
    detail::set_log_sink([this](std::string_view line) { lines_.emplace_back(line); });
  }
  ~LogCapture() {
    detail::set_log_sink({});
    set_log_level(saved_level_);
    detail::log_rank.store(saved_rank_);
  }
  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;

  const std::vector<std::string>& lines() const { return lines_; }

  // Lines containing every one of the given fragments.
  std::size_t count(std::initializer_list<std::string_view> fragments) const {
    std::size_t n = 0;
    for (const std::string& line : lines_) {
      bool all = true;
      for (std::string_view f : fragments) all = all && line.find(f) != std::string::npos;
      if (all) ++n;
    }
    return n;
  }

 private:
  LogLevel saved_level_;
  int saved_rank_;
  std::vector<std::string> lines_;
};

}  // namespace dtrain::test
