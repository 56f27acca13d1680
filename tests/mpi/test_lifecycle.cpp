// init/shutdown/Session and use before init; invalid environment values rejected at init.
// MPI belongs to the test main, so dtrain can be shut down and initialized again in one process.
#include <cstdlib>
#include <string>
#include <vector>

#include "mpi_test_util.hpp"

namespace {

template <class F>
void check_not_initialized(F&& call, const std::string& function) {
  try {
    call();
    FAIL_CHECK(function << " did not throw before init");
  } catch (const dtrain::NotInitializedError& e) {
    const std::string what = e.what();
    INFO(what);
    CHECK(what.find(function) != std::string::npos);
    CHECK(what.find("dtrain::init()") != std::string::npos);
    CHECK(what.find('\n') == std::string::npos);  // a one-line fix
  } catch (const std::exception& e) {
    FAIL_CHECK(function << " threw the wrong exception: " << e.what());
  }
}

}  // namespace

TEST_CASE("every query and op before init throws NotInitializedError naming the fix") {
  dtrain::shutdown();
  CHECK_FALSE(dtrain::is_initialized());
  check_not_initialized([] { (void)dtrain::rank(); }, "rank");
  check_not_initialized([] { (void)dtrain::size(); }, "size");
  check_not_initialized([] { (void)dtrain::local_rank(); }, "local_rank");
  check_not_initialized([] { (void)dtrain::local_size(); }, "local_size");
  check_not_initialized([] { (void)dtrain::cross_rank(); }, "cross_rank");
  check_not_initialized([] { (void)dtrain::cross_size(); }, "cross_size");
  check_not_initialized([] { (void)dtrain::is_homogeneous(); }, "is_homogeneous");
  std::vector<float> v(3, 1.0f);
  check_not_initialized([&] { dtrain::allreduce(v); }, "allreduce");
  check_not_initialized([&] { (void)dtrain::allgather(v); }, "allgather");
  check_not_initialized([&] { dtrain::broadcast(v, 0); }, "broadcast");
  check_not_initialized([&] { (void)dtrain::alltoall(v, std::vector<int>{3}); }, "alltoall");
  check_not_initialized([&] { (void)dtrain::reducescatter(v); }, "reducescatter");
  check_not_initialized([] { dtrain::barrier(); }, "barrier");
  CHECK(v == std::vector<float>(3, 1.0f));  // untouched
}

TEST_CASE("init and shutdown are idempotent; the runtime works after re-init") {
  dtrain::shutdown();
  dtrain::init();
  CHECK(dtrain::is_initialized());
  CHECK_NOTHROW(dtrain::init());
  CHECK(dtrain::is_initialized());
  CHECK(dtrain::rank() == dtrain_test::world_rank());
  dtrain::shutdown();
  CHECK_FALSE(dtrain::is_initialized());
  CHECK_NOTHROW(dtrain::shutdown());
  CHECK_THROWS_AS((void)dtrain::rank(), dtrain::NotInitializedError);

  for (int round = 0; round < 3; ++round) {
    dtrain::init();
    std::vector<int> v{1};
    dtrain::allreduce(v, {.op = dtrain::ReduceOp::Sum});
    CHECK(v[0] == dtrain_test::world_size());
    dtrain::shutdown();
  }
  int flag = 0;
  MPI_Finalized(&flag);
  CHECK(flag == 0);  // dtrain did not initialize MPI, so it must not finalize it
}

TEST_CASE("Session initializes for its lifetime") {
  dtrain::shutdown();
  {
    dtrain::Session session;
    CHECK(dtrain::is_initialized());
    std::vector<double> v{static_cast<double>(dtrain::rank())};
    dtrain::allreduce(v, {.op = dtrain::ReduceOp::Max});
    CHECK(v[0] == dtrain::size() - 1);
  }
  CHECK_FALSE(dtrain::is_initialized());
  {
    dtrain::Config config;
    config.cycle_time_ms = 0.5;
    dtrain::Session session(config);
    CHECK(dtrain::config().cycle_time_ms == 0.5);
  }
  CHECK_FALSE(dtrain::is_initialized());
}

TEST_CASE("an invalid environment value fails init with a message naming it") {
  dtrain::shutdown();
  struct Case {
    const char* variable;
    const char* value;
  };
  for (Case c : {Case{"DTRAIN_CYCLE_TIME", "abc"}, Case{"DTRAIN_FUSION_THRESHOLD", "-5"},
                 Case{"HOROVOD_CYCLE_TIME", "fast"}}) {
    ::setenv(c.variable, c.value, 1);
    try {
      dtrain::init();
      FAIL_CHECK("init() accepted " << c.variable << "=" << c.value);
    } catch (const dtrain::InvalidArgumentError& e) {
      const std::string what = e.what();
      INFO(what);
      CHECK(what.find(c.variable) != std::string::npos);
      CHECK(what.find(c.value) != std::string::npos);
    } catch (const std::exception& e) {
      FAIL_CHECK("wrong exception for " << c.variable << "=" << c.value << ": " << e.what());
    }
    ::unsetenv(c.variable);
    CHECK_FALSE(dtrain::is_initialized());
  }
  dtrain::init();  // a clean environment initializes again
  CHECK(dtrain::is_initialized());
}

TEST_CASE("after shutdown, ops throw NotInitializedError rather than hanging") {
  dtrain::init();
  dtrain::shutdown();
  std::vector<float> v(2, 1.0f);
  CHECK_THROWS_AS(dtrain::allreduce(v), dtrain::NotInitializedError);
  dtrain::init();
}
