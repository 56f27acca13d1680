// elastic::State across ranks, each rank its own host (DTRAIN_HOST_ID) with its own commit folder:
// commits land on every host; restore() takes the newest valid commit any host holds, from
// whichever host holds it, and gives it to the hosts that lacked it; a folder two hosts claim is
// refused on every rank; dtrainrun's answer reaches every rank at the same commit, and a
// launcher that does not answer costs one timeout, not one per commit.
#include <doctest/doctest.h>
#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "checkpoint/checkpoint_test_util.hpp"
#include "dtrain/dtrain.hpp"
#include "train/fake_launcher.hpp"

namespace {

using checkpoint_test::SharedTempDir;
using checkpoint_test::file_name;
using checkpoint_test::world_rank;
using checkpoint_test::world_size;
using elastic_test::FakeLauncher;
namespace fs = std::filesystem;

std::string host_of(int rank) { return fmt::format("elastic-host-{}", rank); }

// Every rank is a host of its own.
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

std::vector<double> model_at(std::int64_t step) { return std::vector<double>(5, step * 0.5); }

void commit_step(dtrain::elastic::State& state, std::int64_t step) {
  const auto model = model_at(step);
  state.commit({.step = step, .epoch = 1}, {{"model", model}, {"step", step}});
}

fs::path folder_of(const SharedTempDir& dir, int rank) { return dir / host_of(rank); }

// The DTRAIN_ELASTIC variables of a world of generation 2, pointing at `port`, for one scope.
class ElasticEnvironment {
 public:
  explicit ElasticEnvironment(int port) {
    ::setenv("DTRAIN_ELASTIC", "1", 1);
    ::setenv("DTRAIN_ELASTIC_NOTIFY", fmt::format("127.0.0.1:{}", port).c_str(), 1);
    ::setenv("DTRAIN_ELASTIC_GENERATION", "2", 1);
  }
  ~ElasticEnvironment() {
    ::unsetenv("DTRAIN_ELASTIC");
    ::unsetenv("DTRAIN_ELASTIC_NOTIFY");
    ::unsetenv("DTRAIN_ELASTIC_GENERATION");
  }
};

// Rank 0's launcher port on every rank (the others only need a well-formed variable).
int port_from_rank0(const std::optional<FakeLauncher>& server) {
  int port = server ? server->port() : 0;
  MPI_Bcast(&port, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return port;
}

}  // namespace

TEST_CASE("elastic state: every host holds every commit, and a new world resumes from it") {
  init_as_own_host();
  SharedTempDir dir;
  const auto options = dtrain::elastic::Options{.directory = dir / "{host}", .keep_last = 2};
  {
    dtrain::elastic::State state(options);
    CHECK(state.directory() == folder_of(dir, world_rank()));
    CHECK(state.writes());
    CHECK(on_all_ranks(!state.restore().has_value()));
    for (std::int64_t step : {3, 6, 9}) commit_step(state, step);
    CHECK(!state.resize_requested());  // outside elastic mode nothing is asked
  }
  // Each host's own folder, pruned to the newest two.
  CHECK(!fs::exists(folder_of(dir, world_rank()) / file_name(3)));
  CHECK(fs::exists(folder_of(dir, world_rank()) / file_name(6)));
  CHECK(fs::exists(folder_of(dir, world_rank()) / file_name(9)));

  dtrain::elastic::State state(options);
  const auto restored = state.restore();
  REQUIRE(on_all_ranks(restored.has_value()));
  CHECK(restored->step() == 9);
  CHECK(restored->world_size() == world_size());
  CHECK(restored->get<std::vector<double>>("model") == model_at(9));
  CHECK(restored->file() == folder_of(dir, world_rank()) / file_name(9));
}

TEST_CASE("elastic state: the newest commit comes from the one host that holds it") {
  init_as_own_host();
  SharedTempDir dir;
  const auto options = dtrain::elastic::Options{.directory = dir / "{host}"};
  {
    dtrain::elastic::State state(options);
    commit_step(state, 4);
    commit_step(state, 8);
  }
  const int holder = world_size() - 1;
  // Every other host lost step 8; the host before the holder has a damaged copy instead.
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() != holder) fs::remove(folder_of(dir, world_rank()) / file_name(8));
  if (world_size() > 2 && world_rank() == holder - 1)
    std::ofstream(folder_of(dir, world_rank()) / file_name(8)) << "DTRAINCK torn";
  MPI_Barrier(MPI_COMM_WORLD);

  dtrain::elastic::State state(options);
  const auto restored = state.restore();
  REQUIRE(on_all_ranks(restored.has_value()));
  CHECK(restored->step() == 8);
  CHECK(restored->get<std::vector<double>>("model") == model_at(8));
  CHECK(restored->get<std::int64_t>("step") == 8);
  state.wait();  // the hosts that lacked it have written it
  CHECK(on_all_ranks(fs::exists(folder_of(dir, world_rank()) / file_name(8))));
  if (world_size() > 2 && world_rank() == holder - 1)
    CHECK(fs::exists(folder_of(dir, world_rank()) / (file_name(8) + ".invalid")));
}

TEST_CASE("elastic state: a folder that two hosts use is refused on every rank") {
  init_as_own_host();
  if (world_size() < 2) return;
  SharedTempDir dir;
  bool refused = false;
  try {
    dtrain::elastic::State state({.directory = dir / "shared"});
  } catch (const dtrain::CheckpointError& e) {
    refused = true;
    // Which host claimed the folder first depends on timing; each rank names its own problem or
    // the rank that had one.
    const std::string what = e.what();
    CHECK_MESSAGE((what.find("belongs to host") != std::string::npos ||
                   what.find("failed while setting up its commit folder") != std::string::npos),
                  what);
  }
  CHECK(on_all_ranks(refused));
}

TEST_CASE("elastic state: dtrainrun's answer reaches every rank at the same commit") {
  init_as_own_host();
  SharedTempDir dir;
  std::optional<FakeLauncher> server;
  if (world_rank() == 0) server.emplace("GEN 2 3\n");  // generation 2 is running: carry on
  ElasticEnvironment environment(port_from_rank0(server));
  dtrain::elastic::State state({.directory = dir / "{host}", .commit_every = 2});
  CHECK(state.launch().elastic);
  CHECK(state.generation() == 2);
  CHECK(!state.commit_due(1));
  CHECK(state.commit_due(2));
  CHECK_THROWS_AS(state.exit_for_resize(), dtrain::InvalidArgumentError);  // nothing committed

  commit_step(state, 2);
  CHECK(on_all_ranks(!state.resize_requested()));
  if (server) server->set(FakeLauncher::Mode::answer, "GEN 3 5\n");
  MPI_Barrier(MPI_COMM_WORLD);
  commit_step(state, 4);
  CHECK(on_all_ranks(state.resize_requested()));
  CHECK(state.next_world_size() == 5);
  if (server) CHECK(server->requests() == 2);  // rank 0 asks, once per commit
}

TEST_CASE("elastic state: a launcher that does not answer costs one timeout, then is left alone") {
  init_as_own_host();
  SharedTempDir dir;
  std::optional<FakeLauncher> server;
  if (world_rank() == 0) {
    server.emplace();
    server->set(FakeLauncher::Mode::silent);
  }
  ElasticEnvironment environment(port_from_rank0(server));
  const auto timeout = std::chrono::milliseconds(300);
  dtrain::elastic::State state({.directory = dir / "{host}",
                                .launcher_timeout = timeout,
                                .retry_after = std::chrono::milliseconds(60000)});
  const auto start = std::chrono::steady_clock::now();
  commit_step(state, 1);
  const auto first = std::chrono::steady_clock::now() - start;
  for (std::int64_t step = 2; step <= 5; ++step) commit_step(state, step);
  const auto five = std::chrono::steady_clock::now() - start;
  CHECK(on_all_ranks(!state.resize_requested()));
  if (world_rank() == 0) {
    CHECK(first >= timeout);
    CHECK(server->requests() == 1);
  }
  CHECK(five < first + std::chrono::milliseconds(2000));
}

TEST_CASE("elastic state: a malformed DTRAIN_ELASTIC_NOTIFY is an error naming it") {
  init_as_own_host();
  SharedTempDir dir;
  ::setenv("DTRAIN_ELASTIC", "1", 1);
  ::setenv("DTRAIN_ELASTIC_NOTIFY", "launcher-without-port", 1);
  CHECK_THROWS_WITH_AS(dtrain::elastic::State({.directory = dir / "{host}"}),
                       doctest::Contains("DTRAIN_ELASTIC_NOTIFY='launcher-without-port'"),
                       dtrain::CheckpointError);
  ::unsetenv("DTRAIN_ELASTIC");
  ::unsetenv("DTRAIN_ELASTIC_NOTIFY");
}

TEST_CASE("elastic state: a host that cannot write its commit fails the next commit everywhere") {
  init_as_own_host();
  if (world_size() < 2) return;
  SharedTempDir dir;
  dtrain::elastic::State state({.directory = dir / "{host}"});
  commit_step(state, 1);
  state.wait();
  const fs::path mine = folder_of(dir, world_rank());
  if (world_rank() == 1) {  // the folder becomes a file: the next write cannot create its file
    fs::remove_all(mine);
    std::ofstream(mine) << "not a folder";
  }
  MPI_Barrier(MPI_COMM_WORLD);
  commit_step(state, 2);  // written in the background: the failure shows at the next commit
  std::string error;
  try {
    commit_step(state, 3);
  } catch (const dtrain::CheckpointError& e) {
    error = e.what();
  }
  if (world_rank() == 1)
    CHECK_MESSAGE(error.find(fmt::format("writing a commit into {} failed", mine.string())) !=
                      std::string::npos,
                  error);
  else
    CHECK_MESSAGE(error.find("rank 1 could not commit step 3 on its host") != std::string::npos,
                  error);
  CHECK(on_all_ranks(!error.empty()));
}

TEST_CASE("elastic state: a first commit below another run's commits, without restore(), fails") {
  init_as_own_host();
  SharedTempDir dir;
  const auto options = dtrain::elastic::Options{.directory = dir / "{host}"};
  {
    dtrain::elastic::State earlier(options);
    commit_step(earlier, 50);
  }
  dtrain::elastic::State state(options);
  CHECK_THROWS_WITH_AS(commit_step(state, 5),
                       doctest::Contains("holds checkpoint-000000000050.dtrain (step 50), later "
                                         "than this commit (step 5), and this job did not restore()"),
                       dtrain::CheckpointError);
  dtrain::elastic::State resumed(options);
  CHECK(resumed.restore()->step() == 50);
  commit_step(resumed, 55);  // after restore(): carries on
  resumed.wait();
  CHECK(fs::exists(folder_of(dir, world_rank()) / file_name(55)));
}
