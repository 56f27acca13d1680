// The collectives on torch::Tensor (CPU; include/dtrain/torch/tensor.hpp): every dtype dtrain
// carries, shapes with a different dim 0 per rank, new outputs allocated like the input, and the
// tensors dtrain cannot use (non-contiguous, unsupported dtype) refused on every rank with the fix
// named. Values are small integers, exact in every dtype (bfloat16 included), so every result is
// checked against its closed form exactly.
#include <cstdint>
#include <string>
#include <vector>

#include "dtrain/torch.hpp"
#include "train/train_test_util.hpp"

namespace {

using train_test::world_rank;
using train_test::world_size;

const std::vector<torch::ScalarType> kDtypes = {torch::kByte, torch::kChar,     torch::kInt,
                                                torch::kLong, torch::kHalf,     torch::kBFloat16,
                                                torch::kFloat, torch::kDouble};

// Element i of rank r's tensor: at most 29, so a sum over 4 ranks fits int8.
torch::Tensor values(int r, std::vector<std::int64_t> shape, torch::ScalarType dtype) {
  std::int64_t n = 1;
  for (auto s : shape) n *= s;
  return ((torch::arange(n, torch::kLong) * 3 + r * 7) % 30).view(shape).to(dtype);
}

// Same dtype, device, sizes and values; new memory, contiguous.
bool matches(const torch::Tensor& got, const torch::Tensor& want) {
  return got.scalar_type() == want.scalar_type() && got.device() == want.device() &&
         got.sizes() == want.sizes() && got.is_contiguous() && torch::equal(got, want);
}

std::string dtype_name(torch::ScalarType t) { return c10::toString(t); }

}  // namespace

TEST_CASE("torch::Tensor allreduce: Sum and Max in every dtype, Average in floating types") {
  dtrain::init();
  const int n = world_size(), me = world_rank();
  for (const auto dtype : kDtypes) {
    CAPTURE(dtype_name(dtype));
    auto t = values(me, {2, 3}, dtype);
    dtrain::allreduce(t, {.op = dtrain::ReduceOp::Sum});
    auto sum = torch::zeros({2, 3}, torch::kLong);
    auto max = values(0, {2, 3}, torch::kLong);
    for (int r = 0; r < n; ++r) {
      sum += values(r, {2, 3}, torch::kLong);
      max = torch::maximum(max, values(r, {2, 3}, torch::kLong));
    }
    CHECK(matches(t, sum.to(dtype)));
    auto m = values(me, {2, 3}, dtype);
    dtrain::allreduce(m, {.op = dtrain::ReduceOp::Max});
    CHECK(matches(m, max.to(dtype)));
    if (torch::isFloatingType(dtype)) {
      // The division by 3 ranks is inexact: within two roundings of the dtype.
      auto a = values(me, {2, 3}, dtype);
      dtrain::allreduce(a);
      const auto want = sum.to(torch::kDouble) / n;
      const double u = dtype == torch::kBFloat16 ? 0x1p-8
                       : dtype == torch::kHalf   ? 0x1p-11
                       : dtype == torch::kFloat  ? 0x1p-24
                                                 : 0x1p-53;
      CHECK(((a.to(torch::kDouble) - want).abs() <= 2 * u * want.abs()).all().item<bool>());
    }
  }
  auto scalar = torch::tensor(static_cast<double>(me));  // 0-d: one element
  dtrain::allreduce(scalar, {.op = dtrain::ReduceOp::Sum});
  CHECK(scalar.dim() == 0);
  CHECK(scalar.item<double>() == n * (n - 1) / 2.0);
}

TEST_CASE("torch::Tensor allgather: rows of every rank in rank order, dim 0 differing") {
  dtrain::init();
  const int n = world_size(), me = world_rank();
  for (const auto dtype : kDtypes) {
    CAPTURE(dtype_name(dtype));
    const auto mine = values(me, {me + 1, 2, 3}, dtype);
    const auto got = dtrain::allgather(mine);
    std::vector<torch::Tensor> parts;
    for (int r = 0; r < n; ++r) parts.push_back(values(r, {r + 1, 2, 3}, dtype));
    CHECK(matches(got, torch::cat(parts)));
    CHECK(got.data_ptr() != mine.data_ptr());
  }
  // The async form, and a rank without rows.
  const auto empty_or_not = values(me, {me % 2, 4}, torch::kFloat);
  const auto got = dtrain::allgather_async(empty_or_not).get();
  std::vector<torch::Tensor> parts;
  for (int r = 0; r < n; ++r) parts.push_back(values(r, {r % 2, 4}, torch::kFloat));
  CHECK(matches(got, torch::cat(parts)));
}

TEST_CASE("torch::Tensor broadcast from the last rank, in place, in every dtype") {
  dtrain::init();
  const int root = world_size() - 1;
  for (const auto dtype : kDtypes) {
    CAPTURE(dtype_name(dtype));
    auto t = values(world_rank(), {3, 2, 2}, dtype);
    const auto where = t.data_ptr();
    dtrain::broadcast(t, root);
    CHECK(matches(t, values(root, {3, 2, 2}, dtype)));
    CHECK(t.data_ptr() == where);
  }
}

TEST_CASE("torch::Tensor alltoall: uneven splits, received splits, every dtype") {
  dtrain::init();
  const int n = world_size(), me = world_rank();
  // Some splits are 0, no rank sends nothing.
  auto split = [](int from, int to) { return static_cast<std::int64_t>((from + to + 1) % 3); };
  for (const auto dtype : kDtypes) {
    CAPTURE(dtype_name(dtype));
    // Rank r sends split(r, d) rows of value 10 r + d to rank d.
    std::vector<std::int64_t> splits;
    std::vector<torch::Tensor> rows;
    for (int d = 0; d < n; ++d) {
      splits.push_back(split(me, d));
      rows.push_back(torch::full({split(me, d), 2}, 10 * me + d, torch::kLong));
    }
    const auto sent = torch::cat(rows).to(dtype);
    auto [received, received_splits] = dtrain::alltoall(sent, splits);
    std::vector<std::int64_t> want_splits;
    std::vector<torch::Tensor> want;
    for (int s = 0; s < n; ++s) {
      want_splits.push_back(split(s, me));
      want.push_back(torch::full({split(s, me), 2}, 10 * s + me, torch::kLong));
    }
    CHECK(matches(received, torch::cat(want).to(dtype)));
    CHECK(received_splits == want_splits);
  }
}

TEST_CASE("torch::Tensor reducescatter: this rank's rows of the sum, earlier ranks take more") {
  dtrain::init();
  const int n = world_size(), me = world_rank();
  const std::int64_t rows = 2 * n + 1;  // rank 0 takes the extra row
  const std::int64_t first = me == 0 ? 0 : 2 * me + 1, mine = me == 0 ? 3 : 2;
  for (const auto dtype : kDtypes) {
    CAPTURE(dtype_name(dtype));
    auto sum = torch::zeros({rows, 3}, torch::kLong);
    for (int r = 0; r < n; ++r) sum += values(r, {rows, 3}, torch::kLong);
    const auto got = dtrain::reducescatter(values(me, {rows, 3}, dtype), dtrain::ReduceOp::Sum);
    CHECK(matches(got, sum.narrow(0, first, mine).to(dtype)));
  }
}

TEST_CASE("torch::Tensor inputs dtrain cannot use are refused on every rank, naming the fix") {
  dtrain::init();
  using dtrain::InvalidArgumentError;
  // A transposed view: its elements are not in row-major order in memory.
  auto transposed = values(world_rank(), {3, 4}, torch::kFloat).t();
  CHECK_FALSE(transposed.is_contiguous());
  CHECK_THROWS_WITH_AS(dtrain::allreduce(transposed),
                       doctest::Contains("non-contiguous torch::Tensor (sizes 4,3, strides 1,4)"),
                       InvalidArgumentError);
  CHECK_THROWS_WITH_AS(dtrain::allgather(transposed), doctest::Contains("call .contiguous()"),
                       InvalidArgumentError);
  // What the message says to do works.
  const auto gathered = dtrain::allgather(transposed.contiguous());
  std::vector<torch::Tensor> parts;
  for (int r = 0; r < world_size(); ++r) parts.push_back(values(r, {3, 4}, torch::kFloat).t());
  CHECK(matches(gathered, torch::cat(parts).contiguous()));

  auto flags = torch::ones({4}, torch::kBool);
  CHECK_THROWS_WITH_AS(dtrain::allreduce(flags),
                       doctest::Contains("torch dtype Bool is not supported"), InvalidArgumentError);
  torch::Tensor undefined;
  CHECK_THROWS_WITH_AS(dtrain::broadcast(undefined, 0),
                       doctest::Contains("undefined torch::Tensor"), InvalidArgumentError);
}
