// The profile writer: whole lines only, whatever happens to the process or the disk, and a clear
// error for a file it cannot create. Crashes and a full disk are real: a child process killed by
// SIGKILL mid-write, a file size limit (RLIMIT_FSIZE), and /dev/full.
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "dtrain/core/logging.hpp"
#include "dtrain/profile/record_writer.hpp"

namespace {

using namespace std::chrono_literals;
using dtrain::detail::ProfileRecord;
using dtrain::detail::RecordWriter;
using dtrain::detail::StepRecord;

std::filesystem::path temp_file(const std::string& tag) {
  return std::filesystem::temp_directory_path() /
         ("dtrain_profile_writer_" + tag + "_" + std::to_string(::getpid()) + ".jsonl");
}

StepRecord step(std::int64_t i) {
  StepRecord r;
  r.step = i;
  r.t = static_cast<double>(i) * 0.01;
  r.duration = 10ms;
  r.phases = {{"data", 1ms}, {"forward", 3ms}, {"backward", 4ms}, {"communication_wait", 2ms}};
  r.engine = dtrain::EngineStats{};
  return r;
}

std::string read_all(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Every line complete and valid JSON; returns the step numbers in order.
std::vector<std::int64_t> whole_lines(const std::string& text) {
  std::vector<std::int64_t> steps;
  if (!text.empty()) CHECK(text.back() == '\n');
  std::size_t begin = 0;
  while (begin < text.size()) {
    const std::size_t end = text.find('\n', begin);
    if (end == std::string::npos) {
      FAIL_CHECK("a partial last line: " << text.substr(begin, 80));
      break;
    }
    const std::string line = text.substr(begin, end - begin);
    begin = end + 1;
    if (line.find_first_not_of(' ') == std::string::npos) continue;  // padding
    const auto j = nlohmann::json::parse(line);
    steps.push_back(j.at("step").get<std::int64_t>());
  }
  return steps;
}

}  // namespace

TEST_CASE("records come out as whole lines, in order, by flush() and by close()") {
  const auto path = temp_file("order");
  {
    RecordWriter w(path.string());
    for (int i = 0; i < 10; ++i) w.push(step(i));
    w.flush();
    const auto flushed = whole_lines(read_all(path));
    CHECK(flushed.size() == 10);
    for (int i = 10; i < 1000; ++i) w.push(step(i));
    w.close();
    w.push(step(5000));  // after close: dropped
  }
  const auto steps = whole_lines(read_all(path));
  REQUIRE(steps.size() == 1000);
  for (int i = 0; i < 1000; ++i) CHECK(steps[static_cast<std::size_t>(i)] == i);
  std::filesystem::remove(path);
}

TEST_CASE("no write crosses a page of the file; a line that would is moved past padding") {
  const auto path = temp_file("pages");
  {
    RecordWriter w(path.string());
    for (int i = 0; i < 500; ++i) w.push(step(i));
  }
  const std::string text = read_all(path);
  const auto steps = whole_lines(text);
  REQUIRE(steps.size() == 500);
  for (std::size_t i = 0; i < steps.size(); ++i) CHECK(steps[i] == static_cast<std::int64_t>(i));
  // Every page of the file ends with the end of a line.
  for (std::size_t end = RecordWriter::page_bytes; end <= text.size();
       end += RecordWriter::page_bytes)
    CHECK(text[end - 1] == '\n');
  CHECK(text.size() > 2 * RecordWriter::page_bytes);
  std::filesystem::remove(path);
}

TEST_CASE("a process killed while writing leaves only whole lines") {
  const auto path = temp_file("killed");
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    RecordWriter w(path.string());
    // Push far more than the writer keeps up with, then die without any clean-up, while the
    // writer thread is formatting or writing.
    for (std::int64_t i = 0;; ++i) {
      w.push(step(i));
      if (i == 1000) w.flush();  // some lines are surely in the file
      if (i == 200000) raise(SIGKILL);
    }
  }
  int status = 0;
  waitpid(child, &status, 0);
  CHECK(WIFSIGNALED(status));
  const std::string text = read_all(path);
  CHECK(!text.empty());
  const auto steps = whole_lines(text);
  for (std::size_t i = 0; i < steps.size(); ++i) CHECK(steps[i] == static_cast<std::int64_t>(i));
  std::filesystem::remove(path);
}

TEST_CASE("a write cut short by a size limit is rolled back to the last whole line") {
  const auto path = temp_file("limit");
  std::filesystem::remove(path);
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    signal(SIGXFSZ, SIG_IGN);  // make the limit an EFBIG error instead of a fatal signal
    rlimit limit{4000, 4000};
    setrlimit(RLIMIT_FSIZE, &limit);
    RecordWriter w(path.string());
    for (int i = 0; i < 5; ++i) w.push(step(i));  // about 1 KB: fits
    w.flush();
    for (int i = 5; i < 100; ++i) w.push(step(i));  // does not fit: written in part, then cut
    w.flush();
    w.close();
    _exit(0);
  }
  int status = 0;
  waitpid(child, &status, 0);
  REQUIRE(WIFEXITED(status));
  // Whatever fitted, as whole lines: at least the first flush, never the records past the limit.
  const std::string text = read_all(path);
  const auto steps = whole_lines(text);
  CHECK(text.size() <= 4000);
  CHECK(steps.size() >= 5);
  CHECK(steps.size() < 100);
  for (std::size_t i = 0; i < steps.size(); ++i) CHECK(steps[i] == static_cast<std::int64_t>(i));
  std::filesystem::remove(path);
}

TEST_CASE("a full disk stops the profile with one warning naming the file") {
  std::vector<std::string> lines;
  std::mutex m;
  dtrain::detail::set_log_sink([&](std::string_view line) {
    std::lock_guard lock(m);
    lines.emplace_back(line);
  });
  {
    RecordWriter w("/dev/full");
    for (int i = 0; i < 10; ++i) w.push(step(i));
    w.flush();  // returns although nothing could be written
    for (int i = 10; i < 20; ++i) w.push(step(i));
    w.flush();
  }
  dtrain::detail::set_log_sink(nullptr);
  REQUIRE(lines.size() == 1);
  CHECK(lines[0].find("/dev/full") != std::string::npos);
  CHECK(lines[0].find("No space left on device") != std::string::npos);
}

TEST_CASE("a file that cannot be created is an error naming it and the reason") {
  CHECK_THROWS_WITH_AS(RecordWriter("/nonexistent-dtrain-folder/rank-0.jsonl"),
                       doctest::Contains("dtrain: cannot write the profile file "
                                         "'/nonexistent-dtrain-folder/rank-0.jsonl': No such file "
                                         "or directory"),
                       dtrain::InvalidArgumentError);
}
