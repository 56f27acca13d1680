// join(): ranks that joined keep taking part in allreduce (contributing zeros; Average divides by
// the ranks that did not join), allgather (no rows) and broadcast; alltoall and reducescatter are
// refused while a rank has joined; once all ranks have joined the world is whole again.
// Ops after a join are named explicitly: generated names count ops per rank, and the ranks that
// stay active submit more of them than the ranks that joined.
#include <cstdint>
#include <span>
#include <vector>

#include "mpi_test_util.hpp"

TEST_CASE("join: the last rank to join keeps working alone, then the world is whole again") {
  dtrain::init();
  const int rank = dtrain::rank(), size = dtrain::size();
  const int active = size - 1;  // the last rank joins last
  if (rank == active) {
    std::vector<float> sum(3, 2.0f), avg(3, 6.0f);
    dtrain::allreduce(sum, {.op = dtrain::ReduceOp::Sum, .name = "join.sum"});
    CHECK(sum == std::vector<float>(3, 2.0f));  // the joined ranks contributed zeros
    dtrain::allreduce(avg, {.op = dtrain::ReduceOp::Average, .name = "join.avg"});
    CHECK(avg == std::vector<float>(3, 6.0f));  // divided by the one rank that did not join

    std::vector<std::int32_t> rows{7, 8};
    CHECK(dtrain::allgather(rows, "join.gather") == std::vector<std::int32_t>{7, 8});

    std::vector<double> b(4, 1.5);
    dtrain::broadcast(b, active, "join.bcast");
    CHECK(b == std::vector<double>(4, 1.5));

    if (size > 1) {
      std::vector<float> v(size, 1.0f);
      CHECK_THROWS_AS((void)dtrain::alltoall(v, std::vector<int>(size, 1), "join.a2a"),
                      dtrain::InvalidArgumentError);
      CHECK_THROWS_AS((void)dtrain::reducescatter(v, dtrain::ReduceOp::Sum, "join.rs"),
                      dtrain::InvalidArgumentError);
    }
  }
  CHECK(dtrain::join() == active);

  std::vector<std::int64_t> v{rank};
  dtrain::allreduce(v, {.op = dtrain::ReduceOp::Sum, .name = "after.join"});
  CHECK(v[0] == std::int64_t{size} * (size - 1) / 2);
}

// A joined rank runs the same MPI calls as the active ones, also where Average and scale factors
// are applied on a reduce-scatter's shard (Note [Scaled allreduce]): lone tensors below and above
// the in-place size of fused responses, and a fused group.
TEST_CASE("join: scaled allreduces of large tensors while a rank has joined") {
  dtrain::init();
  const int rank = dtrain::rank(), size = dtrain::size();
  const int active = size - 1;
  if (rank == active) {
    for (std::int64_t n : {std::int64_t{100003}, std::int64_t{300007}}) {
      std::vector<float> avg(static_cast<std::size_t>(n), 6.0f);
      dtrain::allreduce(avg, {.op = dtrain::ReduceOp::Average, .name = fmt::format("jl.avg.{}", n)});
      CHECK(avg == std::vector<float>(avg.size(), 6.0f));
      std::vector<double> post(static_cast<std::size_t>(n), 3.0);
      dtrain::allreduce(post, {.op = dtrain::ReduceOp::Sum, .prescale = 0.5, .postscale = 4.0,
                               .name = fmt::format("jl.post.{}", n)});
      CHECK(post == std::vector<double>(post.size(), 6.0));
    }
    std::vector<float> a(300007, 2.0f), b(17, 4.0f), c(100003, 8.0f);
    std::vector<std::span<float>> views{a, b, c};
    dtrain::grouped_allreduce(views, {.op = dtrain::ReduceOp::Average, .name = "jl.group"});
    CHECK(a == std::vector<float>(a.size(), 2.0f));
    CHECK(b == std::vector<float>(b.size(), 4.0f));
    CHECK(c == std::vector<float>(c.size(), 8.0f));
  }
  CHECK(dtrain::join() == active);
}
