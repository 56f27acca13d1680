// An op that arrives at an idle engine is not delayed by the batching window
// (DTRAIN_CYCLE_TIME=5000, i.e. 5 s, from the test's environment). A functional property with a
// generous bound: waiting for the window would take 5 s; the bound is 2 s.
#include <chrono>

#include "engine_test.hpp"

using namespace dtrain;
using Seconds = std::chrono::duration<double>;

TEST_CASE("a lone op completes without waiting for a long cycle time") {
  test::Initialized dt;
  REQUIRE(dtrain::config().cycle_time_ms == 5000.0);
  const int size = dtrain::size();
  std::vector<float> v(1024, 1.0f);  // 4 KiB
  for (int k = 0; k < 3; ++k) {
    CAPTURE(k);
    MPI_Barrier(MPI_COMM_WORLD);  // every rank submits at about the same time
    const auto start = std::chrono::steady_clock::now();
    allreduce(v, {.op = ReduceOp::Sum, .name = "lone"});
    const double took = Seconds(std::chrono::steady_clock::now() - start).count();
    CAPTURE(took);
    CHECK(took < 2.0);
    CHECK(v[0] == static_cast<float>(std::pow(size, k + 1)));
  }
}

TEST_CASE("a grouped op is not delayed by a long cycle time either") {
  test::Initialized dt;
  std::vector<std::vector<float>> group(8, std::vector<float>(100, 1.0f));
  MPI_Barrier(MPI_COMM_WORLD);
  const auto start = std::chrono::steady_clock::now();
  grouped_allreduce(group, {.op = ReduceOp::Sum, .name = "lone.group"});
  const double took = Seconds(std::chrono::steady_clock::now() - start).count();
  CAPTURE(took);
  CHECK(took < 2.0);
  for (const auto& g : group) CHECK(g[0] == static_cast<float>(dtrain::size()));
}
