// reducescatter's scale factors, grouped_allgather, grouped_reducescatter and join_async on host
// memory, against closed forms.
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "mpi_test_util.hpp"

using namespace dtrain_test;
using dtrain::ReduceOp;

namespace {

// Rank r's element i: small integers and halves every float dtype holds exactly.
double value(int r, std::int64_t i) { return (r + 1) + 0.5 * static_cast<double>(i % 4); }

// The sum over every rank of value(r, i).
double sum_over_ranks(std::int64_t i) {
  double s = 0;
  for (int r = 0; r < world_size(); ++r) s += value(r, i);
  return s;
}

}  // namespace

TEST_CASE_TEMPLATE("reducescatter applies prescale before and postscale after the reduction", T,
                   DTRAIN_TEST_FLOAT_TYPES) {
  dtrain::init();
  const int rank = world_rank(), size = world_size();
  struct Case {
    ReduceOp op;
    double prescale, postscale;
  };
  for (const Case c : {Case{ReduceOp::Sum, 0.5, 4.0}, Case{ReduceOp::Average, 2.0, 0.25},
                       Case{ReduceOp::Average, 1.0, 1.0}, Case{ReduceOp::Sum, 0.25, 1.0},
                       Case{ReduceOp::Max, 2.0, 0.5}}) {
    for (std::int64_t rows : {std::int64_t{1}, std::int64_t{size}, std::int64_t{2 * size + 1}}) {
      std::vector<T> in(static_cast<std::size_t>(rows));
      for (std::int64_t i = 0; i < rows; ++i)
        in[static_cast<std::size_t>(i)] = from_double<T>(value(rank, i));
      const std::vector<T> out = dtrain::reducescatter(
          in, {.op = c.op, .prescale = c.prescale, .postscale = c.postscale});
      const std::int64_t first = scatter_start(rows, size, rank);
      auto expected = [&](std::int64_t j) {
        const std::int64_t i = first + j;
        double reduced = sum_over_ranks(i) * c.prescale;
        if (c.op == ReduceOp::Average) reduced /= size;
        if (c.op == ReduceOp::Max) reduced = value(size - 1, i) * c.prescale;
        return reduced * c.postscale;
      };
      const std::string what = fmt::format("reducescatter {} prescale {} postscale {} of {} rows",
                                           dtrain::to_string(c.op), c.prescale, c.postscale, rows);
      CHECK_MESSAGE(static_cast<std::int64_t>(out.size()) == scatter_rows(rows, size, rank), what);
      check_elements(out.data(), static_cast<std::int64_t>(out.size()), expected, tolerance<T>(3),
                     what);
    }
  }
}

TEST_CASE("reducescatter scale factors on integers, or not finite, are refused by name") {
  dtrain::init();
  std::vector<std::int32_t> ints(4, 1);
  CHECK_THROWS_WITH_AS(
      dtrain::reducescatter(ints, {.op = ReduceOp::Sum, .prescale = 2.0, .name = "rs.int"}),
      doctest::Contains("'rs.int'"), dtrain::InvalidArgumentError);
  std::vector<float> floats(4, 1.0f);
  CHECK_THROWS_WITH_AS(
      dtrain::reducescatter(
          floats, {.postscale = std::numeric_limits<double>::infinity(), .name = "rs.inf"}),
      doctest::Contains("postscale factor is inf"), dtrain::InvalidArgumentError);
  // The old form still works, and means Average.
  const std::vector<float> out = dtrain::reducescatter(floats, ReduceOp::Sum, "rs.old");
  CHECK(out == std::vector<float>(out.size(), static_cast<float>(world_size())));
}

TEST_CASE("grouped_reducescatter: every member reduced and scattered, scaled, completed together") {
  dtrain::init();
  const int rank = world_rank(), size = world_size();
  std::vector<std::vector<double>> group;
  for (std::int64_t rows : {std::int64_t{3}, std::int64_t{size}, std::int64_t{0}})
    group.emplace_back(static_cast<std::size_t>(rows), rank + 1.0);
  const auto out = dtrain::grouped_reducescatter(
      group, {.op = ReduceOp::Average, .prescale = 4.0, .postscale = 0.5, .name = "grs"});
  REQUIRE(out.size() == 3);
  const double average = (size + 1) / 2.0;
  for (std::size_t k = 0; k < group.size(); ++k) {
    const auto rows = static_cast<std::int64_t>(group[k].size());
    CHECK(out[k] == std::vector<double>(static_cast<std::size_t>(scatter_rows(rows, size, rank)),
                                        average * 4.0 * 0.5));
  }
  const std::vector<std::vector<double>> none;
  CHECK(dtrain::grouped_reducescatter(none).empty());
}

TEST_CASE("grouped_allgather: every member gathered in rank order, shapes kept") {
  dtrain::init();
  const int rank = world_rank(), size = world_size();
  // Member 0: rank r sends r + 1 rows of 3; member 1: rank r sends (r % 2) rows of 1.
  std::vector<std::int64_t> a(static_cast<std::size_t>((rank + 1) * 3));
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = rank * 1000 + static_cast<std::int64_t>(i);
  std::vector<std::int64_t> b(static_cast<std::size_t>(rank % 2), -rank);
  std::vector<dtrain::TensorView> views{
      dtrain::TensorView(a.data(), static_cast<std::int64_t>(a.size()), dtrain::DataType::int64,
                         dtrain::Device::cpu(), {rank + 1, 3}),
      dtrain::TensorView(b.data(), static_cast<std::int64_t>(b.size()))};
  const auto out = dtrain::grouped_allgather(views, {.name = "gag"});
  REQUIRE(out.size() == 2);
  std::vector<std::int64_t> want_a, want_b;
  std::int64_t rows_a = 0;
  for (int r = 0; r < size; ++r) {
    for (std::int64_t i = 0; i < (r + 1) * 3; ++i) want_a.push_back(r * 1000 + i);
    rows_a += r + 1;
    want_b.insert(want_b.end(), static_cast<std::size_t>(r % 2), -r);
  }
  CHECK((out[0].shape() == dtrain::Shape{rows_a, 3}));
  CHECK(std::vector<std::int64_t>(
            static_cast<const std::int64_t*>(out[0].data()),
            static_cast<const std::int64_t*>(out[0].data()) + out[0].numel()) == want_a);
  CHECK(out[1].numel() == static_cast<std::int64_t>(want_b.size()));
  CHECK(std::vector<std::int64_t>(
            static_cast<const std::int64_t*>(out[1].data()),
            static_cast<const std::int64_t*>(out[1].data()) + out[1].numel()) == want_b);
}

TEST_CASE("grouped ops whose ranks disagree on the member count fail on every rank") {
  dtrain::init();
  const int rank = world_rank(), size = world_size();
  if (size < 2) return;
  std::vector<std::vector<float>> group(rank == 0 ? 1 : 2, std::vector<float>(2, 1.0f));
  CHECK_THROWS_WITH_AS(dtrain::grouped_allgather(group, {.name = "uneven"}),
                       doctest::Contains("number of tensors in grouped_allgather 'uneven'"),
                       dtrain::MismatchError);
}

TEST_CASE("join_async: a handle whose result is the last rank to join") {
  dtrain::init();
  const int rank = world_rank();
  // Rank 0 works longest; the others join at once and wait on their handles.
  auto handle = rank == 0 ? dtrain::ResultHandle<int>{} : dtrain::join_async();
  if (rank == 0) {
    std::vector<float> x(3, 2.0f);
    dtrain::allreduce(x, {.name = "before.last.join"});
    CHECK(x == std::vector<float>(3, 2.0f));  // the ranks that joined contributed nothing
    handle = dtrain::join_async();
  }
  CHECK(handle.get() == 0);
}
