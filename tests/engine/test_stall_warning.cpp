// Stall inspector, warning only (DTRAIN_STALL_CHECK_TIME_SECONDS=1 from the test's environment):
// rank 0 logs which ranks have not submitted which tensors, and the job carries on.
#include <chrono>
#include <thread>

#include "engine_test.hpp"

using namespace dtrain;

TEST_CASE("a late rank is named, with the tensor it has not submitted, in a warning on rank 0") {
  test::LogLines log;
  test::Initialized dt;
  REQUIRE(dtrain::config().stall_check_time_seconds == 1.0);
  const int rank = dtrain::rank(), size = dtrain::size();

  std::vector<float> quick(4, 1.0f);
  allreduce(quick, {.op = ReduceOp::Sum, .name = "stall.quick"});
  const auto before = engine_stats();

  if (rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  std::vector<float> v(4, 1.0f);
  allreduce(v, {.op = ReduceOp::Sum, .name = "stall.late"});
  CHECK(v == std::vector<float>(4, static_cast<float>(size)));  // a warning does not stop the op

  if (rank == 0) {
    const auto warnings = log.matching({"stalled ops", "'stall.late'", "missing on ranks [1]"});
    CHECK(!warnings.empty());
    for (const auto& w : warnings) CHECK(test::contains(w, "warning"));
    CHECK(log.matching({"stall.quick"}).empty());  // ops that completed in time are not reported
    CHECK(engine_stats().stall_warnings > before.stall_warnings);
  } else {
    CHECK(log.matching({"stalled ops"}).empty());  // only the coordinator reports
  }
}
