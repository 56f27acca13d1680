// Profiling with no code in the program (Note [Zero-code profiling]): init() under DTRAIN_PROFILE
// opens the job's profile, DistributedOptimizer updates mark its steps (Note [Implicit steps]),
// the training thread's waits are their communication wait, a Profiler attaches to it, and
// shutdown() closes it. Each case starts and stops dtrain with the profile folder in its Config.
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "dtrain/dtrain.hpp"
#include "profile/profile_files.hpp"

namespace {

using namespace std::chrono_literals;
using nlohmann::json;
using profile_test::busy_for;
using profile_test::fresh_dir;
using profile_test::of_type;
using profile_test::rank_file;
using profile_test::read_records;
using profile_test::remove_dir;

// The smallest optimizer dtrain's concept accepts: one gradient of 1024 floats.
struct ToySgd {
  std::vector<float> weights = std::vector<float>(1024, 0.0f);
  std::vector<float> grads = std::vector<float>(1024, 1.0f);
  void step() {
    for (std::size_t i = 0; i < weights.size(); ++i) weights[i] -= 0.01f * grads[i];
  }
  std::vector<std::span<float>> gradients() { return {grads}; }
};
constexpr std::uint64_t kGradientBytes = 1024 * sizeof(float);

void init_profiled(const std::filesystem::path& dir) {
  dtrain::Config config = dtrain::Config::from_env();
  config.profile_dir = dir.string();
  config.profile_interval_ms = 100;
  dtrain::init(config);
}

std::set<std::string> phase_names(const json& step) {
  std::set<std::string> out;
  for (const auto& [name, ms] : step.at("phases_ms").items()) out.insert(name);
  return out;
}

}  // namespace

TEST_CASE("the optimizer's updates are the steps, and the training thread's waits their "
          "communication wait") {
  const auto dir = fresh_dir("job");
  init_profiled(dir);
  const int rank = dtrain::rank();
  ToySgd sgd;
  dtrain::DistributedOptimizer<ToySgd> optimizer(sgd, {.backward_passes_per_step = 2});
  int updates = 0;
  for (int pass = 0; pass < 12; ++pass) {
    busy_for(200us);
    updates += optimizer.step() ? 1 : 0;
  }
  CHECK(updates == 6);
  std::this_thread::sleep_for(120ms);  // a sampling period after the last update
  dtrain::shutdown();

  const auto records = read_records(rank_file(dir, rank));
  REQUIRE(records.size() >= 4);
  CHECK(records.front().at("type") == "header");
  CHECK(records.front().at("process_uptime_ms").get<double>() > 0);
  CHECK(records[1].at("type") == "start");
  CHECK(records.back().at("type") == "end");  // closed by shutdown()
  const auto steps = of_type(records, "step");
  REQUIRE(steps.size() == 5);  // from the end of one update to the end of the next
  for (std::size_t i = 0; i < steps.size(); ++i) {
    const json& s = *steps[i];
    CAPTURE(i);
    CHECK(s.at("step") == static_cast<int>(i));
    CHECK(s.at("samples") == 0);
    CHECK(phase_names(s) == std::set<std::string>{"communication_wait"});
    CHECK(s.at("engine").at("collectives") == 1);
    CHECK(s.at("engine").at("bytes_reduced") == kGradientBytes);
    if (i > 0) {  // each step begins where the one before ended
      const json& before = *steps[i - 1];
      const double end =
          before.at("t").get<double>() + before.at("duration_ms").get<double>() / 1e3;
      CHECK(std::abs(s.at("t").get<double>() - end) < 3e-6);
    }
  }
  std::uint64_t sampled_collectives = 0;
  for (const json* s : of_type(records, "sample"))
    if (s->contains("engine")) sampled_collectives += s->at("engine").value("collectives", 0ull);
  // The samples see every collective of the job: the six updates, and the constructor's
  // comparison of the gradient hooks across ranks.
  CHECK(sampled_collectives == 7);
  remove_dir(dir);
}

TEST_CASE("a Profiler attaches to the job's profile; its phases refine the implicit steps and "
          "its own steps take precedence") {
  const auto dir = fresh_dir("attach");
  init_profiled(dir);
  const int rank = dtrain::rank(), size = dtrain::size();
  {
    dtrain::Profiler profiler;
    CHECK(profiler.attached());
    CHECK(profiler.path() == rank_file(dir, rank).string());
    dtrain::ProfilerOptions elsewhere;
    elsewhere.dir = (dir / "elsewhere").string();
    dtrain::Profiler other(elsewhere);  // the job's folder wins
    CHECK(other.attached());
    CHECK(other.path() == profiler.path());

    ToySgd sgd;
    dtrain::DistributedOptimizer<ToySgd> optimizer(sgd);
    auto iteration = [&] {
      {
        auto p = profiler.phase(dtrain::Phase::forward);
        busy_for(100us);
      }
      {
        auto p = profiler.phase(dtrain::Phase::backward);
        busy_for(100us);
      }
      optimizer.step();
    };
    for (int i = 0; i < 3; ++i) iteration();  // implicit steps 0 and 1, then 2 under way
    for (int i = 0; i < 3; ++i) {             // explicit steps: 2 is dropped, these are 2-4
      auto step = profiler.step(8);
      iteration();
    }
  }
  dtrain::shutdown();  // destroying the Profilers left the profile open until here

  // One run's folder (Note [Profile layout]) and in it the ranks' files: no second file, no
  // other folder.
  const auto run = rank_file(dir, rank).parent_path();
  std::set<std::string> entries, files;
  for (const auto& f : std::filesystem::directory_iterator(dir))
    entries.insert(f.path().filename());
  for (const auto& f : std::filesystem::directory_iterator(run))
    files.insert(f.path().filename());
  CHECK(entries == std::set<std::string>{run.filename()});
  std::set<std::string> expected;
  for (int r = 0; r < size; ++r) expected.insert(rank_file(dir, r).filename());
  CHECK(files == expected);
  const auto records = read_records(rank_file(dir, rank));
  CHECK(records.back().at("type") == "end");
  CHECK(of_type(records, "header").size() == 1);
  const auto steps = of_type(records, "step");
  REQUIRE(steps.size() == 5);
  for (std::size_t i = 0; i < steps.size(); ++i) {
    CAPTURE(i);
    CHECK(steps[i]->at("step") == static_cast<int>(i));
    CHECK(steps[i]->at("samples") == (i < 2 ? 0 : 8));
    CHECK(phase_names(*steps[i]) ==
          std::set<std::string>{"forward", "backward", "communication_wait"});
  }
  remove_dir(dir);
}

TEST_CASE("only the training thread's waits are charged to its steps") {
  const auto dir = fresh_dir("threads");
  init_profiled(dir);
  const int rank = dtrain::rank();
  ToySgd sgd;
  dtrain::DistributedOptimizer<ToySgd> optimizer(sgd);
  auto update_without_exchange = [&] {
    auto skip = optimizer.skip_synchronize();
    optimizer.step();
  };
  update_without_exchange();  // the training thread: step 0 begins
  std::thread([] {
    std::vector<float> v(16, 1.0f);
    dtrain::allreduce(v, {.name = "side thread"});
  }).join();
  update_without_exchange();  // step 0 ends: only another thread waited in it
  std::vector<float> v(16, 1.0f);
  dtrain::allreduce(v, {.name = "training thread"});
  update_without_exchange();  // step 1 ends: the training thread waited
  dtrain::shutdown();

  const auto records = read_records(rank_file(dir, rank));
  const auto steps = of_type(records, "step");
  REQUIRE(steps.size() == 2);
  CHECK(steps[0]->at("engine").at("collectives") == 1);
  CHECK(phase_names(*steps[0]).empty());
  CHECK(phase_names(*steps[1]) == std::set<std::string>{"communication_wait"});
  remove_dir(dir);
}

TEST_CASE("init() fails on every rank when the ranks disagree on profiling, and can be retried") {
  if (dtrain_test_support::world_size() < 2) return;
  const auto dir = fresh_dir("mixed_init");
  dtrain::Config config = dtrain::Config::from_env();
  if (dtrain_test_support::world_rank() == 0) config.profile_dir = dir.string();
  const std::string others = dtrain_test_support::world_size() == 2 ? "1" : "1, 2";
  CHECK_THROWS_WITH_AS(dtrain::init(config),
                       doctest::Contains(("the profiler is on for rank(s) 0 but off for rank(s) " +
                                          others).c_str()),
                       dtrain::InvalidArgumentError);
  CHECK(!dtrain::is_initialized());
  dtrain::init(dtrain::Config::from_env());
  std::vector<int> one{1};
  dtrain::allreduce(one, {.op = dtrain::ReduceOp::Sum});
  CHECK(one[0] == dtrain::size());
  dtrain::shutdown();
  remove_dir(dir);
}
