// dtrain::Profiler across processes: each rank's file, what it records per step (phases, the
// engine's collectives and bytes, samples), start/stop ranges, the off state, and the errors that
// every rank raises together.
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>
#include <mpi.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "dtrain/dtrain.hpp"
#include "profile/profile_files.hpp"
#include "support/world.hpp"

namespace {

using namespace std::chrono_literals;
using nlohmann::json;
using dtrain_test_support::world_rank;
using dtrain_test_support::world_size;
using profile_test::busy_for;
using profile_test::fresh_dir;
using profile_test::of_type;
using profile_test::rank_file;
using profile_test::read_records;
using profile_test::remove_dir;

class Initialized {
 public:
  Initialized() { dtrain::init(dtrain::Config::from_env()); }
  ~Initialized() { dtrain::shutdown(); }
  Initialized(const Initialized&) = delete;
  Initialized& operator=(const Initialized&) = delete;
};

}  // namespace

TEST_CASE("every rank writes a file: header, steps with phases and engine counts, samples, end") {
  Initialized dtrain_on;
  const auto dir = fresh_dir("files");
  const int n = dtrain::size();
  std::vector<float> grad(1000, 1.0f);
  {
    dtrain::ProfilerOptions options;
    options.dir = dir.string();
    options.sample_interval = 100ms;
    dtrain::Profiler profiler(options);
    CHECK(profiler.enabled());
    CHECK(profiler.recording());
    // In the run's own folder (Note [Profile layout]), named by the run id checked below.
    const std::filesystem::path path = profiler.path();
    CHECK(path.filename() == "rank-" + std::to_string(dtrain::rank()) + ".jsonl");
    CHECK(path.parent_path().parent_path() == dir);
    for (int s = 0; s < 5; ++s) {
      auto step = profiler.step(32);
      {
        auto data = profiler.phase(dtrain::Phase::data);
        auto augment = profiler.phase("augment");  // nested: charged to augment, not data
        busy_for(200us);
      }
      {
        auto forward = profiler.phase(dtrain::Phase::forward);
        busy_for(300us);
      }
      {
        auto wait = profiler.phase(dtrain::Phase::communication_wait);
        dtrain::allreduce(grad, {.op = dtrain::ReduceOp::Sum, .name = "grad"});
      }
      auto nested = profiler.step();  // a step inside a step is not a step of its own
    }
    std::this_thread::sleep_for(120ms);  // at least one sampling period while recording
    CHECK(profiler.steps() == 10);
    // Moving the profiler keeps the recording going.
    dtrain::Profiler moved = std::move(profiler);
    CHECK(!profiler.enabled());
    CHECK(moved.recording());
  }
  MPI_Barrier(MPI_COMM_WORLD);

  std::string run_id;
  for (int r = 0; r < n; ++r) {
    CAPTURE(r);
    const auto file = rank_file(dir, r);
    const auto records = read_records(file);
    REQUIRE(records.size() >= 4);
    const json& h = records.front();
    CHECK(h.at("type") == "header");
    CHECK(h.at("format") == "dtrain-profile");
    CHECK(h.at("rank") == r);
    CHECK(h.at("size") == n);
    CHECK(h.at("sample_interval_ms") == 100);
    CHECK(h.at("cpu_count") >= 1);
    REQUIRE(h.contains("gpu"));
    if (r == 0) run_id = h.at("run_id").get<std::string>();
    CHECK(!run_id.empty());
    CHECK(h.at("run_id") == run_id);  // one run, the same id in every file
    CHECK(file.parent_path().filename() == run_id);  // and its folder's name
    CHECK(!h.contains("job_id"));  // not started by dtrainrun
    CHECK(!h.contains("attempt"));
    CHECK(records[1].at("type") == "start");
    CHECK(records.back().at("type") == "end");

    const auto steps = of_type(records, "step");
    REQUIRE(steps.size() == 5);
    for (int s = 0; s < 5; ++s) {
      const json& st = *steps[static_cast<std::size_t>(s)];
      CAPTURE(s);
      CHECK(st.at("step") == 2 * s);  // the nested step() counted too
      CHECK(st.at("samples") == 32);
      REQUIRE(st.contains("phases_ms"));
      const json* phases = &st.at("phases_ms");
      CHECK(phases->at("augment") >= 0.2);
      CHECK(phases->at("forward") >= 0.3);
      CHECK(phases->contains("data"));
      CHECK(!phases->contains("backward"));  // did not run
      double sum = st.at("other_ms").get<double>();
      for (const auto& [name, v] : phases->items()) sum += v.get<double>();
      CHECK(sum == doctest::Approx(st.at("duration_ms").get<double>()).epsilon(1e-3));
      REQUIRE(st.contains("engine"));
      const json* engine = &st.at("engine");
      CHECK(engine->at("collectives") == 1);  // one allreduce per step, nothing else
      CHECK(engine->at("bytes_reduced") == 4000);
    }
    const auto samples = of_type(records, "sample");
    REQUIRE(!samples.empty());
    CHECK(samples.front()->at("rss_bytes") > 0);
    CHECK(samples.front()->at("process_cpu_pct") >= 0);
    CHECK(samples.front()->at("t") > 0);
  }
  remove_dir(dir);
}

TEST_CASE("a profile closed within half a period keeps the engine's counts in a tail sample") {
  Initialized dtrain_on;
  const auto dir = fresh_dir("tail");
  std::vector<float> grad(10, 1.0f);
  {
    dtrain::ProfilerOptions options;
    options.dir = dir.string();
    options.sample_interval = 10s;  // no full period passes before the profiler is closed
    dtrain::Profiler profiler(options);
    for (int s = 0; s < 3; ++s) dtrain::allreduce(grad, {.op = dtrain::ReduceOp::Sum});
  }
  const auto records = read_records(rank_file(dir, dtrain::rank()));
  const auto samples = of_type(records, "sample");
  CHECK(samples.size() == 1);
  if (samples.size() == 1) {  // no REQUIRE: every rank must reach remove_dir's barrier
    const json& tail = *samples.front();
    CHECK(tail.value("engine", json::object()).value("collectives", 0) == 3);
    CHECK(!tail.contains("process_cpu_pct"));  // 10 ms CPU ticks say nothing about a short tail
  }
  remove_dir(dir);
}

TEST_CASE("start and stop record a chosen range of steps; the counter counts every step") {
  Initialized dtrain_on;
  const auto dir = fresh_dir("range");
  {
    dtrain::ProfilerOptions options;
    options.dir = dir.string();
    options.start_recording = false;
    dtrain::Profiler profiler(options);
    CHECK(!profiler.recording());
    auto run_step = [&] {
      auto s = profiler.step();
      auto p = profiler.phase(dtrain::Phase::forward);
    };
    run_step();  // 0
    run_step();  // 1
    profiler.start();
    run_step();  // 2
    run_step();  // 3
    profiler.stop();
    run_step();  // 4
    profiler.start();
    run_step();  // 5
    { auto outside = profiler.phase(dtrain::Phase::data); }  // outside any step: not charged
    CHECK(profiler.steps() == 6);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  const auto records = read_records(rank_file(dir, dtrain::rank()));
  std::vector<std::string> shape;
  for (const json& r : records) {
    const std::string type = r.at("type").get<std::string>();
    if (type == "sample") continue;
    shape.push_back(type == "step" ? "step " + std::to_string(r.at("step").get<int>())
                                   : type);
  }
  CHECK(shape == std::vector<std::string>{"header", "start", "step 2", "step 3", "stop", "start",
                                          "step 5", "stop", "end"});
  const auto stops = of_type(records, "stop");
  REQUIRE(stops.size() == 2);
  CHECK(stops[0]->at("steps") == 2);
  CHECK(stops[1]->at("steps") == 3);
  CHECK(stops[1]->at("phases_outside_steps") == 1);
  remove_dir(dir);
}

TEST_CASE("off, a profiler writes nothing and its scopes do nothing; the counter still counts") {
  Initialized dtrain_on;
  dtrain::Profiler profiler{dtrain::ProfilerOptions{}};
  CHECK(!profiler.enabled());
  CHECK(!profiler.recording());
  CHECK(profiler.path().empty());
  for (int i = 0; i < 3; ++i) {
    auto s = profiler.step(8);
    auto p = profiler.phase(dtrain::Phase::backward);
    auto u = profiler.phase("custom");
  }
  profiler.start();  // nothing to start
  CHECK(!profiler.recording());
  CHECK(profiler.steps() == 3);
  CHECK_THROWS_WITH_AS((void)profiler.phase(""), doctest::Contains("a phase needs a name"),
                       dtrain::InvalidArgumentError);
  CHECK_THROWS_AS((void)profiler.phase("other"), dtrain::InvalidArgumentError);
}

TEST_CASE("without dtrain::init a profiler records one process, and refuses in a job of many") {
  const auto dir = fresh_dir("local") / ("world-rank-" + std::to_string(world_rank()));
  if (world_size() > 1) {
    dtrain::ProfilerOptions options;
    options.dir = dir.string();
    const std::string expected = "a Profiler was built before dtrain::init() in a job of " +
                                 std::to_string(world_size()) + " processes";
    CHECK_THROWS_WITH_AS(dtrain::Profiler{options}, doctest::Contains(expected.c_str()),
                         dtrain::InvalidArgumentError);
    CHECK(!std::filesystem::exists(dir));  // nothing created
    remove_dir(dir.parent_path());
    return;
  }
  {
    dtrain::ProfilerOptions options;
    options.dir = dir.string();
    dtrain::Profiler profiler(options);
    CHECK(std::filesystem::path(profiler.path()).parent_path().parent_path() == dir);
    auto s = profiler.step();
  }
  const auto records = read_records(rank_file(dir, 0));
  CHECK(records.front().at("size") == 1);
  const auto steps = of_type(records, "step");
  REQUIRE(steps.size() == 1);
  CHECK(!steps[0]->contains("engine"));
  remove_dir(dir.parent_path());
}

TEST_CASE("an interval out of range is an error on every rank") {
  Initialized dtrain_on;
  dtrain::ProfilerOptions options;
  options.dir = (std::filesystem::temp_directory_path() / "dtrain_profiler_never").string();
  options.sample_interval = 50ms;
  CHECK_THROWS_WITH_AS(dtrain::Profiler{options}, doctest::Contains("= 50 is out of range"),
                       dtrain::InvalidArgumentError);
  // The engine is still usable: the ranks did not fall out of step.
  std::vector<int> v{1};
  dtrain::allreduce(v, {.op = dtrain::ReduceOp::Sum});
  CHECK(v[0] == dtrain::size());
}

TEST_CASE("profiling on for some ranks only is an error on every rank, naming them") {
  Initialized dtrain_on;
  if (dtrain::size() < 2) return;
  const auto dir = fresh_dir("mixed");
  dtrain::ProfilerOptions options;
  if (dtrain::rank() == 0) options.dir = dir.string();
  CHECK_THROWS_WITH_AS(
      dtrain::Profiler{options},
      doctest::Contains(dtrain::size() == 2
                            ? "the profiler is on for rank(s) 0 but off for rank(s) 1"
                            : "the profiler is on for rank(s) 0 but off for rank(s) 1, 2"),
      dtrain::InvalidArgumentError);
  remove_dir(dir);
}

TEST_CASE("a rank that cannot create its folder makes every rank throw") {
  Initialized dtrain_on;
  if (dtrain::size() < 2) return;
  const auto dir = fresh_dir("unwritable");
  std::filesystem::create_directories(dir);
  const auto blocker = dir / "a-file";
  std::ofstream(blocker) << "not a folder\n";
  dtrain::ProfilerOptions options;
  options.dir = (dtrain::rank() == 1 ? blocker / "profile" : dir / "profile").string();
  if (dtrain::rank() == 1) {
    CHECK_THROWS_WITH_AS(dtrain::Profiler{options},
                         doctest::Contains("dtrain: cannot create the profile folder"),
                         dtrain::InvalidArgumentError);
  } else {
    CHECK_THROWS_WITH_AS(dtrain::Profiler{options},
                         doctest::Contains("the profiler could not start on rank(s) 1"),
                         dtrain::InvalidArgumentError);
  }
  options.dir = blocker.string();  // an existing file is not a folder either
  CHECK_THROWS_WITH_AS(dtrain::Profiler{options}, doctest::Contains("is not a folder"),
                       dtrain::InvalidArgumentError);
  remove_dir(dir);
}
