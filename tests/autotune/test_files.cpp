// The autotuner's files: the CSV log (DTRAIN_AUTOTUNE_LOG) and the saved result
// (DTRAIN_AUTOTUNE_CACHE). Every bad saved result (missing, unreadable, corrupt in any byte,
// stale in any part of its key) must end in a fresh tune with a warning, never a crash.
#include <doctest/doctest.h>
#include <stdlib.h>
#include <unistd.h>

#include <charconv>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "dtrain/autotune/saved_result.hpp"
#include "dtrain/autotune/tuner.hpp"
#include "dtrain/autotune/tuning_log.hpp"
#include "unit/log_capture.hpp"

using namespace dtrain::autotune;
using dtrain::LogLevel;
using dtrain::test::LogCapture;
namespace fs = std::filesystem;

namespace {

constexpr std::int64_t MiB = std::int64_t{1} << 20;

// A fresh directory, removed with everything in it at the end of the test.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "dtrain-autotune-XXXXXX").string();
    REQUIRE(::mkdtemp(pattern.data()) != nullptr);
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  std::size_t entries() const {
    return static_cast<std::size_t>(std::distance(fs::directory_iterator(path_), fs::directory_iterator()));
  }

 private:
  fs::path path_;
};

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_all(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> out;
  std::string item;
  std::istringstream in(text);
  while (std::getline(in, item, sep)) out.push_back(item);
  if (!text.empty() && text.back() == sep) out.push_back("");
  return out;
}

std::string with_checksum(const std::string& body) {
  return body + fmt::format("checksum {:08x}\n", dtrain::detail::crc32c(body.data(), body.size()));
}

const SearchSpace& default_space() {
  static const SearchSpace space{SearchSpaceOptions{}};
  return space;
}

JobIdentity job() {
  return JobIdentity{4, {2, 2}, tensor_set_hash({{"conv1.weight", dtrain::DataType::float32, 1728},
                                                 {"fc.bias", dtrain::DataType::float32, 10}})};
}

SavedResult result() {
  return SavedResult{Knobs{48 * MiB, 2.75, false, true, false, 3}, 123456789.5};
}

}  // namespace

TEST_CASE("tuning log: header and one row per kind of record") {
  CHECK(tuning_log_header() ==
        "kind,configuration,generation,fusion_threshold_bytes,cycle_time_ms,"
        "hierarchical_allreduce,response_cache,fusion_pipeline,mpi_pieces_in_flight,steps,bytes,"
        "seconds,"
        "score_bytes_per_second");
  TuningRecord r;
  r.kind = RecordKind::sample;
  r.configuration = 3;
  r.generation = 2;
  r.knobs = Knobs{64 * MiB, 2.5, false, true, true, 4};
  r.steps = 10;
  r.bytes = 1048576;
  r.seconds = 0.25;
  r.score_bytes_per_second = 4194304;
  CHECK(tuning_log_row(r) == "sample,3,2,67108864,2.5,0,1,1,4,10,1048576,0.25,4194304");
  r.kind = RecordKind::median;
  CHECK(tuning_log_row(r) == "median,3,2,67108864,2.5,0,1,1,4,,,,4194304");
  r.kind = RecordKind::choice;
  CHECK(tuning_log_row(r) == "choice,3,2,67108864,2.5,0,1,1,4,,,,4194304");
  r.kind = RecordKind::warmup;
  r.configuration = -1;
  r.generation = 0;
  CHECK(tuning_log_row(r) == "warmup,,0,67108864,2.5,0,1,1,4,10,1048576,0.25,4194304");
  r.kind = RecordKind::reused;
  CHECK(tuning_log_row(r) == "reused,,0,67108864,2.5,0,1,1,4,,,,4194304");
}

TEST_CASE("tuning log of a whole run: one line per record, numbers that read back exactly") {
  TempDir dir;
  const std::string path = dir.file("autotune.csv");
  TunerOptions o;
  o.autotune_steps_per_sample = 2;
  o.samples_per_configuration = 3;
  o.autotune_bayes_opt_max_samples = 6;
  Tuner tuner(SearchSpace(SearchSpaceOptions{}), o);
  {
    TuningLog log(path);
    REQUIRE(log.is_open());
    std::size_t written = 0;
    int step = 0;
    while (!tuner.done()) {
      const double seconds = 0.05 + 0.01 * (step++ % 7) +
                             1e-3 * std::abs(std::log2(tuner.knobs().cycle_time_ms));
      tuner.record_step({33 * MiB + 7, seconds, tuner.generation()});
      for (; written < tuner.history().size(); ++written) log.write(tuner.history()[written]);
    }
  }
  const std::vector<std::string> lines = split(read_all(path), '\n');
  REQUIRE(lines.size() == tuner.history().size() + 2);  // header, rows, and the final newline
  CHECK(lines.front() == tuning_log_header());
  CHECK(lines.back().empty());
  CHECK(lines[lines.size() - 2].rfind("choice,", 0) == 0);
  for (std::size_t i = 0; i < tuner.history().size(); ++i) {
    const auto fields = split(lines[i + 1], ',');
    REQUIRE(fields.size() == 13);
    const TuningRecord& r = tuner.history()[i];
    CHECK(fields[0] == to_string(r.kind));
    double score = 0.0, cycle = 0.0;
    std::from_chars(fields[12].data(), fields[12].data() + fields[12].size(), score);
    std::from_chars(fields[4].data(), fields[4].data() + fields[4].size(), cycle);
    CHECK(score == r.score_bytes_per_second);
    CHECK(cycle == r.knobs.cycle_time_ms);
    CHECK(fields[3] == std::to_string(r.knobs.fusion_threshold_bytes));
    CHECK(fields[8] == std::to_string(r.knobs.pieces_in_flight));
  }
}

TEST_CASE("tuning log that cannot be opened or written: a warning, and tuning goes on") {
  TempDir dir;
  {
    LogCapture capture(LogLevel::warning);
    TuningLog log(dir.file("no/such/dir/autotune.csv"));
    CHECK_FALSE(log.is_open());
    log.write(TuningRecord{});  // does nothing
    CHECK(capture.count({"autotune", "no/such/dir/autotune.csv", "DTRAIN_AUTOTUNE_LOG"}) == 1);
  }
  if (fs::exists("/dev/full")) {
    LogCapture capture(LogLevel::warning);
    TuningLog log("/dev/full");  // opens, but every write fails with ENOSPC
    CHECK_FALSE(log.is_open());
    log.write(TuningRecord{});
    CHECK(capture.count({"/dev/full", "failed"}) == 1);
  }
  // Moving transfers the file.
  TuningLog a(dir.file("a.csv"));
  TuningLog b(std::move(a));
  CHECK(b.is_open());
  CHECK_FALSE(a.is_open());
}

TEST_CASE("tensor-set hash depends on names, dtypes and sizes, not on order") {
  using dtrain::DataType;
  const std::vector<TensorSignature> set = {{"a", DataType::float32, 10}, {"b", DataType::float16, 20}};
  const std::uint64_t h = tensor_set_hash(set);
  CHECK(tensor_set_hash({set[1], set[0]}) == h);
  CHECK(tensor_set_hash({{"a", DataType::float32, 10}, {"c", DataType::float16, 20}}) != h);
  CHECK(tensor_set_hash({{"a", DataType::float32, 10}, {"b", DataType::bfloat16, 20}}) != h);
  CHECK(tensor_set_hash({{"a", DataType::float32, 10}, {"b", DataType::float16, 21}}) != h);
  CHECK(tensor_set_hash({{"a", DataType::float32, 10}}) != h);
}

TEST_CASE("saved result: round trip") {
  TempDir dir;
  const std::string path = dir.file("autotune.cache");
  REQUIRE(save_result(path, job(), default_space(), result()));
  CHECK(dir.entries() == 1);  // no temporary left behind
  const SavedResultLoad load = load_saved_result(path, job(), default_space());
  REQUIRE(load.status == SavedResultStatus::loaded);
  CHECK(load.result->knobs == result().knobs);
  CHECK(load.result->score_bytes_per_second == result().score_bytes_per_second);

  // Hosts are compared as a layout, not in order.
  JobIdentity reordered = job();
  reordered.ranks_per_host = {2, 2};
  JobIdentity uneven = job();
  uneven.ranks_per_host = {3, 1};
  REQUIRE(save_result(path, uneven, default_space(), result()));
  uneven.ranks_per_host = {1, 3};
  CHECK(load_saved_result(path, uneven, default_space()).status == SavedResultStatus::loaded);

  LogCapture capture(LogLevel::info);
  const auto reused = reuse_saved_result(path, uneven, default_space());
  REQUIRE(reused);
  CHECK(reused->knobs == result().knobs);
  CHECK(capture.count({"reusing the saved result", path}) == 1);
  CHECK(capture.count({"warning"}) == 0);
}

TEST_CASE("saved result: a missing file is the first run, not a warning") {
  TempDir dir;
  const std::string path = dir.file("absent.cache");
  CHECK(load_saved_result(path, job(), default_space()).status == SavedResultStatus::missing);
  LogCapture capture(LogLevel::info);
  CHECK_FALSE(reuse_saved_result(path, job(), default_space()));
  CHECK(capture.count({"info", "no saved result", path}) == 1);
  CHECK(capture.count({"warning"}) == 0);
}

TEST_CASE("saved result: an unreadable file is a warning and a fresh tune") {
  TempDir dir;
  const std::string path = dir.file("is-a-directory");
  fs::create_directory(path);
  CHECK(load_saved_result(path, job(), default_space()).status == SavedResultStatus::unreadable);
  LogCapture capture(LogLevel::warning);
  CHECK_FALSE(reuse_saved_result(path, job(), default_space()));
  CHECK(capture.count({"warning", "cannot read the saved result", path, "tuning from scratch"}) == 1);
}

TEST_CASE("saved result: every truncation and every changed byte is detected") {
  TempDir dir;
  const std::string path = dir.file("autotune.cache");
  const std::string good = saved_result_text(job(), default_space(), result());
  for (std::size_t n = 0; n < good.size(); ++n) {
    CAPTURE(n);
    const SavedResultLoad load = parse_saved_result(good.substr(0, n), job(), default_space());
    CHECK(load.status == SavedResultStatus::corrupt);
  }
  for (std::size_t i = 0; i < good.size(); ++i) {
    for (unsigned char flip : {0x01, 0x20, 0x80}) {
      std::string bad = good;
      bad[i] = static_cast<char>(static_cast<unsigned char>(bad[i]) ^ flip);
      const SavedResultLoad load = parse_saved_result(bad, job(), default_space());
      CAPTURE(i);
      CHECK(load.status != SavedResultStatus::loaded);
      CHECK_FALSE(load.result);
    }
  }
  // Through the file system, with the warning.
  write_all(path, good.substr(0, good.size() / 2));
  LogCapture capture(LogLevel::warning);
  CHECK_FALSE(reuse_saved_result(path, job(), default_space()));
  CHECK(capture.count({"warning", "ignoring the saved result", path, "checksum"}) == 1);
}

TEST_CASE("saved result: garbage, empty and oversized files are corrupt") {
  TempDir dir;
  const std::string path = dir.file("autotune.cache");
  for (const std::string& text :
       {std::string(), std::string("\n"), std::string("checksum 0000000000000000\n"),
        std::string("\0\0\0\xff\xfe binary", 12), std::string(70000, 'x'),
        std::string(70000, '\n'), with_checksum(std::string(70000, '#'))}) {
    write_all(path, text);
    const SavedResultLoad load = load_saved_result(path, job(), default_space());
    CHECK(load.status == SavedResultStatus::corrupt);
    CHECK_FALSE(load.reason.empty());
  }
}

TEST_CASE("saved result: well-formed checksum over bad contents is still corrupt") {
  const std::string good = saved_result_text(job(), default_space(), result());
  const std::string body = good.substr(0, good.rfind("checksum "));
  auto replace = [&](const std::string& from, const std::string& to) {
    std::string b = body;
    const auto at = b.find(from);
    REQUIRE(at != std::string::npos);
    b.replace(at, from.size(), to);
    return with_checksum(b);
  };
  for (const std::string& bad : {
           replace("cycle_time_ms 2.75\n", ""),                                // missing field
           replace("cycle_time_ms 2.75\n", "cycle_time_ms 2.75\nextra 1\n"),  // extra field
           replace("\ncycle_time_ms 2.75", "\ncycle_time 2.75"),                // unknown key
           replace("cycle_time_ms 2.75", "cycle_time_ms abc"),
           replace("cycle_time_ms 2.75", "cycle_time_ms nan"),
           replace("cycle_time_ms 2.75", "cycle_time_ms inf"),
           replace("cycle_time_ms 2.75", "cycle_time_ms 2.75x"),
           replace("cycle_time_ms 2.75", "cycle_time_ms 1000"),                // outside the space
           replace("fusion_threshold_bytes 50331648", "fusion_threshold_bytes -1"),
           replace("fusion_threshold_bytes 50331648", "fusion_threshold_bytes 99999999999999999999"),
           replace("response_cache 1", "response_cache 2"),
           replace("world_size 4", "world_size four"),
           replace("tensor_set ", "tensor_set 0x"),
           replace("score_bytes_per_second 123456789.5", "score_bytes_per_second nan"),
           replace("format 3\n", ""),
           replace("mpi_pieces_in_flight 3", "mpi_pieces_in_flight 2.5"),
           replace("mpi_pieces_in_flight 3", "mpi_pieces_in_flight 9"),  // outside the space
           replace("mpi_pieces_in_flight 3\n", ""),
           replace("world_size 4\n", "world_size4\n"),
       }) {
    const SavedResultLoad load = parse_saved_result(bad, job(), default_space());
    CAPTURE(bad);
    CHECK(load.status == SavedResultStatus::corrupt);
    CHECK_FALSE(load.result);
  }
  // Another format version is stale, not corrupt: written by another dtrain.
  const SavedResultLoad other = parse_saved_result(replace("format 3", "format 4"), job(), default_space());
  CHECK(other.status == SavedResultStatus::stale);
  CHECK(other.reason.find("format 4") != std::string::npos);
}

TEST_CASE("saved result: another world size, host layout, tensor set or search space is stale") {
  TempDir dir;
  const std::string path = dir.file("autotune.cache");
  REQUIRE(save_result(path, job(), default_space(), result()));

  JobIdentity bigger = job();
  bigger.world_size = 8;
  JobIdentity hosts = job();
  hosts.ranks_per_host = {4};
  JobIdentity model = job();
  model.tensor_set = tensor_set_hash({{"conv1.weight", dtrain::DataType::float16, 1728}});
  SearchSpaceOptions fixed;
  fixed.fixed = {Knob::fusion_pipeline};
  fixed.base.fusion_pipeline = false;
  const SearchSpace other_space(fixed);
  SearchSpaceOptions wider;
  wider.max_fusion_threshold_bytes = 4096 * MiB;
  const SearchSpace wider_space(wider);

  struct Case {
    JobIdentity job;
    const SearchSpace* space;
    std::string mentions;
  };
  for (const Case& c : {Case{bigger, &default_space(), "world size 4 (now 8)"},
                        Case{hosts, &default_space(), "ranks per host 2,2 (now 4)"},
                        Case{model, &default_space(), "tensor set"},
                        Case{job(), &other_space, "search space"},
                        Case{job(), &wider_space, "search space"}}) {
    CAPTURE(c.mentions);
    const SavedResultLoad load = load_saved_result(path, c.job, *c.space);
    CHECK(load.status == SavedResultStatus::stale);
    CHECK(load.reason.find(c.mentions) != std::string::npos);
    LogCapture capture(LogLevel::warning);
    CHECK_FALSE(reuse_saved_result(path, c.job, *c.space));
    CHECK(capture.count({"warning", path, c.mentions, "tuning from scratch"}) == 1);
  }
  // Every difference is named at once.
  JobIdentity all = bigger;
  all.tensor_set = model.tensor_set;
  const SavedResultLoad load = load_saved_result(path, all, default_space());
  CHECK(load.reason.find("world size") != std::string::npos);
  CHECK(load.reason.find("tensor set") != std::string::npos);

  // A fresh tune replaces the stale file.
  REQUIRE(save_result(path, bigger, default_space(), result()));
  CHECK(load_saved_result(path, bigger, default_space()).status == SavedResultStatus::loaded);
  CHECK(dir.entries() == 1);
}

TEST_CASE("saved result that cannot be written: a warning, no crash, nothing left behind") {
  TempDir dir;
  LogCapture capture(LogLevel::warning);
  const std::string path = dir.file("no/such/dir/autotune.cache");
  CHECK_FALSE(save_result(path, job(), default_space(), result()));
  CHECK(capture.count({"warning", "cannot save the result", path, "next run will tune again"}) == 1);
  // A directory in the way of the rename.
  const std::string blocked = dir.file("blocked");
  fs::create_directory(blocked);
  fs::create_directory(blocked + "/inside");
  CHECK_FALSE(save_result(blocked, job(), default_space(), result()));
  CHECK(capture.count({"cannot rename"}) == 1);
  CHECK(dir.entries() == 1);  // only the directory; its temporary file was removed
}
