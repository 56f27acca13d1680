// Errors: local misuse is rejected on the calling rank with InvalidArgumentError before anything is
// submitted; ranks that disagree about an op all get MismatchError naming the tensor, the field and
// the ranks with their values. Every case is taken by all ranks alike, and the runtime keeps
// working afterwards.
#include <cstdint>
#include <string>
#include <vector>

#include "mpi_test_util.hpp"

namespace {

using dtrain::ReduceOp;
using namespace dtrain_test;

// Runs `call`, expects exception type E, and checks that its message contains every fragment.
template <class E, class F>
void check_throws(F&& call, const std::vector<std::string>& fragments, const std::string& what) {
  try {
    call();
    FAIL_CHECK(what << ": no exception");
  } catch (const E& e) {
    const std::string message = e.what();
    INFO(what, ": ", message);
    for (const auto& f : fragments) CHECK_MESSAGE(message.find(f) != std::string::npos, "missing '" << f << "'");
  } catch (const std::exception& e) {
    FAIL_CHECK(what << ": wrong exception type: " << e.what());
  }
}

// The runtime still completes a collective after an error.
void check_still_works() {
  std::vector<std::int64_t> v{1};
  dtrain::allreduce(v, {.op = ReduceOp::Sum});
  CHECK(v[0] == world_size());
}

}  // namespace

TEST_CASE("broadcast with a root outside the world") {
  dtrain::init();
  const int size = dtrain::size();
  std::vector<float> v(4, 1.0f);
  for (int root : {-1, size, size + 5}) {
    check_throws<dtrain::InvalidArgumentError>(
        [&] { dtrain::broadcast(v, root); },
        {"broadcast", fmt::format("root rank {}", root), fmt::format("{} ranks", size)},
        fmt::format("broadcast root {}", root));
    check_throws<dtrain::InvalidArgumentError>([&] { (void)dtrain::broadcast_async(v, root); },
                                               {fmt::format("root rank {}", root)},
                                               "broadcast_async");
  }
  CHECK(v == std::vector<float>(4, 1.0f));
  check_still_works();
}

TEST_CASE("alltoall with wrong splits") {
  dtrain::init();
  const int size = dtrain::size();
  std::vector<std::int32_t> v(static_cast<std::size_t>(size), 7);
  std::vector<int> too_many(size + 1, 0);
  too_many[0] = size;
  check_throws<dtrain::InvalidArgumentError>(
      [&] { (void)dtrain::alltoall(v, too_many); },
      {"alltoall", fmt::format("{} splits", size + 1), fmt::format("{} ranks", size)},
      "one split too many");
  if (size > 1) {
    std::vector<int> too_few(size - 1, 1);
    too_few[0] += 1;
    check_throws<dtrain::InvalidArgumentError>([&] { (void)dtrain::alltoall(v, too_few); },
                                               {fmt::format("{} splits", size - 1)}, "one split too few");
  }
  std::vector<int> negative(size, 1);
  negative[size - 1] += 2;
  negative[0] = -1;
  check_throws<dtrain::InvalidArgumentError>([&] { (void)dtrain::alltoall(v, negative); },
                                             {"negative split", "-1"}, "negative split");
  std::vector<std::int64_t> wrong_sum(size, 1);
  wrong_sum[0] = 2;
  check_throws<dtrain::InvalidArgumentError>(
      [&] { (void)dtrain::alltoall(v, wrong_sum); },
      {fmt::format("add up to {}", size + 1), fmt::format("{} rows", size)}, "splits of the wrong sum");
  check_still_works();
}

TEST_CASE("tensors that describe themselves inconsistently") {
  dtrain::init();
  float storage[8] = {};
  dtrain::TensorView null_data(nullptr, 5, dtrain::DataType::float32);
  check_throws<dtrain::InvalidArgumentError>([&] { dtrain::allreduce(null_data); },
                                             {"null", "5 elements"}, "allreduce of null data");
  check_throws<dtrain::InvalidArgumentError>([&] { (void)dtrain::allgather(null_data); },
                                             {"null"}, "allgather of null data");
  check_throws<dtrain::InvalidArgumentError>([&] { dtrain::broadcast(null_data, 0); }, {"null"},
                                             "broadcast of null data");

  dtrain::TensorView bad_shape(storage, 6, dtrain::DataType::float32, dtrain::Device::cpu(), {4, 2});
  check_throws<dtrain::InvalidArgumentError>([&] { dtrain::allreduce(bad_shape); },
                                             {"[4, 2]", "8 elements", "6"},
                                             "shape and element count disagree");
  dtrain::TensorView negative_dim(storage, 0, dtrain::DataType::float32, dtrain::Device::cpu(), {-2, 0});
  check_throws<dtrain::InvalidArgumentError>([&] { (void)dtrain::allgather(negative_dim); },
                                             {"negative dimension"}, "negative dimension");
  // 2^32 * 2^32 wraps to 0 in 64 bits: without the overflow check it would pass for empty.
  dtrain::TensorView overflowing(storage, 0, dtrain::DataType::float32, dtrain::Device::cpu(),
                                 {std::int64_t{1} << 32, std::int64_t{1} << 32});
  check_throws<dtrain::InvalidArgumentError>(
      [&] { dtrain::allreduce(overflowing, {.name = "overflowing"}); },
      {"allreduce 'overflowing'", "[4294967296, 4294967296]", "64-bit"}, "element count overflow");
  dtrain::TensorView negative_count(storage, -1, dtrain::DataType::float32);
  check_throws<dtrain::InvalidArgumentError>([&] { dtrain::allreduce(negative_count); },
                                             {"negative element count"}, "negative element count");
  dtrain::TensorView bad_dtype(storage, 2, static_cast<dtrain::DataType>(42));
  check_throws<dtrain::InvalidArgumentError>([&] { dtrain::allreduce(bad_dtype); },
                                             {"dtype", "42"}, "invalid dtype");

  // Null data with no elements is a valid empty tensor.
  dtrain::TensorView empty(nullptr, 0, dtrain::DataType::float32);
  CHECK_NOTHROW(dtrain::allreduce(empty));
  check_still_works();
}

TEST_CASE("Average and scale factors on integer tensors are rejected") {
  dtrain::init();
  std::vector<std::int32_t> v(3, 1);
  check_throws<dtrain::InvalidArgumentError>([&] { dtrain::allreduce(v); },
                                             {"Average", "int32", "ReduceOp::Sum"},
                                             "default Average on int32");
  check_throws<dtrain::InvalidArgumentError>(
      [&] { dtrain::allreduce(v, {.op = ReduceOp::Sum, .prescale = 2.0}); }, {"scale"},
      "prescale on int32");
  std::vector<std::uint8_t> u(3, 1);
  check_throws<dtrain::InvalidArgumentError>(
      [&] { dtrain::allreduce(u, {.op = ReduceOp::Max, .postscale = 0.5}); }, {"scale", "uint8"},
      "postscale on uint8");
  check_throws<dtrain::InvalidArgumentError>([&] { (void)dtrain::reducescatter(v); },
                                             {"reducescatter", "Average"},
                                             "reducescatter Average on int32");
  std::vector<std::vector<std::int64_t>> group{{1}, {2}};
  check_throws<dtrain::InvalidArgumentError>([&] { dtrain::grouped_allreduce(group); },
                                             {"Average"}, "grouped Average on int64");
  std::vector<float> f(2, 1.0f);
  check_throws<dtrain::InvalidArgumentError>(
      [&] { dtrain::allreduce(f, {.op = static_cast<ReduceOp>(9)}); }, {"ReduceOp", "9"},
      "invalid ReduceOp");
  CHECK(v == std::vector<std::int32_t>(3, 1));
  check_still_works();
}

TEST_CASE("a name already in flight is refused; the first op is untouched") {
  dtrain::init();
  const int rank = world_rank(), size = world_size();
  // An op stays in flight until every rank has submitted it, so the checking rank submits, checks,
  // and only then lets the others submit. A single rank cannot hold an op in flight on purpose.
  if (size < 2) return;
  for (int checker : {0, size - 1}) {
    const std::string name = fmt::format("twice.{}", checker);
    std::vector<float> a(3, 1.0f), b(3, 5.0f);
    dtrain::Handle first;
    if (rank == checker) {
      first = dtrain::allreduce_async(a, {.op = ReduceOp::Sum, .name = name});
      check_throws<dtrain::InvalidArgumentError>(
          [&] { dtrain::allreduce(b, {.op = ReduceOp::Sum, .name = name}); },
          {"'" + name + "'", "already in flight", fmt::format("rank {}", rank)}, "duplicate name");
      MPI_Barrier(MPI_COMM_WORLD);
    } else {
      MPI_Barrier(MPI_COMM_WORLD);
      first = dtrain::allreduce_async(a, {.op = ReduceOp::Sum, .name = name});
    }
    CHECK_NOTHROW(first.wait());
    CHECK(a == std::vector<float>(3, static_cast<float>(size)));
    CHECK(b == std::vector<float>(3, 5.0f));
  }
  check_still_works();
}

TEST_CASE("ranks that disagree all get MismatchError naming tensor, field and ranks") {
  dtrain::init();
  const int rank = dtrain::rank(), size = dtrain::size();
  if (size < 2) return;  // nobody to disagree with
  const bool odd_one = rank == 1;
  auto ranks_except_1 = [&] {
    std::string s = "[0";
    for (int r = 2; r < size; ++r) s += fmt::format(", {}", r);
    return s + "]";
  };

  {  // rank 1 uses a different length
    std::vector<float> v(odd_one ? 4 : 3, 1.0f);
    check_throws<dtrain::MismatchError>(
        [&] { dtrain::allreduce(v, {.name = "grads.layer1"}); },
        {"'grads.layer1'", "shape", "[3] on ranks " + ranks_except_1(), "[4] on ranks [1]"},
        "length mismatch");
    CHECK(v == std::vector<float>(v.size(), 1.0f));
  }
  {  // dtype
    std::vector<float> f(2, 1.0f);
    std::vector<double> d(2, 1.0);
    check_throws<dtrain::MismatchError>(
        [&] {
          if (odd_one) dtrain::allreduce(d, {.name = "dtype.mix"});
          else dtrain::allreduce(f, {.name = "dtype.mix"});
        },
        {"'dtype.mix'", "dtype", "float32", "float64", "on ranks [1]"}, "dtype mismatch");
  }
  {  // reduce op, through the async form
    std::vector<float> v(2, 1.0f);
    auto h = dtrain::allreduce_async(v, {.op = odd_one ? ReduceOp::Max : ReduceOp::Sum, .name = "op.mix"});
    check_throws<dtrain::MismatchError>([&] { h.wait(); }, {"'op.mix'", "reduce op", "Max", "Sum"},
                                        "reduce op mismatch");
  }
  {  // prescale factor
    std::vector<double> v(2, 1.0);
    check_throws<dtrain::MismatchError>(
        [&] { dtrain::allreduce(v, {.prescale = odd_one ? 2.0 : 1.0, .name = "scale.mix"}); },
        {"'scale.mix'", "prescale"}, "prescale mismatch");
  }
  {  // broadcast root
    std::vector<std::int32_t> v(2, rank);
    check_throws<dtrain::MismatchError>([&] { dtrain::broadcast(v, odd_one ? 1 : 0, "root.mix"); },
                                        {"'root.mix'", "root rank", "on ranks [1]"}, "root mismatch");
    CHECK(v == std::vector<std::int32_t>(2, rank));
  }
  {  // allgather rows of different widths
    std::vector<float> storage(12, 0.0f);
    dtrain::TensorView t(storage.data(), 12, dtrain::DataType::float32, dtrain::Device::cpu(),
                         odd_one ? dtrain::Shape{3, 4} : dtrain::Shape{4, 3});
    check_throws<dtrain::MismatchError>([&] { (void)dtrain::allgather(t, "rows.mix"); },
                                        {"'rows.mix'", "[4] on ranks [1]"}, "row shape mismatch");
  }
  {  // the same name used for different ops
    std::vector<float> v(2, 1.0f);
    check_throws<dtrain::MismatchError>(
        [&] {
          if (odd_one) dtrain::broadcast(v, 0, "kind.mix");
          else dtrain::allreduce(v, {.name = "kind.mix"});
        },
        {"'kind.mix'", "op kind", "broadcast", "allreduce"}, "op kind mismatch");
  }
  {  // reducescatter shapes
    std::vector<double> v(odd_one ? 5 : 6, 1.0);
    check_throws<dtrain::MismatchError>([&] { (void)dtrain::reducescatter(v, ReduceOp::Sum, "rs.mix"); },
                                        {"'rs.mix'", "shape"}, "reducescatter shape mismatch");
  }
  check_still_works();
}
