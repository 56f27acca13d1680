// Stall shutdown (check 1 s, shutdown 2 s from the test's environment): one rank never submits
// the op the others wait for. Every rank's pending op fails with the stall report, and every
// later submission fails with the same root cause.
#include "engine_test.hpp"

using namespace dtrain;

TEST_CASE("after the stall shutdown time every pending op fails on every rank with the report") {
  test::Initialized dt;
  REQUIRE(dtrain::config().stall_shutdown_time_seconds == 2.0);
  const int rank = dtrain::rank(), size = dtrain::size();
  const bool odd = rank == size - 1;
  const std::string all_but_last = size == 2 ? "[0]" : size == 3 ? "[0, 1]" : "[0, 1, 2]";

  std::vector<float> warmup(2, 1.0f);
  allreduce(warmup, {.op = ReduceOp::Sum, .name = "before.stall"});

  std::vector<float> v(4, 1.0f);
  auto h = allreduce_async(v, {.name = odd ? "only.last" : "never.on.last"});
  std::string first;
  try {
    h.wait();
    FAIL_CHECK("the stalled op completed");
  } catch (const ShutdownError& e) {
    first = e.what();
  }
  CAPTURE(first);
  CHECK(test::contains(first, "stall shutdown"));
  CHECK(test::contains(first, "DTRAIN_STALL_SHUTDOWN_TIME_SECONDS"));
  CHECK(test::contains(first, "allreduce 'never.on.last': submitted by ranks " + all_but_last +
                                  ", missing on ranks [" + std::to_string(size - 1) + "]"));
  CHECK(test::contains(first, "allreduce 'only.last': submitted by ranks [" +
                                  std::to_string(size - 1) + "], missing on ranks " + all_but_last));
  CHECK(v == std::vector<float>(4, 1.0f));  // failed ops leave their tensors alone

  // Later submissions fail at once with the same root cause, never a bare "shut down".
  std::vector<float> w(4, 1.0f);
  try {
    allreduce(w, {.name = "after.stall"});
    FAIL_CHECK("an op was accepted after the stall shutdown");
  } catch (const ShutdownError& e) {
    CHECK(std::string(e.what()) == first);
  }
  try {
    barrier();
    FAIL_CHECK("a barrier was accepted after the stall shutdown");
  } catch (const ShutdownError& e) {
    CHECK(std::string(e.what()) == first);
  }
}
