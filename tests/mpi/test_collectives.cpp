// allgather, broadcast, alltoall, reducescatter and barrier on host memory, for every dtype, with
// per-rank row counts, empty contributions, multi-dimensional rows and every root.
#include <array>
#include <chrono>
#include <cstdint>
#include <numeric>
#include <span>
#include <thread>
#include <vector>

#include "mpi_test_util.hpp"

namespace {

using dtrain::ReduceOp;
using namespace dtrain_test;

// Small integers: exact in every dtype, including int8 and bfloat16.
inline double cell(int r, std::int64_t row, std::int64_t col) {
  return static_cast<double>(r * 16 + (row % 4) * 3 + col);
}

template <class T>
std::vector<T> rows_of(int r, std::int64_t rows, std::int64_t cols) {
  std::vector<T> v(static_cast<std::size_t>(rows * cols));
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t c = 0; c < cols; ++c) v[i * cols + c] = from_double<T>(cell(r, i, c));
  return v;
}

// Checks the concatenation of rank k's rows_of(k, rows(k), cols) over k, in rank order.
template <class T, class Rows>
void check_gathered(const T* got, std::int64_t numel, std::int64_t cols, Rows&& rows,
                    std::string_view what) {
  std::vector<double> want;
  for (int k = 0; k < world_size(); ++k)
    for (std::int64_t i = 0; i < rows(k); ++i)
      for (std::int64_t c = 0; c < cols; ++c) want.push_back(cell(k, i, c));
  CHECK_MESSAGE(numel == static_cast<std::int64_t>(want.size()),
                fmt::format("{}: {} elements, expected {}", what, numel, want.size()));
  check_elements(got, std::min<std::int64_t>(numel, static_cast<std::int64_t>(want.size())),
                 [&](std::int64_t i) { return want[i]; }, 0.0, what);
}

}  // namespace

// ---- allgather ----------------------------------------------------------------------------------

TEST_CASE_TEMPLATE("allgather concatenates per-rank rows in rank order", T, DTRAIN_TEST_ALL_TYPES) {
  dtrain::init();
  const int rank = world_rank();
  const auto dtype = dtrain::dtype_of<T>;

  {  // 1-D, rank r contributes r rows: rank 0 contributes nothing
    auto in = rows_of<T>(rank, rank, 1);
    std::vector<T> out = dtrain::allgather(in);
    check_gathered(out.data(), static_cast<std::int64_t>(out.size()), 1, [](int k) { return k; },
                   "allgather of vectors with rank rows");
  }
  {  // the same 1-D vector on every rank: 7 rows each
    auto in = rows_of<T>(rank, 7, 1);
    std::vector<T> out = dtrain::allgather(std::span<const T>(in));
    check_gathered(out.data(), static_cast<std::int64_t>(out.size()), 1, [](int) { return 7; },
                   "allgather of spans of 7");
  }
  {  // 2-D [r + 1, 3]: the output shape is [sum of rows, 3]
    auto in = rows_of<T>(rank, rank + 1, 3);
    dtrain::TensorView v(in.data(), static_cast<std::int64_t>(in.size()), dtype,
                         dtrain::Device::cpu(), {rank + 1, 3});
    dtrain::OwnedTensor out = dtrain::allgather(v);
    const std::int64_t n = world_size();
    CHECK(out.dtype() == dtype);
    CHECK(out.shape() == dtrain::Shape{n * (n + 1) / 2, 3});
    check_gathered(static_cast<const T*>(out.data()), out.numel(), 3, [](int k) { return k + 1; },
                   "allgather of [rank + 1, 3] views");
  }
  {  // every rank empty: [0, 5]
    dtrain::TensorView v(nullptr, 0, dtype, dtrain::Device::cpu(), {0, 5});
    dtrain::OwnedTensor out = dtrain::allgather(v);
    CHECK(out.shape() == dtrain::Shape{0, 5});
    CHECK(out.numel() == 0);
  }
  {  // only the last rank contributes: [2, 2]
    const bool last = rank == world_size() - 1;
    auto in = rows_of<T>(rank, last ? 2 : 0, 2);
    dtrain::TensorView v(in.data(), static_cast<std::int64_t>(in.size()), dtype,
                         dtrain::Device::cpu(), {last ? 2 : 0, 2});
    dtrain::OwnedTensor out = dtrain::allgather(v);
    CHECK(out.shape() == dtrain::Shape{2, 2});
    check_gathered(static_cast<const T*>(out.data()), out.numel(), 2,
                   [](int k) { return k == world_size() - 1 ? 2 : 0; },
                   "allgather where only the last rank has rows");
  }
}

TEST_CASE("allgather of an odd, large count (1000003 floats per rank)") {
  dtrain::init();
  const int rank = world_rank();
  std::vector<float> in(1000003);
  for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(rank * 2000000 + i);
  std::vector<float> out = dtrain::allgather(in);
  CHECK(out.size() == in.size() * world_size());
  check_elements(out.data(), static_cast<std::int64_t>(out.size()),
                 [&](std::int64_t j) {
                   return static_cast<float>((j / 1000003) * 2000000 + j % 1000003);
                 },
                 0.0, "allgather of 1000003 floats");
}

// ---- broadcast ----------------------------------------------------------------------------------

TEST_CASE_TEMPLATE("broadcast from every root", T, DTRAIN_TEST_ALL_TYPES) {
  dtrain::init();
  const int rank = world_rank(), size = world_size();
  const auto dtype = dtrain::dtype_of<T>;
  for (int root = 0; root < size; ++root) {
    for (std::int64_t n : {0, 1, 7, 33}) {
      auto v = rows_of<T>(rank, n, 1);
      dtrain::broadcast(v, root);
      check_elements(v.data(), n, [&](std::int64_t i) { return cell(root, i, 0); }, 0.0,
                     fmt::format("broadcast of {} elements from root {}", n, root));
    }
    auto m = rows_of<T>(rank, 5, 3);
    dtrain::TensorView view(m.data(), 15, dtype, dtrain::Device::cpu(), {5, 3});
    dtrain::broadcast(view, root);
    check_elements(m.data(), 15, [&](std::int64_t i) { return cell(root, i / 3, i % 3); }, 0.0,
                   fmt::format("broadcast of [5, 3] from root {}", root));

    std::array<T, 4> a{};
    for (std::size_t i = 0; i < a.size(); ++i) a[i] = from_double<T>(cell(rank, 0, i));
    dtrain::broadcast(a, root);
    check_elements(a.data(), 4, [&](std::int64_t i) { return cell(root, 0, i); }, 0.0,
                   fmt::format("broadcast of std::array from root {}", root));
  }
}

TEST_CASE("broadcast of an odd, large count (1000003 doubles) from the last rank") {
  dtrain::init();
  const int rank = world_rank(), root = world_size() - 1;
  std::vector<double> v(1000003);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = rank * 1e7 + static_cast<double>(i);
  dtrain::broadcast(v, root);
  check_elements(v.data(), static_cast<std::int64_t>(v.size()),
                 [&](std::int64_t i) { return root * 1e7 + static_cast<double>(i); }, 0.0,
                 "broadcast of 1000003 doubles");
}

// ---- alltoall -----------------------------------------------------------------------------------

namespace {

// Rows rank `src` sends to rank `dst`: uneven, with zeros.
inline std::int64_t split(int src, int dst) { return (src + 2 * dst) % 3; }

// Encodes (source, destination, row, column): at most 3*16 + 3*4 + 2*2 + 1 < 128.
inline double a2a_cell(int src, int dst, std::int64_t row, std::int64_t col) {
  return static_cast<double>(src * 16 + dst * 4 + row * 2 + col);
}

template <class T>
void alltoall_case(std::int64_t cols, bool as_view) {
  const int rank = world_rank(), size = world_size();
  std::vector<int> splits(size);
  std::vector<T> in;
  for (int d = 0; d < size; ++d) {
    splits[d] = static_cast<int>(split(rank, d));
    for (std::int64_t i = 0; i < splits[d]; ++i)
      for (std::int64_t c = 0; c < cols; ++c) in.push_back(from_double<T>(a2a_cell(rank, d, i, c)));
  }
  const std::int64_t rows = std::accumulate(splits.begin(), splits.end(), std::int64_t{0});
  std::vector<double> want;
  std::vector<std::int64_t> want_splits;
  for (int s = 0; s < size; ++s) {
    want_splits.push_back(split(s, rank));
    for (std::int64_t i = 0; i < split(s, rank); ++i)
      for (std::int64_t c = 0; c < cols; ++c) want.push_back(a2a_cell(s, rank, i, c));
  }
  const std::string what = fmt::format("alltoall of {} ({} columns{})",
                                       dtrain::to_string(dtrain::dtype_of<T>), cols,
                                       as_view ? ", TensorView" : "");
  if (as_view) {
    dtrain::TensorView v(in.data(), static_cast<std::int64_t>(in.size()), dtrain::dtype_of<T>,
                         dtrain::Device::cpu(), {rows, cols});
    auto [out, received] = dtrain::alltoall(v, splits);
    CHECK(received == want_splits);
    const std::int64_t got_rows = static_cast<std::int64_t>(want.size()) / cols;
    CHECK(out.shape() == dtrain::Shape{got_rows, cols});
    CHECK(out.numel() == static_cast<std::int64_t>(want.size()));
    check_elements(static_cast<const T*>(out.data()),
                   std::min<std::int64_t>(out.numel(), static_cast<std::int64_t>(want.size())),
                   [&](std::int64_t i) { return want[i]; }, 0.0, what);
  } else {
    auto [out, received] = dtrain::alltoall(in, splits);
    CHECK(received == want_splits);
    CHECK(out.size() == want.size());
    check_elements(out.data(), std::min<std::int64_t>(out.size(), want.size()),
                   [&](std::int64_t i) { return want[i]; }, 0.0, what);
  }
}

}  // namespace

TEST_CASE_TEMPLATE("alltoall with uneven splits including zeros", T, DTRAIN_TEST_ALL_TYPES) {
  dtrain::init();
  alltoall_case<T>(1, false);
  alltoall_case<T>(2, true);
}

TEST_CASE("alltoall: nothing sent anywhere, and everything to one rank") {
  dtrain::init();
  const int rank = world_rank(), size = world_size();
  {
    std::vector<float> in;
    std::vector<std::int64_t> zeros(size, 0);
    auto [out, received] = dtrain::alltoall(in, zeros);
    CHECK(out.empty());
    CHECK(received == zeros);
  }
  {  // every rank sends all its 3 rows to rank 0; splits given as std::vector<std::int64_t>
    std::vector<std::int32_t> in{rank, rank + 10, rank + 20};
    std::vector<std::int64_t> splits(size, 0);
    splits[0] = 3;
    auto [out, received] = dtrain::alltoall(in, splits);
    if (rank == 0) {
      std::vector<std::int32_t> want;
      for (int s = 0; s < size; ++s) want.insert(want.end(), {s, s + 10, s + 20});
      CHECK(out == want);
      CHECK(received == std::vector<std::int64_t>(size, 3));
    } else {
      CHECK(out.empty());
      CHECK(received == std::vector<std::int64_t>(size, 0));
    }
  }
}

// ---- reducescatter ------------------------------------------------------------------------------

namespace {

template <class T>
double rs_value(int r, std::int64_t i, ReduceOp op) {
  // Products of 1s, 2s and 3s over 4 ranks stay within int8 and are exact in every dtype.
  if (op == ReduceOp::Product) return 1.0 + static_cast<double>((r + i) % 3);
  double v = (r + 1) + static_cast<double>(i % 6);
  if constexpr (is_float_v<T>) v += 0.5 * static_cast<double>((r + i) % 2);
  return v;
}

template <class T>
void reducescatter_case(std::int64_t rows, std::int64_t cols, ReduceOp op) {
  const int rank = world_rank(), size = world_size();
  std::vector<T> in(static_cast<std::size_t>(rows * cols));
  for (std::size_t i = 0; i < in.size(); ++i) in[i] = from_double<T>(rs_value<T>(rank, i, op));
  const std::int64_t my_rows = scatter_rows(rows, size, rank);
  const std::int64_t first = scatter_start(rows, size, rank) * cols;
  auto expected = [&](std::int64_t j) {
    const std::int64_t i = first + j;
    double acc = rs_value<T>(0, i, op);
    for (int k = 1; k < size; ++k) {
      const double v = rs_value<T>(k, i, op);
      acc = op == ReduceOp::Min       ? std::min(acc, v)
            : op == ReduceOp::Max     ? std::max(acc, v)
            : op == ReduceOp::Product ? acc * v
                                      : acc + v;
    }
    return op == ReduceOp::Average ? acc / size : acc;
  };
  const std::string what = fmt::format("reducescatter {} of {} [{}, {}] on rank {}",
                                       dtrain::to_string(op), dtrain::to_string(dtrain::dtype_of<T>),
                                       rows, cols, rank);
  const double tol = op == ReduceOp::Average ? tolerance<T>(2) : 0.0;
  if (cols == 1) {
    std::vector<T> out = dtrain::reducescatter(in, op);
    CHECK_MESSAGE(static_cast<std::int64_t>(out.size()) == my_rows, what);
    check_elements(out.data(), std::min<std::int64_t>(out.size(), my_rows), expected, tol, what);
  } else {
    dtrain::TensorView v(in.data(), rows * cols, dtrain::dtype_of<T>, dtrain::Device::cpu(),
                         {rows, cols});
    dtrain::OwnedTensor out = dtrain::reducescatter(v, op);
    CHECK_MESSAGE((out.shape() == dtrain::Shape{my_rows, cols}), what);
    check_elements(static_cast<const T*>(out.data()), std::min(out.numel(), my_rows * cols),
                   expected, tol, what);
  }
}

}  // namespace

TEST_CASE_TEMPLATE("reducescatter gives earlier ranks the remainder rows", T, DTRAIN_TEST_ALL_TYPES) {
  dtrain::init();
  const std::int64_t n = world_size();
  std::vector<ReduceOp> ops{ReduceOp::Sum, ReduceOp::Min, ReduceOp::Max, ReduceOp::Product};
  if constexpr (is_float_v<T>) ops.push_back(ReduceOp::Average);
  // Divisible, remainders, fewer rows than ranks, and no rows at all.
  const std::vector<std::int64_t> row_counts{0, 1, n - 1, n, n + 1, 2 * n + (n > 1 ? n - 1 : 0), 13};
  for (ReduceOp op : ops) {
    for (std::int64_t rows : row_counts) reducescatter_case<T>(rows, 1, op);
    reducescatter_case<T>(5, 3, op);
    reducescatter_case<T>(n + 1, 2, op);
  }
}

TEST_CASE("reducescatter of an odd, large count (1000003 floats)") {
  dtrain::init();
  reducescatter_case<float>(1000003, 1, ReduceOp::Sum);
}

// ---- barrier ------------------------------------------------------------------------------------

TEST_CASE("barrier: no rank leaves before the last one has arrived") {
  // The ranks share one machine, so steady_clock (CLOCK_MONOTONIC) readings compare across them.
  dtrain::init();
  const int rank = world_rank(), size = world_size(), late = size - 1;
  using Clock = std::chrono::steady_clock;
  const auto ns = [](Clock::time_point t) {
    return static_cast<long long>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count());
  };
  for (int round = 0; round < 3; ++round) {
    long long arrived = 0;
    if (rank == late) {
      std::this_thread::sleep_for(std::chrono::milliseconds(150));
      arrived = ns(Clock::now());
    }
    if (round == 0) dtrain::barrier();
    else dtrain::barrier_async().wait();
    const long long left = ns(Clock::now());
    long long last_arrival = 0;
    MPI_Allreduce(&arrived, &last_arrival, 1, MPI_LONG_LONG, MPI_MAX, MPI_COMM_WORLD);
    CHECK_MESSAGE(left >= last_arrival, fmt::format("round {}: rank {} left the barrier {:.1f} ms "
                                                    "before rank {} arrived", round, rank,
                                                    (last_arrival - left) / 1e6, late));
  }
}

// ---- handles ------------------------------------------------------------------------------------

TEST_CASE("handles: poll() and wait_for() say false while a rank has not submitted, then true") {
  dtrain::init();
  const int rank = world_rank(), size = world_size(), late = size - 1;
  std::vector<float> v(8, static_cast<float>(rank + 1));
  if (size == 1) {
    auto h = dtrain::allreduce_async(v, {.op = ReduceOp::Sum, .name = "handles.alone"});
    CHECK(h.wait_for(std::chrono::seconds(30)));
    CHECK(h.poll());
    return;
  }
  // The last rank submits only once every other rank has seen the op pending.
  dtrain::Handle h;
  if (rank != late) {
    h = dtrain::allreduce_async(v, {.op = ReduceOp::Sum, .name = "handles.late"});
    CHECK_FALSE(h.poll());
    CHECK_FALSE(h.wait_for(std::chrono::milliseconds(100)));
    CHECK_FALSE(h.poll());
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == late) h = dtrain::allreduce_async(v, {.op = ReduceOp::Sum, .name = "handles.late"});
  CHECK(h.wait_for(std::chrono::seconds(60)));
  CHECK(h.poll());
  CHECK(v[0] == static_cast<float>(size * (size + 1) / 2));
  CHECK_NOTHROW(h.wait());  // a completed handle can be waited on again

  // wait_for() rethrows the op's error, like wait().
  std::vector<float> odd(rank == late ? 3 : 4, 1.0f);
  auto bad = dtrain::allreduce_async(odd, {.name = "handles.mismatch"});
  CHECK_THROWS_AS(bad.wait_for(std::chrono::seconds(60)), dtrain::MismatchError);
  CHECK(bad.poll());

  dtrain::Handle empty;
  CHECK_THROWS_AS((void)empty.poll(), dtrain::InvalidArgumentError);
}
