// One real collective past 2^31 elements: MPI counts are int, so the host path must chunk. Runs at
// 2 ranks only; each rank holds 2 GiB.
#include <cstdint>
#include <memory>
#include <span>

#include "mpi_test_util.hpp"

TEST_CASE("allreduce Sum of 2^31 + 5 uint8 elements") {
  dtrain::init();
  const std::int64_t n = (std::int64_t{1} << 31) + 5;
  const int rank = dtrain_test::world_rank(), size = dtrain_test::world_size();
  // Element i holds i % 61 + rank: below 64, so the sum over up to 4 ranks stays below 256, and
  // position-dependent, so a chunk reduced or written at the wrong offset is detected.
  std::unique_ptr<std::uint8_t[]> storage(new std::uint8_t[static_cast<std::size_t>(n)]);
  std::span<std::uint8_t> v(storage.get(), static_cast<std::size_t>(n));
  for (std::int64_t i = 0, m = 0; i < n; ++i, m = m == 60 ? 0 : m + 1)
    v[i] = static_cast<std::uint8_t>(m + rank);

  dtrain::allreduce(v, {.op = dtrain::ReduceOp::Sum});

  const int rank_sum = size * (size - 1) / 2;
  auto expected = [&](std::int64_t i) { return static_cast<int>(i % 61) * size + rank_sum; };
  for (std::int64_t i : {std::int64_t{0}, std::int64_t{1}, (std::int64_t{1} << 31) - 1,
                         std::int64_t{1} << 31, n - 1}) {
    INFO("element ", i);
    CHECK(static_cast<int>(v[i]) == expected(i));
  }
  std::int64_t bad = 0, first = -1;
  for (std::int64_t i = 0, m = 0; i < n; ++i, m = m == 60 ? 0 : m + 1) {
    if (v[i] != static_cast<std::uint8_t>(m * size + rank_sum)) {
      if (first < 0) first = i;
      ++bad;
    }
  }
  CHECK_MESSAGE(bad == 0, fmt::format("{} of {} elements wrong, first at [{}]", bad, n, first));
}
