#include "dtrain/core/log_sink.hpp"
#include "dtrain/core/logging.hpp"

#include <doctest/doctest.h>
#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <string>
#include <thread>
#include <vector>

#include "log_capture.hpp"

using dtrain::LogLevel;
using dtrain::test::LogCapture;

namespace {

// Counts how often it is formatted, to prove that filtered messages are never formatted.
struct CountedArg {
  int* formatted;
};

std::chrono::system_clock::time_point local_time(int h, int m, int s, int ms) {
  std::tm t{};
  t.tm_year = 2024 - 1900;
  t.tm_mon = 4;
  t.tm_mday = 17;
  t.tm_hour = h;
  t.tm_min = m;
  t.tm_sec = s;
  t.tm_isdst = -1;
  return std::chrono::system_clock::from_time_t(std::mktime(&t)) + std::chrono::milliseconds(ms);
}

}  // namespace

template <>
struct fmt::formatter<CountedArg> : fmt::formatter<int> {
  auto format(const CountedArg& a, fmt::format_context& ctx) const {
    ++*a.formatted;
    return fmt::formatter<int>::format(*a.formatted, ctx);
  }
};

TEST_CASE("log level names parse in any case and print back") {
  CHECK(dtrain::parse_log_level("trace") == LogLevel::trace);
  CHECK(dtrain::parse_log_level("DEBUG") == LogLevel::debug);
  CHECK(dtrain::parse_log_level("Info") == LogLevel::info);
  CHECK(dtrain::parse_log_level("warning") == LogLevel::warning);
  CHECK(dtrain::parse_log_level("ERROR") == LogLevel::error);
  CHECK(dtrain::parse_log_level("fatal") == LogLevel::fatal);
  CHECK(dtrain::to_string(LogLevel::warning) == "warning");
  CHECK(dtrain::to_string(LogLevel::fatal) == "fatal");
  CHECK_THROWS_WITH_AS(dtrain::parse_log_level("verbose"),
                       "dtrain: \"verbose\" is not a log level: expected one of trace, debug, info, "
                       "warning, error, fatal",
                       dtrain::InvalidArgumentError);
  CHECK_THROWS_AS(dtrain::parse_log_level(""), dtrain::InvalidArgumentError);
  CHECK_THROWS_AS(dtrain::parse_log_level("warn"), dtrain::InvalidArgumentError);
  CHECK_THROWS_AS(dtrain::parse_log_level("info "), dtrain::InvalidArgumentError);
}

TEST_CASE("the default level is warning") {
  CHECK(dtrain::log_level() == LogLevel::warning);
}

TEST_CASE("line format: time with milliseconds, rank when known, level, message") {
  const auto when = local_time(10, 11, 27, 123);
  CHECK(dtrain::detail::format_log_line(LogLevel::warning, "message", when, 1) ==
        "[dtrain 10:11:27.123 rank 1] warning: message");
  CHECK(dtrain::detail::format_log_line(LogLevel::error, "disk full", when, -1) ==
        "[dtrain 10:11:27.123] error: disk full");
  CHECK(dtrain::detail::format_log_line(LogLevel::debug, "x", local_time(9, 5, 3, 7), 0) ==
        "[dtrain 09:05:03.007 rank 0] debug: x");
}

TEST_CASE("messages at or above the level reach the sink, the rest do not") {
  LogCapture capture(LogLevel::warning);
  dtrain::detail::log(LogLevel::trace, "trace {}", 1);
  dtrain::detail::log(LogLevel::debug, "debug {}", 2);
  dtrain::detail::log(LogLevel::info, "info {}", 3);
  dtrain::detail::log(LogLevel::warning, "warning {}", 4);
  dtrain::detail::log(LogLevel::error, "error {}", 5);
  dtrain::detail::log(LogLevel::fatal, "fatal {}", 6);
  REQUIRE(capture.lines().size() == 3);
  CHECK(capture.count({"] warning: warning 4"}) == 1);
  CHECK(capture.count({"] error: error 5"}) == 1);
  CHECK(capture.count({"] fatal: fatal 6"}) == 1);

  dtrain::set_log_level(LogLevel::trace);
  dtrain::detail::log(LogLevel::trace, "now visible");
  CHECK(capture.count({"] trace: now visible"}) == 1);

  dtrain::set_log_level(LogLevel::fatal);
  CHECK(dtrain::log_level() == LogLevel::fatal);
  dtrain::detail::log(LogLevel::error, "hidden");
  CHECK(capture.count({"hidden"}) == 0);
}

TEST_CASE("messages below the level are not formatted") {
  LogCapture capture(LogLevel::error);
  int formatted = 0;
  dtrain::detail::log(LogLevel::info, "value {}", CountedArg{&formatted});
  CHECK(formatted == 0);
  CHECK(capture.lines().empty());
  dtrain::detail::log(LogLevel::error, "value {}", CountedArg{&formatted});
  CHECK(formatted == 1);
  CHECK(capture.count({"error: value 1"}) == 1);
}

TEST_CASE("the rank appears in the prefix once the runtime sets it") {
  LogCapture capture;
  dtrain::detail::log_rank.store(-1);
  dtrain::detail::log(LogLevel::info, "before");
  dtrain::detail::log_rank.store(3);
  dtrain::detail::log(LogLevel::info, "after");
  REQUIRE(capture.lines().size() == 2);
  const std::string& before = capture.lines()[0];
  const std::string& after = capture.lines()[1];
  CHECK(before.rfind("[dtrain ", 0) == 0);
  CHECK(before.find("rank") == std::string::npos);
  CHECK(before.substr(before.find(']')) == "] info: before");
  CHECK(after.rfind("[dtrain ", 0) == 0);
  CHECK(after.substr(after.find(" rank")) == " rank 3] info: after");
  // "[dtrain HH:MM:SS.mmm" before the rank.
  CHECK(after.find(" rank") == std::string("[dtrain 00:00:00.000").size());
}

TEST_CASE("log_once logs a message the first time only") {
  LogCapture capture;
  CHECK(dtrain::detail::log_once(LogLevel::warning, "log_once test message"));
  CHECK_FALSE(dtrain::detail::log_once(LogLevel::warning, "log_once test message"));
  CHECK(capture.count({"log_once test message"}) == 1);
  // A message suppressed by the level is not remembered as said.
  dtrain::set_log_level(LogLevel::error);
  CHECK_FALSE(dtrain::detail::log_once(LogLevel::warning, "log_once quiet message"));
  dtrain::set_log_level(LogLevel::trace);
  CHECK(dtrain::detail::log_once(LogLevel::warning, "log_once quiet message"));
}

TEST_CASE("lines from many threads arrive whole and one at a time") {
  constexpr int threads = 4;
  constexpr int per_thread = 500;
  std::atomic<int> inside{0};
  std::atomic<bool> overlapped{false};
  std::vector<std::string> lines;
  const LogLevel saved = dtrain::log_level();
  dtrain::set_log_level(LogLevel::trace);
  dtrain::detail::set_log_sink([&](std::string_view line) {
    if (inside.fetch_add(1) != 0) overlapped = true;
    lines.emplace_back(line);
    inside.fetch_sub(1);
  });
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([t] {
      for (int i = 0; i < per_thread; ++i) {
        dtrain::detail::log(LogLevel::info, "thread {} line {} {}", t, i, std::string(200, 'x'));
      }
    });
  }
  for (auto& th : pool) th.join();
  dtrain::detail::set_log_sink({});
  dtrain::set_log_level(saved);

  CHECK_FALSE(overlapped.load());
  REQUIRE(lines.size() == threads * per_thread);
  std::vector<int> next(threads, 0);
  for (const std::string& line : lines) {
    int t = -1;
    int i = -1;
    const auto pos = line.find("] info: thread ");
    REQUIRE(pos != std::string::npos);
    REQUIRE(std::sscanf(line.c_str() + pos, "] info: thread %d line %d", &t, &i) == 2);
    REQUIRE(t >= 0);
    REQUIRE(t < threads);
    CHECK(i == next[t]);  // each thread's lines in its own order
    next[t] = i + 1;
    CHECK(line.size() - line.rfind(' ') - 1 == 200);
  }
}

TEST_CASE("the default sink writes whole lines to stderr") {
  std::FILE* file = std::tmpfile();
  REQUIRE(file != nullptr);
  std::fflush(stderr);
  const int saved_fd = ::dup(STDERR_FILENO);
  REQUIRE(saved_fd >= 0);
  REQUIRE(::dup2(::fileno(file), STDERR_FILENO) >= 0);
  {
    const LogLevel saved = dtrain::log_level();
    dtrain::set_log_level(LogLevel::info);
    dtrain::detail::set_log_sink([](std::string_view) {});
    dtrain::detail::set_log_sink({});  // back to the default
    dtrain::detail::log(LogLevel::info, "to stderr {}", 42);
    dtrain::detail::log(LogLevel::debug, "not shown");
    dtrain::set_log_level(saved);
  }
  ::dup2(saved_fd, STDERR_FILENO);
  ::close(saved_fd);

  std::rewind(file);
  std::string text;
  char buf[256];
  while (std::fgets(buf, sizeof buf, file) != nullptr) text += buf;
  std::fclose(file);
  CHECK(text.rfind("[dtrain ", 0) == 0);
  CHECK(text.find("] info: to stderr 42\n") != std::string::npos);
  CHECK(text.find("not shown") == std::string::npos);
  CHECK(text.back() == '\n');
}
