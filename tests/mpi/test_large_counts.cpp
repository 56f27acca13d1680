// The large-count code paths of the host collectives (Note [MPI counts] in
// comm/host_collectives.hpp), run on small buffers by lowering detail::mpi_count_limit(): chunked
// allreduce and broadcast, the fused allreduce cut into pieces, and the fallbacks of allgatherv
// (rooted broadcasts), alltoallv (pairwise point-to-point) and reduce_scatter (rooted reduces).
#include <cstdint>
#include <numeric>
#include <vector>

#include "mpi_test_util.hpp"

namespace {

using dtrain::ReduceOp;
using namespace dtrain_test;

// Limits below, at and above the per-rank and total counts used in each case, so both the
// "one call" and the "fallback" branches run, including the boundary where only the total is too
// large for one call.
const std::vector<std::int64_t> kLimits{1, 4, 7, 64};

}  // namespace

TEST_CASE("the count limit guard restores the previous limit") {
  const std::int64_t before = dtrain::detail::mpi_count_limit();
  {
    CountLimit guard(3);
    CHECK(dtrain::detail::mpi_count_limit() == 3);
  }
  CHECK(dtrain::detail::mpi_count_limit() == before);
}

TEST_CASE("chunked allreduce and broadcast") {
  dtrain::init();
  const int rank = world_rank(), size = world_size();
  for (std::int64_t limit : kLimits) {
    CountLimit guard(limit);
    std::vector<std::int32_t> v(101);
    std::iota(v.begin(), v.end(), rank);
    dtrain::allreduce(v, {.op = ReduceOp::Sum});
    check_elements(v.data(), 101,
                   [&](std::int64_t i) { return size * i + std::int64_t{size} * (size - 1) / 2; },
                   0.0, fmt::format("allreduce of 101 int32 with count limit {}", limit));

    std::vector<dtrain::bfloat16_t> h(23, dtrain::bfloat16_t(rank + 1));
    dtrain::allreduce(h, {.op = ReduceOp::Max});
    check_elements(h.data(), 23, [&](std::int64_t) { return size; }, 0.0,
                   fmt::format("bfloat16 Max with count limit {}", limit));

    for (int root = 0; root < size; ++root) {
      std::vector<double> b(37, rank);
      dtrain::broadcast(b, root);
      check_elements(b.data(), 37, [&](std::int64_t) { return root; }, 0.0,
                     fmt::format("broadcast from {} with count limit {}", root, limit));
    }
  }
}

TEST_CASE("fused allreduce of several tensors cut into pieces") {
  dtrain::init();
  const int rank = world_rank(), size = world_size();
  for (std::int64_t limit : kLimits) {
    CountLimit guard(limit);
    std::vector<std::vector<float>> group{std::vector<float>(13, rank), std::vector<float>(1, 1),
                                          std::vector<float>(), std::vector<float>(30, 2.0f * rank)};
    dtrain::grouped_allreduce(group, {.op = ReduceOp::Sum});
    const float s = static_cast<float>(size * (size - 1) / 2);
    CHECK(group[0] == std::vector<float>(13, s));
    CHECK(group[1] == std::vector<float>(1, static_cast<float>(size)));
    CHECK(group[2].empty());
    CHECK(group[3] == std::vector<float>(30, 2 * s));

    std::vector<dtrain::float16_t> a(9, dtrain::float16_t(rank)), b(10, dtrain::float16_t(1.0));
    auto ha = dtrain::allreduce_async(a, {.op = ReduceOp::Sum});
    auto hb = dtrain::allreduce_async(b, {.op = ReduceOp::Average, .postscale = 4.0});
    ha.wait();
    hb.wait();
    check_elements(a.data(), 9, [&](std::int64_t) { return s; }, 0.0, "fused float16 Sum");
    check_elements(b.data(), 10, [&](std::int64_t) { return 4.0; }, tolerance<dtrain::float16_t>(),
                   "fused float16 Average");
  }
}

TEST_CASE("allgather beyond the count limit falls back to rooted broadcasts") {
  dtrain::init();
  const int rank = world_rank(), size = world_size();
  auto rows = [](int k) { return k == 1 ? 0 : 3 * k + 5; };  // rank 1 (if any) sends nothing
  for (std::int64_t limit : kLimits) {
    CountLimit guard(limit);
    std::vector<std::int64_t> in(static_cast<std::size_t>(rows(rank)));
    for (std::size_t i = 0; i < in.size(); ++i) in[i] = rank * 1000 + static_cast<std::int64_t>(i);
    std::vector<std::int64_t> want;
    for (int k = 0; k < size; ++k)
      for (int i = 0; i < rows(k); ++i) want.push_back(k * 1000 + i);
    auto out = dtrain::allgather(in);
    CHECK_MESSAGE(out == want, fmt::format("allgather with count limit {}", limit));

    std::vector<float> m(static_cast<std::size_t>(rows(rank) * 2), static_cast<float>(rank));
    dtrain::TensorView v(m.data(), static_cast<std::int64_t>(m.size()), dtrain::DataType::float32,
                         dtrain::Device::cpu(), {rows(rank), 2});
    dtrain::OwnedTensor g = dtrain::allgather(v);
    std::int64_t total = 0;
    for (int k = 0; k < size; ++k) total += rows(k);
    CHECK(g.shape() == dtrain::Shape{total, 2});
    std::vector<double> want_m;
    for (int k = 0; k < size; ++k) want_m.insert(want_m.end(), rows(k) * 2, k);
    check_elements(static_cast<const float*>(g.data()), std::min<std::int64_t>(g.numel(), want_m.size()),
                   [&](std::int64_t i) { return want_m[i]; }, 0.0,
                   fmt::format("allgather of [rows, 2] with count limit {}", limit));
  }
}

TEST_CASE("alltoall beyond the count limit falls back to pairwise exchange") {
  dtrain::init();
  const int rank = world_rank(), size = world_size();
  // Very uneven: some pairs exchange many chunks, some none, and the number of chunks a rank sends
  // in one step differs from the number it receives in that step.
  auto split = [](int src, int dst) -> int { return ((src + 1) * (dst + 2) * 7) % 19 * ((src + dst) % 3 != 0); };
  for (std::int64_t limit : kLimits) {
    CountLimit guard(limit);
    for (int round = 0; round < 2; ++round) {  // a second round catches messages left over
      std::vector<int> splits(size);
      std::vector<std::int32_t> in;
      for (int d = 0; d < size; ++d) {
        splits[d] = split(rank, d) + round;
        for (int i = 0; i < splits[d]; ++i) in.push_back(rank * 10000 + d * 100 + i);
      }
      std::vector<std::int32_t> want;
      std::vector<std::int64_t> want_splits;
      for (int s = 0; s < size; ++s) {
        want_splits.push_back(split(s, rank) + round);
        for (int i = 0; i < split(s, rank) + round; ++i) want.push_back(s * 10000 + rank * 100 + i);
      }
      auto [out, received] = dtrain::alltoall(in, splits);
      CHECK(received == want_splits);
      CHECK_MESSAGE(out == want, fmt::format("alltoall with count limit {}, round {}", limit, round));
    }
  }
}

TEST_CASE("reducescatter beyond the count limit falls back to rooted reductions") {
  dtrain::init();
  const int rank = world_rank(), size = world_size();
  for (std::int64_t limit : kLimits) {
    CountLimit guard(limit);
    for (std::int64_t rows : {std::int64_t{2}, std::int64_t{4} * size + 3, std::int64_t{41}}) {
      std::vector<std::int64_t> in(static_cast<std::size_t>(rows));
      std::iota(in.begin(), in.end(), std::int64_t{rank});
      auto out = dtrain::reducescatter(in, ReduceOp::Sum);
      const std::int64_t first = scatter_start(rows, size, rank);
      CHECK(static_cast<std::int64_t>(out.size()) == scatter_rows(rows, size, rank));
      check_elements(out.data(), std::min<std::int64_t>(out.size(), scatter_rows(rows, size, rank)),
                     [&](std::int64_t j) {
                       return size * (first + j) + std::int64_t{size} * (size - 1) / 2;
                     },
                     0.0, fmt::format("reducescatter of {} rows with count limit {}", rows, limit));

      std::vector<double> m(static_cast<std::size_t>(rows * 3), rank + 1.0);
      dtrain::TensorView v(m.data(), rows * 3, dtrain::DataType::float64, dtrain::Device::cpu(),
                           {rows, 3});
      dtrain::OwnedTensor o = dtrain::reducescatter(v, ReduceOp::Average);
      CHECK(o.shape() == dtrain::Shape{scatter_rows(rows, size, rank), 3});
      check_elements(static_cast<const double*>(o.data()), o.numel(),
                     [&](std::int64_t) { return (size + 1) / 2.0; }, tolerance<double>(2),
                     fmt::format("reducescatter Average of [{}, 3] with count limit {}", rows, limit));
    }
  }
}
