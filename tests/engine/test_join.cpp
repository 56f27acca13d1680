// join(): ranks that run out of data keep taking part with zeros until every rank has joined.
#include "engine_test.hpp"

namespace {

using namespace dtrain;

// Mean of (k + 1) over the ranks k that still contribute at step s (ranks s..size-1).
double mean_of_contributors(int size, int s) { return (s + 1 + size) / 2.0; }
double sum_of_contributors(int size, int s) {
  double sum = 0;
  for (int k = s; k < size; ++k) sum += k + 1;
  return sum;
}

}  // namespace

TEST_CASE("join with uneven step counts: Average divides by the ranks that did not join") {
  test::Initialized dt;
  const int rank = dtrain::rank(), size = dtrain::size();
  // Rank r runs r + 1 steps. Each step reduces a burst of tensors (fused) and a lone one.
  for (int s = 0; s <= rank; ++s) {
    CAPTURE(s);
    // The 1.2 MB tensor is reduced in its own memory where each rank has a core (Note [Direct
    // segments]); a rank that joined contributes its zeros from the fusion buffer instead.
    std::vector<std::vector<float>> burst;
    for (std::size_t n : {33, 300000, 33}) burst.emplace_back(n, rank + 1.0f);
    std::vector<double> lone(1000, rank + 1.0);
    std::vector<float> summed(5, rank + 1.0f);
    std::vector<Handle> hs;
    for (int k = 0; k < 3; ++k)
      hs.push_back(allreduce_async(burst[k], {.name = fmt::format("step{}.burst{}", s, k)}));
    hs.push_back(allreduce_async(lone, {.name = fmt::format("step{}.lone", s)}));
    hs.push_back(allreduce_async(summed, {.op = ReduceOp::Sum, .name = fmt::format("step{}.sum", s)}));
    for (auto& h : hs) h.wait();
    const double mean = mean_of_contributors(size, s);
    for (const auto& b : burst)
      for (float x : b) REQUIRE(x == doctest::Approx(mean));
    for (double x : lone) REQUIRE(x == doctest::Approx(mean));
    for (float x : summed) REQUIRE(x == doctest::Approx(sum_of_contributors(size, s)));
  }
  const int last = dtrain::join();
  CHECK(last == size - 1);  // the rank with the most steps joins last

  // The world is whole again: every rank contributes and counts.
  std::vector<float> v(4, rank + 1.0f);
  allreduce(v, {.name = "after.join"});
  for (float x : v) CHECK(x == doctest::Approx((size + 1) / 2.0));
}

TEST_CASE("join can be used again, and reports whichever rank joined last") {
  test::Initialized dt;
  const int rank = dtrain::rank(), size = dtrain::size();
  for (int round = 0; round < 2; ++round) {
    CAPTURE(round);
    // Round 0: rank 0 runs longest; round 1: the last rank.
    const int longest = round == 0 ? 0 : size - 1;
    const int steps = rank == longest ? 3 : 1;
    for (int s = 0; s < steps; ++s) {
      std::vector<double> v(7, 1.0);
      allreduce(v, {.op = ReduceOp::Sum, .name = fmt::format("r{}.s{}", round, s)});
      const double contributors = s == 0 ? size : 1;
      for (double x : v) CHECK(x == contributors);
    }
    CHECK(dtrain::join() == longest);
  }
}

TEST_CASE("with a rank joined: allgather takes no rows from it, broadcast works, alltoall and "
          "reducescatter fail") {
  test::Initialized dt;
  const int rank = dtrain::rank(), size = dtrain::size();
  const int joiner = size - 1;
  int last = -1;
  if (rank == joiner) {
    last = dtrain::join();
  } else {
    std::vector<std::int32_t> mine(rank + 1, rank);
    auto gathered = allgather(mine, "gather.with.joined");
    std::vector<std::int32_t> want;
    for (int k = 0; k < size; ++k)
      if (k != joiner)
        for (int i = 0; i <= k; ++i) want.push_back(k);
    CHECK(gathered == want);

    std::vector<float> b(6, rank == 0 ? 42.0f : 0.0f);
    broadcast(b, 0, "bcast.with.joined");
    CHECK(b == std::vector<float>(6, 42.0f));

    // Ops that need every rank's data fail on every rank instead of hanging.
    std::vector<float> rows(static_cast<std::size_t>(size), 1.0f);
    CHECK_THROWS_AS(alltoall(rows, std::vector<int>(size, 1), "a2a.with.joined"), InvalidArgumentError);
    CHECK_THROWS_AS(reducescatter(rows, ReduceOp::Sum, "rs.with.joined"), InvalidArgumentError);
    last = dtrain::join();
  }
  // Every rank hears the same last rank, and it is not the one that joined first.
  int lo = 0, hi = 0;
  MPI_Allreduce(&last, &lo, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&last, &hi, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  CHECK(lo == hi);
  CHECK(last != joiner);
  CHECK(last >= 0);
}
