// elastic::State never adopts another job's state unasked (Note [Whose commits] in
// train/elastic.hpp): each rank is a host of its own with its own commit folder; a job named by
// DTRAINRUN_JOB_ID (as dtrainrun names it) or by Options::job_name restores only its own commits,
// says which it left alone, and keeps them out of its pruning; resuming another job is an option;
// commits that record no job (an unnamed job's, or written before commits named their job) are an
// unnamed job's; ranks that name different jobs are refused on every rank.
#include <doctest/doctest.h>
#include <mpi.h>
#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "checkpoint/checkpoint_test_util.hpp"
#include "dtrain/dtrain.hpp"
#include "dtrain/train/checkpoint_writer.hpp"
#include "unit/log_capture.hpp"

namespace {

using checkpoint_test::SharedTempDir;
using checkpoint_test::file_name;
using checkpoint_test::world_rank;
using checkpoint_test::world_size;
using dtrain::elastic::OtherJobCommits;
namespace fs = std::filesystem;

std::string host_of(int rank) { return fmt::format("jobs-host-{}", rank); }

void init_as_own_host() {
  if (dtrain::is_initialized()) return;
  dtrain::Config config = dtrain::Config::from_env();
  config.host_id = host_of(world_rank());
  dtrain::init(config);
}

bool on_all_ranks(bool ok) {
  int mine = ok ? 1 : 0, all = 0;
  MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
  return all != 0;
}

// DTRAINRUN_JOB_ID and DTRAINRUN_ATTEMPT as dtrainrun sets them, for one scope (null: a job that
// dtrainrun did not start).
class JobId {
 public:
  explicit JobId(const char* id) {
    if (id != nullptr) {
      ::setenv("DTRAINRUN_JOB_ID", id, 1);
      ::setenv("DTRAINRUN_ATTEMPT", "0", 1);
    } else {
      ::unsetenv("DTRAINRUN_JOB_ID");
      ::unsetenv("DTRAINRUN_ATTEMPT");
    }
  }
  ~JobId() {
    ::unsetenv("DTRAINRUN_JOB_ID");
    ::unsetenv("DTRAINRUN_ATTEMPT");
  }
  JobId(const JobId&) = delete;
  JobId& operator=(const JobId&) = delete;
};

std::vector<double> model_of(const std::string& job, std::int64_t step) {
  return std::vector<double>(4, static_cast<double>(job.size()) * 1000 + static_cast<double>(step));
}

void commit_steps(dtrain::elastic::State& state, std::initializer_list<std::int64_t> steps) {
  for (const std::int64_t step : steps) {
    const auto model = model_of(state.job(), step);
    state.commit({.step = step, .epoch = 0}, {{"model", model}});
  }
  state.wait();
}

dtrain::elastic::Options options_in(const SharedTempDir& dir) {
  return {.directory = (dir / "{host}").string(), .keep_last = 2};
}

fs::path my_folder(const SharedTempDir& dir) { return dir / host_of(world_rank()); }

}  // namespace

TEST_CASE("elastic jobs: a new job leaves an earlier job's commits alone and says so") {
  init_as_own_host();
  SharedTempDir dir;
  {
    JobId id("job-a");
    dtrain::elastic::State a(options_in(dir));
    CHECK(a.job() == "job-a");
    CHECK(on_all_ranks(!a.restore().has_value()));
    commit_steps(a, {10, 20});
  }
  JobId id("job-bb");
  {
    dtrain::test::LogCapture capture(dtrain::LogLevel::info);
    dtrain::elastic::State b(options_in(dir));
    CHECK(on_all_ranks(!b.restore().has_value()));  // not job-a's step 20
    CHECK(capture.count({"dtrain: elastic: ", my_folder(dir).string(),
                         " holds 2 commit(s) of job 'job-a' (the newest of step 20), which this "
                         "job (job 'job-bb') does not resume",
                         "OtherJobCommits::resume"}) == 1);
    // Pruning keeps this job's newest two; job-a's later steps neither push them out nor go.
    commit_steps(b, {3, 6, 9});
  }
  for (const std::int64_t step : {10, 20, 6, 9}) CHECK(fs::exists(my_folder(dir) / file_name(step)));
  CHECK(!fs::exists(my_folder(dir) / file_name(3)));

  // The same job's next world resumes its own newest commit, not the other job's later one.
  dtrain::elastic::State again(options_in(dir));
  const auto restored = again.restore();
  REQUIRE(on_all_ranks(restored.has_value()));
  CHECK(restored->step() == 9);
  CHECK(restored->get<std::vector<double>>("model") == model_of("job-bb", 9));
  CHECK(restored->names() == std::vector<std::string>{"model"});  // the job item stays dtrain's
}

TEST_CASE("elastic jobs: resuming another job's state is asked for explicitly") {
  init_as_own_host();
  SharedTempDir dir;
  {
    JobId id("job-a");
    dtrain::elastic::State a(options_in(dir));
    commit_steps(a, {10, 20});
  }
  JobId id("job-c");
  auto options = options_in(dir);
  options.on_other_job = OtherJobCommits::resume;
  dtrain::test::LogCapture capture(dtrain::LogLevel::info);
  dtrain::elastic::State c(options);
  const auto restored = c.restore();
  REQUIRE(on_all_ranks(restored.has_value()));
  CHECK(restored->step() == 20);
  CHECK(restored->get<std::vector<double>>("model") == model_of("job-a", 20));
  if (world_rank() == 0)
    CHECK(capture.count({"resuming from the commit of step 20", "of job 'job-a', another job"}) ==
          1);
}

TEST_CASE("elastic jobs: Options::job_name names one job across several dtrainruns") {
  init_as_own_host();
  SharedTempDir dir;
  auto options = options_in(dir);
  options.job_name = "nightly";
  {
    JobId id("first-dtrainrun");
    dtrain::elastic::State first(options);
    CHECK(first.job() == "nightly");
    commit_steps(first, {5});
  }
  JobId id("second-dtrainrun");
  dtrain::elastic::State second(options);
  const auto restored = second.restore();
  REQUIRE(on_all_ranks(restored.has_value()));
  CHECK(restored->step() == 5);
}

TEST_CASE("elastic jobs: commits that record no job are an unnamed job's") {
  init_as_own_host();
  SharedTempDir dir;
  // A commit as written before commits named their job: no "dtrain.job" item.
  {
    dtrain::elastic::State claim(options_in(dir));  // creates and claims each host's folder
  }
  const double old_value = 7.5;
  const dtrain::CheckpointItem items[] = {{"value", old_value}};
  dtrain::ObjectWriter w;
  dtrain::detail::write_payload_head(w, {.step = 30, .epoch = 2}, world_size(), items);
  w.write(std::uint64_t{0});
  dtrain::detail::write_checkpoint_file(my_folder(dir), 30, 0, std::move(w.bytes()));
  {
    JobId id(nullptr);  // under mpiexec, no name: an unnamed job resumes it
    dtrain::elastic::State unnamed(options_in(dir));
    CHECK(unnamed.job().empty());
    const auto restored = unnamed.restore();
    REQUIRE(on_all_ranks(restored.has_value()));
    CHECK(restored->step() == 30);
    CHECK(restored->get<double>("value") == old_value);
  }
  JobId id("job-d");
  dtrain::test::LogCapture capture(dtrain::LogLevel::warning);
  dtrain::elastic::State named(options_in(dir));
  CHECK(on_all_ranks(!named.restore().has_value()));
  CHECK(capture.count({"holds 1 commit(s) of an unnamed job (the newest of step 30)"}) == 1);
}

TEST_CASE("elastic jobs: ranks that name different jobs are refused on every rank") {
  init_as_own_host();
  if (world_size() < 2) return;
  SharedTempDir dir;
  JobId id(world_rank() == 1 ? "job-x" : "job-y");
  dtrain::elastic::State state(options_in(dir));
  const std::string expected = fmt::format(
      "dtrain: elastic: rank(s) 1 name another job than rank 0 (elastic::Options::job_name, "
      "DTRAINRUN_JOB_ID, or Options::on_other_job differ); this rank ({}) names job '{}'",
      world_rank(), world_rank() == 1 ? "job-x" : "job-y");
  CHECK_THROWS_WITH_AS(state.restore(), doctest::Contains(expected.c_str()),
                       dtrain::InvalidArgumentError);
}

TEST_CASE("elastic jobs: a malformed DTRAINRUN_JOB_ID is refused on every rank") {
  init_as_own_host();
  SharedTempDir dir;
  // The profile reads the same variables with the same rules (core/dtrainrun_job.hpp).
  JobId id(world_rank() == 0 ? "a/b" : "job-z");
  const std::string expected = world_rank() == 0
                                   ? "DTRAINRUN_JOB_ID=\"a/b\" cannot name the job's folders"
                                   : "rank 0 failed while setting up its commit folder";
  CHECK_THROWS_WITH_AS(dtrain::elastic::State(options_in(dir)),
                       doctest::Contains(expected.c_str()), dtrain::CheckpointError);
  ::unsetenv("DTRAINRUN_ATTEMPT");
  ::setenv("DTRAINRUN_JOB_ID", "job-z", 1);
  CHECK_THROWS_WITH_AS(dtrain::elastic::State(options_in(dir)),
                       doctest::Contains("DTRAINRUN_JOB_ID is set but DTRAINRUN_ATTEMPT is not"),
                       dtrain::CheckpointError);
}

TEST_CASE("elastic jobs: the job's item name is dtrain's own") {
  init_as_own_host();
  SharedTempDir dir;
  dtrain::elastic::State state(options_in(dir));
  const std::string mine = "mine";
  CHECK_THROWS_WITH_AS(state.commit({.step = 1}, {{"dtrain.job", mine}}),
                       doctest::Contains("the item name 'dtrain.job' is dtrain's own"),
                       dtrain::InvalidArgumentError);
}
