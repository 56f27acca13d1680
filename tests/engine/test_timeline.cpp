// The timeline: rank 0 writes a Chrome-trace JSON file with one row per tensor and its phases.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "dtrain/runtime/grouped_collectives.hpp"
#include "dtrain/runtime/process_set.hpp"
#include "engine_test.hpp"

namespace {

using namespace dtrain;
using nlohmann::json;

// A per-test path that every rank agrees on (only rank 0 writes it).
std::filesystem::path timeline_path(const std::string& tag) {
  long pid = static_cast<long>(::getpid());
  MPI_Bcast(&pid, 1, MPI_LONG, 0, MPI_COMM_WORLD);
  return std::filesystem::temp_directory_path() /
         fmt::format("dtrain_engine_timeline_{}_{}.json", tag, pid);
}

std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A field of an event: empty, or -1, when it is absent or of another type.
std::string text_of(const json& e, const char* key) {
  const auto it = e.find(key);
  return it != e.end() && it->is_string() ? it->get<std::string>() : std::string();
}
double number_of(const json& e, const char* key) {
  const auto it = e.find(key);
  return it != e.end() && it->is_number() ? it->get<double>() : -1;
}

// The events of a timeline, by tensor row.
struct Trace {
  json root;
  std::map<std::string, std::multiset<std::string>> phases;  // tensor -> event names on its row
  std::multiset<std::string> global;                          // events not on a tensor row
  std::string last_event;
  std::size_t bad_events = 0;                                 // events missing required fields
};

Trace load(const std::filesystem::path& p) {
  Trace t;
  t.root = json::parse(read_file(p));
  REQUIRE(t.root.is_array());
  std::map<double, std::string> rows;
  for (const json& e : t.root) {
    if (!e.is_object() || text_of(e, "name").empty() || text_of(e, "ph").empty() ||
        number_of(e, "pid") < 0 || number_of(e, "tid") < 0) {
      ++t.bad_events;
      continue;
    }
    if (text_of(e, "ph") == "M" && text_of(e, "name") == "thread_name") {
      const auto args = e.find("args");
      if (args == e.end()) {
        ++t.bad_events;
        continue;
      }
      rows[number_of(e, "tid")] = text_of(*args, "name");
    }
  }
  for (const json& e : t.root) {
    if (!e.is_object() || text_of(e, "ph") == "M") continue;
    if (text_of(e, "ph") == "X" && (number_of(e, "ts") < 0 || number_of(e, "dur") < 0))
      ++t.bad_events;
    t.last_event = text_of(e, "name");
    if (auto it = rows.find(number_of(e, "tid")); it != rows.end())
      t.phases[it->second].insert(text_of(e, "name"));
    else
      t.global.insert(text_of(e, "name"));
  }
  return t;
}

}  // namespace

TEST_CASE("the JSON checker rejects what a strict parser rejects") {
  CHECK_NOTHROW(json::parse(R"([{"a":1.5e-3,"b":[true,false,null],"c":"x\"\u00e9"}])"));
  for (const char* bad : {"[", "[1,]", R"({"a":1,})", "[NaN]", "[01x]", "[\"\x01\"]",
                          R"({"a" 1})", "[1] [2]", "", R"(["\q"])", "[-]", "[1.]"}) {
    CAPTURE(bad);
    CHECK_THROWS(json::parse(bad));
  }
}

TEST_CASE("the timeline holds every phase of every tensor and is valid JSON after shutdown") {
  const auto path = timeline_path("phases");
  const int size = test::world_size();
  {
    Config c = Config::from_env();
    c.timeline_path = path.string();
    c.timeline_mark_cycles = true;
    test::Initialized dt(c);
    std::vector<std::vector<float>> group(3, std::vector<float>(50, 1.0f));
    grouped_allreduce(group, {.op = ReduceOp::Sum, .name = "tl.grp"});  // fused
    std::vector<double> lone(10, 1.0);
    allreduce(lone, {.name = "tl.lone"});
    allreduce(lone, {.name = "tl.lone"});  // the second time from the response cache
    std::vector<std::int32_t> rows(2, 1);
    (void)allgather(rows, "tl.gather");
    broadcast(rows, 0, "tl.bcast");
    // Names with characters JSON must escape still give a valid file.
    std::vector<float> odd(1, 1.0f);
    allreduce(odd, {.name = "tl.\"quoted\"\\back\tslash"});
  }
  if (test::world_rank() != 0) return;
  REQUIRE(std::filesystem::exists(path));
  Trace t = load(path);
  std::filesystem::remove(path);
  CHECK(t.bad_events == 0);

  for (int k = 0; k < 3; ++k) {
    const std::string name = "tl.grp." + std::to_string(k);
    CAPTURE(name);
    REQUIRE(t.phases.count(name) == 1);
    const auto& ph = t.phases[name];
    for (const char* phase : {"NEGOTIATE_ALLREDUCE", "QUEUE", "MEMCPY_IN_FUSION_BUFFER",
                              "MPI_ALLREDUCE", "MEMCPY_OUT_FUSION_BUFFER"})
      CHECK_MESSAGE(ph.count(phase) == 1, phase);
    for (int r = 0; r < size; ++r) CHECK(ph.count("READY_RANK_" + std::to_string(r)) == 1);
  }
  REQUIRE(t.phases.count("tl.lone") == 1);
  CHECK(t.phases["tl.lone"].count("NEGOTIATE_ALLREDUCE") == 2);
  CHECK(t.phases["tl.lone"].count("QUEUE") == 2);
  CHECK(t.phases["tl.lone"].count("MPI_ALLREDUCE") == 2);
  CHECK(t.phases["tl.lone"].count("READY_RANK_0") == 2);
  CHECK(t.phases["tl.gather"].count("NEGOTIATE_ALLGATHER") == 1);
  CHECK(t.phases["tl.gather"].count("MPI_ALLGATHER") == 1);
  CHECK(t.phases["tl.bcast"].count("NEGOTIATE_BROADCAST") == 1);
  CHECK(t.phases["tl.bcast"].count("MPI_BCAST") == 1);
  CHECK(t.phases["tl.\"quoted\"\\back\tslash"].count("MPI_ALLREDUCE") == 1);
  CHECK(t.global.count("CYCLE_START") >= 1);  // DTRAIN_TIMELINE_MARK_CYCLES
}

TEST_CASE("a process set's ops have rows of their own; fused allgathers show their copies") {
  const auto path = timeline_path("sets");
  const int size = test::world_size();
  {
    Config c = Config::from_env();
    c.timeline_path = path.string();
    test::Initialized dt(c);
    std::vector<int> ends_ranks = {0};  // rank 0 writes the timeline; rank 1 stays out
    if (size > 2) ends_ranks.push_back(size - 1);
    const ProcessSet ends = add_process_set(ends_ranks);
    std::vector<float> x(4, 1.0f);
    allreduce(x, {.name = "ps.x"});
    if (ends.included()) {
      allreduce(x, {.name = "ps.x", .process_set = ends});  // the same name on the set
      std::vector<std::vector<std::int32_t>> g(2, std::vector<std::int32_t>(3, 1));
      (void)grouped_allgather(g, {.name = "ps.g", .process_set = ends});  // one fused collective
    }
  }
  if (test::world_rank() != 0) return;
  REQUIRE(std::filesystem::exists(path));
  Trace t = load(path);
  std::filesystem::remove(path);
  CHECK(t.bad_events == 0);
  const std::string on_set = " (process set 1)";
  REQUIRE(t.phases.count("ps.x") == 1);
  CHECK(t.phases["ps.x"].count("MPI_ALLREDUCE") == 1);
  for (int r = 0; r < size; ++r) CHECK(t.phases["ps.x"].count("READY_RANK_" + std::to_string(r)) == 1);
  REQUIRE(t.phases.count("ps.x" + on_set) == 1);
  const auto& mine = t.phases["ps.x" + on_set];
  CHECK(mine.count("NEGOTIATE_ALLREDUCE") == 1);
  CHECK(mine.count("MPI_ALLREDUCE") == 1);
  for (int r = 0; r < size; ++r)  // only the members were waited for
    CHECK(mine.count("READY_RANK_" + std::to_string(r)) == (r == 0 || (r == size - 1 && size > 2)));
  for (int k = 0; k < 2; ++k) {
    const std::string row = "ps.g." + std::to_string(k) + on_set;
    CAPTURE(row);
    REQUIRE(t.phases.count(row) == 1);
    for (const char* phase : {"NEGOTIATE_ALLGATHER", "MEMCPY_IN_FUSION_BUFFER", "MPI_ALLGATHER",
                              "MEMCPY_OUT_FUSION_BUFFER"})
      CHECK_MESSAGE(t.phases[row].count(phase) == 1, phase);
  }
}

TEST_CASE("the size cap truncates the timeline with a marker and keeps it valid JSON") {
  const auto path = timeline_path("cap");
  constexpr std::int64_t cap = 4096;
  {
    Config c = Config::from_env();
    c.timeline_path = path.string();
    c.timeline_max_bytes = cap;
    test::Initialized dt(c);
    std::vector<float> v(4, 1.0f);
    for (int i = 0; i < 100; ++i) allreduce(v, {.name = fmt::format("cap.{}", i)});
  }
  if (test::world_rank() != 0) return;
  REQUIRE(std::filesystem::exists(path));
  const auto bytes = std::filesystem::file_size(path);
  Trace t = load(path);
  std::filesystem::remove(path);
  CHECK(t.bad_events == 0);
  CHECK(t.last_event == "TIMELINE_TRUNCATED");
  CHECK(t.global.count("TIMELINE_TRUNCATED") == 1);
  CHECK(bytes <= cap + 1024);  // stops at the cap, give or take the event that crossed it
  CHECK(t.phases.count("cap.99") == 0);
}

TEST_CASE("start_timeline and stop_timeline record only the ops in between") {
  const auto path = timeline_path("runtime");
  {
    test::Initialized dt;
    std::vector<float> v(4, 1.0f);
    allreduce(v, {.name = "rt.before"});
    start_timeline(path.string());
    allreduce(v, {.name = "rt.during"});
    stop_timeline();
    allreduce(v, {.name = "rt.after"});
    if (test::world_rank() == 0) {
      // Complete and valid already at stop_timeline(), without waiting for shutdown.
      Trace t = load(path);
      CHECK(t.bad_events == 0);
      CHECK(t.phases.count("rt.during") == 1);
      CHECK(t.phases["rt.during"].count("MPI_ALLREDUCE") == 1);
      CHECK(t.phases.count("rt.before") == 0);
      // Ranks that submitted "rt.after" before rank 0 stopped the timeline may have left their
      // readiness ticks; none of its phases are recorded.
      for (const char* phase : {"NEGOTIATE_ALLREDUCE", "QUEUE", "MPI_ALLREDUCE"})
        CHECK(t.phases["rt.after"].count(phase) == 0);
    }
  }
  if (test::world_rank() == 0) std::filesystem::remove(path);
}

TEST_CASE("an unwritable timeline path is an error naming the path") {
  test::Initialized dt;
  if (test::world_rank() != 0) return;  // only rank 0 writes, so only rank 0 can fail
  const std::string bad = "/nonexistent-dir-for-dtrain-test/timeline.json";
  try {
    start_timeline(bad);
    FAIL_CHECK("start_timeline accepted an unwritable path");
  } catch (const InvalidArgumentError& e) {
    CHECK(test::contains(e.what(), bad));
  }
}

TEST_CASE("an unwritable DTRAIN_TIMELINE fails init on every rank instead of hanging the others") {
  const std::string bad = "/nonexistent-dir-for-dtrain-test/timeline.json";
  Config c = Config::from_env();
  c.timeline_path = bad;
  std::string what;
  try {
    dtrain::init(c);
  } catch (const InvalidArgumentError& e) {
    what = e.what();
  }
  CAPTURE(what);
  if (!test::all_ranks(!what.empty())) {
    // Some ranks initialized while rank 0 could not: any collective now, shutdown() included,
    // would wait forever for rank 0's engine.
    std::fprintf(stderr, "[rank %d] init with an unwritable timeline path did not fail on every "
                         "rank (this rank: %s)\n", test::world_rank(), what.empty() ? "initialized" : "failed");
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  CHECK(test::contains(what, bad));
  CHECK(test::contains(what, "DTRAIN_TIMELINE"));
  CHECK_FALSE(dtrain::is_initialized());
  // Nothing is left half-initialized: dtrain starts normally afterwards.
  test::Initialized dt;
  std::vector<float> v(3, 1.0f);
  allreduce(v, {.op = ReduceOp::Sum, .name = "after.failed.init"});
  CHECK(v == std::vector<float>(3, static_cast<float>(dtrain::size())));
}
