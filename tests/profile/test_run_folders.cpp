// Runs that share a profile folder never mix (Note [Profile layout]): each run writes into a folder
// of its own, dtrainrun's attempts (DTRAINRUN_JOB_ID, DTRAINRUN_ATTEMPT, set here by hand as
// dtrainrun sets them) into <job-id>/attempt-<n>, and no file of another run is overwritten.
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "dtrain/core/config_knobs.hpp"
#include "dtrain/dtrain.hpp"
#include "dtrain/profile/run_folder.hpp"
#include "profile/profile_files.hpp"
#include "support/world.hpp"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using dtrain_test_support::world_rank;
using dtrain_test_support::world_size;
using profile_test::fresh_dir;
using profile_test::of_type;
using profile_test::read_records;
using profile_test::remove_dir;

// The variables dtrainrun gives every rank, for one scope. Set while dtrain is not running, so
// that no thread of it reads the environment meanwhile.
class JobEnv {
 public:
  JobEnv(const char* job_id, const char* attempt) {
    if (job_id) setenv("DTRAINRUN_JOB_ID", job_id, 1);
    if (attempt) setenv("DTRAINRUN_ATTEMPT", attempt, 1);
  }
  ~JobEnv() {
    unsetenv("DTRAINRUN_JOB_ID");
    unsetenv("DTRAINRUN_ATTEMPT");
  }
  JobEnv(const JobEnv&) = delete;
  JobEnv& operator=(const JobEnv&) = delete;
};

// A Profiler of its own into `dir` that records `steps` steps on every rank, then closes.
void profile_steps(const fs::path& dir, int steps) {
  dtrain::ProfilerOptions options;
  options.dir = dir.string();
  options.sample_interval = std::chrono::milliseconds(100);
  dtrain::Profiler profiler(options);
  for (int s = 0; s < steps; ++s) auto step = profiler.step();
}

std::vector<fs::path> subfolders(const fs::path& dir) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_directory()) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

std::size_t steps_in(const fs::path& file) { return of_type(read_records(file), "step").size(); }

std::string text_of(const fs::path& file) {
  std::ifstream in(file);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

TEST_CASE("two runs into one folder write apart: each in its run's folder, neither overwritten") {
  const auto dir = fresh_dir("two_runs");
  dtrain::init(dtrain::Config::from_env());
  profile_steps(dir, 2);
  profile_steps(dir, 3);  // a second run: before, it truncated the first one's files
  dtrain::shutdown();
  MPI_Barrier(MPI_COMM_WORLD);

  const auto runs = subfolders(dir);
  REQUIRE(runs.size() == 2);
  std::set<std::string> ids;
  for (std::size_t k = 0; k < runs.size(); ++k) {
    CAPTURE(runs[k]);
    for (int r = 0; r < world_size(); ++r) {
      const auto records = read_records(runs[k] / ("rank-" + std::to_string(r) + ".jsonl"));
      REQUIRE(records.size() >= 3);
      CHECK(records.front().at("run_id") == runs[k].filename().string());
      CHECK(records.back().at("type") == "end");
      CHECK(of_type(records, "step").size() == 2 + k);  // run folders sort by start time
      ids.insert(records.front().at("run_id").get<std::string>());
    }
  }
  CHECK(ids.size() == 2);
  remove_dir(dir);
}

TEST_CASE("under dtrainrun each attempt writes <job-id>/attempt-<n>; an attempt's files survive "
          "the next") {
  const auto dir = fresh_dir("attempts");
  const std::string me = "rank-" + std::to_string(world_rank()) + ".jsonl";
  {
    JobEnv job("job-7", "0");
    dtrain::init(dtrain::Config::from_env());
    profile_steps(dir, 2);
    profile_steps(dir, 1);  // a second profile in the same attempt
    dtrain::shutdown();
  }
  {
    JobEnv job("job-7", "1");  // the relaunch: the job's profile opened by init() this time
    dtrain::Config config = dtrain::Config::from_env();
    config.profile_dir = dir.string();
    config.profile_interval_ms = 100;
    dtrain::init(config);
    dtrain::shutdown();
  }
  MPI_Barrier(MPI_COMM_WORLD);
  CHECK(subfolders(dir) == std::vector<fs::path>{dir / "job-7"});
  CHECK(subfolders(dir / "job-7") == std::vector<fs::path>{dir / "job-7" / "attempt-0",
                                                            dir / "job-7" / "attempt-0.1",
                                                            dir / "job-7" / "attempt-1"});
  CHECK(steps_in(dir / "job-7" / "attempt-0" / me) == 2);
  CHECK(steps_in(dir / "job-7" / "attempt-0.1" / me) == 1);
  const auto relaunch = read_records(dir / "job-7" / "attempt-1" / me);
  REQUIRE(!relaunch.empty());
  CHECK(relaunch.back().at("type") == "end");
  for (const char* attempt : {"attempt-0", "attempt-0.1", "attempt-1"}) {
    CAPTURE(attempt);
    const json header = read_records(dir / "job-7" / attempt / me).front();
    CHECK(header.at("job_id") == "job-7");
    CHECK(header.at("attempt") == (std::string(attempt) == "attempt-1" ? 1 : 0));
  }
  remove_dir(dir);
}

TEST_CASE("a file another run left is never overwritten: every rank fails, naming it") {
  if (world_size() < 2) return;
  const auto dir = fresh_dir("clash");
  const fs::path attempt = dir / "job-x" / "attempt-0";
  if (world_rank() == 0) {
    fs::create_directories(attempt);
    std::ofstream(attempt / "rank-0.jsonl") << "another run's profile\n";
  }
  MPI_Barrier(MPI_COMM_WORLD);
  {
    JobEnv job("job-x", "0");
    dtrain::init(dtrain::Config::from_env());
    if (world_rank() == 0)
      CHECK_THROWS_WITH_AS(profile_steps(dir, 1),
                           doctest::Contains("rank-0.jsonl' exists already: another run wrote it"),
                           dtrain::InvalidArgumentError);
    else
      CHECK_THROWS_WITH_AS(profile_steps(dir, 1),
                           doctest::Contains("the profiler could not start on rank(s) 0"),
                           dtrain::InvalidArgumentError);
    std::vector<int> one{1};  // the ranks are still in step
    dtrain::allreduce(one, {.op = dtrain::ReduceOp::Sum});
    CHECK(one[0] == world_size());
    dtrain::shutdown();
  }
  MPI_Barrier(MPI_COMM_WORLD);
  CHECK(text_of(attempt / "rank-0.jsonl") == "another run's profile\n");
  for (int r = 1; r < world_size(); ++r)  // no run without all its ranks: their files went too
    CHECK(!fs::exists(attempt / ("rank-" + std::to_string(r) + ".jsonl")));
  remove_dir(dir);
}

TEST_CASE("ranks of different attempts, or with bad DTRAINRUN_ values, fail together") {
  if (world_size() < 2) return;
  const auto dir = fresh_dir("mixed_attempts");
  const std::string others = world_size() == 2 ? "1" : "1, 2";
  {
    JobEnv job("job-m", world_rank() == 0 ? "0" : "1");
    dtrain::init(dtrain::Config::from_env());
    CHECK_THROWS_WITH_AS(
        profile_steps(dir, 1),
        doctest::Contains(("rank(s) " + others +
                           " have another DTRAINRUN_JOB_ID or DTRAINRUN_ATTEMPT than rank 0")
                              .c_str()),
        dtrain::InvalidArgumentError);
    dtrain::shutdown();
  }
  {
    JobEnv job("../elsewhere", "0");
    dtrain::init(dtrain::Config::from_env());
    CHECK_THROWS_WITH_AS(profile_steps(dir, 1),
                         doctest::Contains("DTRAINRUN_JOB_ID=\"../elsewhere\" cannot name the "
                                           "job's folders"),
                         dtrain::InvalidArgumentError);
    dtrain::shutdown();
  }
  MPI_Barrier(MPI_COMM_WORLD);
  CHECK(!fs::exists(dir / "job-m"));
  CHECK(!fs::exists(dir.parent_path() / "elsewhere"));
  remove_dir(dir);
}

TEST_CASE("DTRAINRUN_JOB_ID and DTRAINRUN_ATTEMPT: read, checked, and not taken for settings") {
  using dtrain::detail::DtrainrunJob;
  using dtrain::detail::MapEnv;
  using dtrain::detail::read_dtrainrun_job;
  using dtrain::detail::run_subfolder;
  DtrainrunJob job;
  CHECK(read_dtrainrun_job(MapEnv{}, job).empty());
  CHECK(!job.under_dtrainrun());
  CHECK(read_dtrainrun_job(MapEnv{{"DTRAINRUN_JOB_ID", "j-1.a_b"}, {"DTRAINRUN_ATTEMPT", "12"}},
                          job)
            .empty());
  CHECK(job.job_id == "j-1.a_b");
  CHECK(job.attempt == 12);
  CHECK(run_subfolder("18e-7b", job, 0) == fs::path("j-1.a_b") / "attempt-12");
  CHECK(run_subfolder("18e-7b", job, 2) == fs::path("j-1.a_b") / "attempt-12.2");
  CHECK(run_subfolder("18e-7b", DtrainrunJob{}, 3) == fs::path("18e-7b"));
  for (const auto& [id, attempt, expected] : std::vector<std::tuple<std::string, std::string,
                                                                    std::string>>{
           {"", "0", "DTRAINRUN_JOB_ID=\"\" cannot name"},
           {".hidden", "0", "DTRAINRUN_JOB_ID=\".hidden\" cannot name"},
           {"a/b", "0", "DTRAINRUN_JOB_ID=\"a/b\" cannot name"},
           {"j", "-1", "DTRAINRUN_ATTEMPT=\"-1\" is not an attempt number"},
           {"j", "one", "DTRAINRUN_ATTEMPT=\"one\" is not an attempt number"},
           {"j", "4K", "DTRAINRUN_ATTEMPT=\"4K\" is not an attempt number"},
       }) {
    CAPTURE(id);
    CAPTURE(attempt);
    const std::string problem = read_dtrainrun_job(
        MapEnv{{"DTRAINRUN_JOB_ID", id}, {"DTRAINRUN_ATTEMPT", attempt}}, job);
    CHECK(problem.find(expected) != std::string::npos);
    CHECK(problem.find("outside dtrainrun set neither") != std::string::npos);
  }
  CHECK(read_dtrainrun_job(MapEnv{{"DTRAINRUN_JOB_ID", "j"}}, job)
            .find("DTRAINRUN_JOB_ID is set but DTRAINRUN_ATTEMPT is not") != std::string::npos);
  CHECK(read_dtrainrun_job(MapEnv{{"DTRAINRUN_ATTEMPT", "0"}}, job)
            .find("DTRAINRUN_ATTEMPT is set but DTRAINRUN_JOB_ID is not") != std::string::npos);
  // dtrainrun's variables are not DTRAIN_ settings: no "did you mean" for them.
  CHECK(dtrain::detail::env_warnings(
            MapEnv{{"DTRAINRUN_JOB_ID", "j"}, {"DTRAINRUN_ATTEMPT", "0"}}) ==
        std::vector<std::string>{});
}
