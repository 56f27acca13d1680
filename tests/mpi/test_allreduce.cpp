// allreduce and grouped_allreduce on host memory: every ReduceOp, prescale/postscale, every dtype,
// several shapes and tensor forms, checked against closed forms and against plain MPI_Allreduce on
// MPI_COMM_WORLD; every rank must end with bitwise identical results.
#include <algorithm>
#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "mpi_test_util.hpp"
#include "support/reference_reduce.hpp"

namespace {

using dtrain::ReduceOp;
using namespace dtrain_test;

// Inputs chosen so that every partial result over up to 4 ranks is exactly representable in the
// element type (bfloat16 has 8 significant bits): exact ops can then be checked for equality.
template <class T>
double value_for(ReduceOp op, int r, std::int64_t i) {
  switch (op) {
    case ReduceOp::Average:
    case ReduceOp::Sum: {
      double v = (r + 1) + static_cast<double>(i % 5);
      if constexpr (is_float_v<T>) v += 0.25 * static_cast<double>((i + r) % 4);
      return v;
    }
    case ReduceOp::Min:
    case ReduceOp::Max: {
      double v = static_cast<double>((r * 5 + i * 3) % 9);
      if constexpr (!std::is_same_v<T, std::uint8_t>) v -= 4;
      if constexpr (is_float_v<T>) v += 0.5 * (r % 2);
      return v;
    }
    case ReduceOp::Product: {
      if constexpr (is_float_v<T>) return 1.0 + 0.5 * static_cast<double>((r + i) % 3);
      double v = 1.0 + static_cast<double>((r + i) % 3);
      if constexpr (std::is_signed_v<T>)
        if ((r + i) % 2) v = -v;
      return v;
    }
    case ReduceOp::Adasum: break;  // not element-wise: test_adasum.cpp
  }
  return 0;
}

template <class T>
double expected_for(ReduceOp op, double pre, double post, int size, std::int64_t i) {
  const auto contribution = [&](int k) { return pre * value_for<T>(op, k, i); };
  return dtrain::test::reference_reduce(op, size, contribution) * post;
}

enum class Form { vector, span, view_2d };

template <class T>
void allreduce_case(std::int64_t n, Form form, ReduceOp op, double pre = 1.0, double post = 1.0) {
  const int rank = world_rank(), size = world_size();
  std::vector<T> data(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) data[i] = from_double<T>(value_for<T>(op, rank, i));
  const dtrain::AllreduceOptions options{.op = op, .prescale = pre, .postscale = post};
  switch (form) {
    case Form::vector: dtrain::allreduce(data, options); break;
    case Form::span: {
      std::span<T> s(data);
      dtrain::allreduce(s, options);
      break;
    }
    case Form::view_2d: {
      dtrain::TensorView v(data.data(), n, dtrain::dtype_of<T>, dtrain::Device::cpu(), {n / 3, 3});
      dtrain::allreduce(v, options);
      break;
    }
  }
  // Average divides by the rank count; everything else here is exact in T.
  const double tol = op == ReduceOp::Average ? tolerance<T>(2) : 0.0;
  check_elements(data.data(), n, [&](std::int64_t i) { return expected_for<T>(op, pre, post, size, i); },
                 tol,
                 fmt::format("allreduce {} of {} elements ({}), prescale {} postscale {}",
                             dtrain::to_string(op), n, dtrain::to_string(dtrain::dtype_of<T>), pre,
                             post));
  CHECK(same_on_all_ranks(data.data(), data.size() * sizeof(T)));
}

}  // namespace

TEST_CASE("allreduce closed forms over rank values") {
  dtrain::init();
  const int r = dtrain::rank(), n = dtrain::size();
  CHECK(r == world_rank());
  CHECK(n == world_size());

  std::vector<std::int64_t> v(3, r);
  dtrain::allreduce(v, {.op = ReduceOp::Sum});
  CHECK(v == std::vector<std::int64_t>(3, std::int64_t{n} * (n - 1) / 2));

  std::int64_t factorial = 1;
  for (int k = 2; k <= n; ++k) factorial *= k;
  std::vector<std::int64_t> p(2, r + 1);
  dtrain::allreduce(p, {.op = ReduceOp::Product});
  CHECK(p == std::vector<std::int64_t>(2, factorial));

  std::vector<std::int32_t> lo{r, -r}, hi{r, -r};
  dtrain::allreduce(lo, {.op = ReduceOp::Min});
  dtrain::allreduce(hi, {.op = ReduceOp::Max});
  CHECK(lo == std::vector<std::int32_t>{0, -(n - 1)});
  CHECK(hi == std::vector<std::int32_t>{n - 1, 0});

  std::vector<double> avg(4, static_cast<double>(r));
  dtrain::allreduce(avg);  // Average is the default
  for (double x : avg) CHECK(x == doctest::Approx((n - 1) / 2.0));

  std::array<float, 7> arr{};
  arr.fill(static_cast<float>(r + 1));
  dtrain::allreduce(arr, {.op = ReduceOp::Sum, .postscale = 2.0});
  for (float x : arr) CHECK(x == static_cast<float>(n * (n + 1)));
}

TEST_CASE_TEMPLATE("allreduce: every op on every shape", T, DTRAIN_TEST_ALL_TYPES) {
  dtrain::init();
  std::vector<ReduceOp> ops{ReduceOp::Sum, ReduceOp::Min, ReduceOp::Max, ReduceOp::Product};
  if constexpr (is_float_v<T>) ops.push_back(ReduceOp::Average);
  for (ReduceOp op : ops) {
    for (std::int64_t n : {0, 1, 7, 33}) allreduce_case<T>(n, Form::vector, op);
    allreduce_case<T>(7, Form::span, op);
    allreduce_case<T>(15, Form::view_2d, op);  // shape [5, 3]
    allreduce_case<T>(0, Form::view_2d, op);   // shape [0, 3]
  }
}

TEST_CASE_TEMPLATE("allreduce: prescale and postscale", T, DTRAIN_TEST_FLOAT_TYPES) {
  dtrain::init();
  allreduce_case<T>(33, Form::vector, ReduceOp::Sum, 0.5, 4.0);
  allreduce_case<T>(33, Form::vector, ReduceOp::Average, 2.0, 0.25);
  allreduce_case<T>(15, Form::view_2d, ReduceOp::Average, 3.0, 0.5);
  allreduce_case<T>(7, Form::vector, ReduceOp::Max, 2.0, 1.0);
  allreduce_case<T>(7, Form::vector, ReduceOp::Min, 1.0, 0.5);
  allreduce_case<T>(7, Form::vector, ReduceOp::Product, 1.0, 0.5);
}

namespace {

// Deterministic pseudo-random bits for (rank, index).
inline std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

template <class T>
T random_value(int r, std::int64_t i) {
  const std::uint64_t h = mix((static_cast<std::uint64_t>(r) << 40) ^ static_cast<std::uint64_t>(i));
  if constexpr (is_float_v<T>) {
    return from_double<T>(static_cast<double>(h >> 11) * 0x1.0p-53 * 2.0 - 1.0);  // [-1, 1)
  } else if constexpr (std::is_same_v<T, std::uint8_t>) {
    return static_cast<T>(h % 41);  // sums over 4 ranks stay below 256
  } else {
    return static_cast<T>(static_cast<int>(h % 41) - 20);
  }
}

template <class T>
MPI_Datatype reference_type() {
  if constexpr (std::is_same_v<T, std::uint8_t>) return MPI_UINT8_T;
  else if constexpr (std::is_same_v<T, std::int8_t>) return MPI_INT8_T;
  else if constexpr (std::is_same_v<T, std::int32_t>) return MPI_INT32_T;
  else if constexpr (std::is_same_v<T, std::int64_t>) return MPI_INT64_T;
  else return MPI_DOUBLE;  // floating point: the reference is computed in double
}

// Compares dtrain's allreduce with MPI_Allreduce on MPI_COMM_WORLD over the same inputs. Integers
// must agree exactly; floating-point sums within the rounding of one addition per rank in T,
// relative to the sum of magnitudes (the order of additions is the library's choice).
template <class T>
void compare_with_mpi(std::int64_t n, ReduceOp op) {
  const int rank = world_rank(), size = world_size();
  std::vector<T> data(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) data[i] = random_value<T>(rank, i);

  using Ref = std::conditional_t<is_float_v<T>, double, T>;
  std::vector<Ref> ref(data.size()), magnitude(data.size());
  for (std::size_t i = 0; i < data.size(); ++i) {
    if constexpr (is_float_v<T>) ref[i] = to_double(data[i]);
    else ref[i] = data[i];
    magnitude[i] = static_cast<Ref>(std::abs(to_double(data[i])));
  }
  const MPI_Op mop = op == ReduceOp::Min ? MPI_MIN : op == ReduceOp::Max ? MPI_MAX : MPI_SUM;
  MPI_Allreduce(MPI_IN_PLACE, ref.data(), static_cast<int>(n), reference_type<T>(), mop,
                MPI_COMM_WORLD);
  if constexpr (is_float_v<T>)
    MPI_Allreduce(MPI_IN_PLACE, magnitude.data(), static_cast<int>(n), MPI_DOUBLE, MPI_SUM,
                  MPI_COMM_WORLD);

  dtrain::allreduce(data, {.op = op});

  std::int64_t bad = 0, first = -1;
  for (std::int64_t i = 0; i < n; ++i) {
    const double got = to_double(data[i]), want = static_cast<double>(ref[i]);
    double bound = 0;
    if constexpr (is_float_v<T>)
      if (op == ReduceOp::Sum) bound = tolerance<T>(size) * (static_cast<double>(magnitude[i]) + 1e-30);
    if (!(std::abs(got - want) <= bound)) {
      if (first < 0) first = i;
      ++bad;
    }
  }
  CHECK_MESSAGE(bad == 0, fmt::format("rank {}: {} {} of {} elements differs from MPI_Allreduce "
                                      "in {} places; first at [{}]: got {}, MPI reference {}",
                                      rank, dtrain::to_string(dtrain::dtype_of<T>),
                                      dtrain::to_string(op), n, bad, first,
                                      first < 0 ? 0.0 : to_double(data[first]),
                                      first < 0 ? 0.0 : static_cast<double>(ref[first])));
  CHECK(same_on_all_ranks(data.data(), data.size() * sizeof(T)));
}

}  // namespace

TEST_CASE_TEMPLATE("allreduce agrees with plain MPI_Allreduce", T, DTRAIN_TEST_ALL_TYPES) {
  dtrain::init();
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Min, ReduceOp::Max}) {
    compare_with_mpi<T>(1, op);
    compare_with_mpi<T>(1001, op);
  }
}

TEST_CASE("allreduce of an odd, large count (1000003 floats)") {
  dtrain::init();
  compare_with_mpi<float>(1000003, ReduceOp::Sum);
  allreduce_case<float>(1000003, Form::vector, ReduceOp::Average, 1.0, 1.0);
}

TEST_CASE("allreduce: 16-bit floats with inexact inputs stay within tolerance") {
  dtrain::init();
  const int rank = world_rank(), size = world_size();
  // 0.1 * (rank + 1) is not representable: every rank rounds its input, and every addition rounds.
  std::vector<dtrain::float16_t> h(9, dtrain::float16_t(0.1 * (rank + 1)));
  std::vector<dtrain::bfloat16_t> b(9, dtrain::bfloat16_t(0.1 * (rank + 1)));
  dtrain::allreduce(h, {.op = ReduceOp::Sum});
  dtrain::allreduce(b, {.op = ReduceOp::Average});
  const double sum = 0.1 * size * (size + 1) / 2;
  check_elements(h.data(), 9, [&](std::int64_t) { return sum; }, tolerance<dtrain::float16_t>(size + 1),
                 "float16 Sum of 0.1*(rank+1)");
  check_elements(b.data(), 9, [&](std::int64_t) { return sum / size; },
                 tolerance<dtrain::bfloat16_t>(size + 2), "bfloat16 Average of 0.1*(rank+1)");
}

TEST_CASE("allreduce_async: tensors of every dtype in flight together") {
  dtrain::init();
  const int rank = world_rank(), size = world_size();
  std::vector<std::int64_t> i64(5, rank);
  std::vector<std::int32_t> i32(3, 2 * rank);
  std::vector<std::int8_t> i8(4, static_cast<std::int8_t>(rank));
  std::vector<std::uint8_t> u8(6, static_cast<std::uint8_t>(rank + 1));
  std::vector<float> f32(100, static_cast<float>(rank));
  std::vector<double> f64(1, rank + 0.5);
  std::vector<dtrain::float16_t> f16(11, dtrain::float16_t(rank));
  std::vector<dtrain::bfloat16_t> bf16(13, dtrain::bfloat16_t(rank));
  std::vector<float> f32b(17, 1.0f);
  std::vector<dtrain::Handle> handles;
  const dtrain::AllreduceOptions sum{.op = ReduceOp::Sum};
  handles.push_back(dtrain::allreduce_async(i64, sum));
  handles.push_back(dtrain::allreduce_async(i32, sum));
  handles.push_back(dtrain::allreduce_async(i8, sum));
  handles.push_back(dtrain::allreduce_async(u8, {.op = ReduceOp::Max}));
  handles.push_back(dtrain::allreduce_async(f32, sum));
  handles.push_back(dtrain::allreduce_async(f64, sum));
  handles.push_back(dtrain::allreduce_async(f16, sum));
  handles.push_back(dtrain::allreduce_async(bf16, {.op = ReduceOp::Average}));
  handles.push_back(dtrain::allreduce_async(f32b, {.op = ReduceOp::Average, .postscale = 3.0}));
  for (auto& h : handles) CHECK_NOTHROW(h.wait());
  const std::int64_t s = std::int64_t{size} * (size - 1) / 2;
  CHECK(i64 == std::vector<std::int64_t>(5, s));
  CHECK(i32 == std::vector<std::int32_t>(3, static_cast<std::int32_t>(2 * s)));
  CHECK(i8 == std::vector<std::int8_t>(4, static_cast<std::int8_t>(s)));
  CHECK(u8 == std::vector<std::uint8_t>(6, static_cast<std::uint8_t>(size)));
  CHECK(f32 == std::vector<float>(100, static_cast<float>(s)));
  CHECK(f64 == std::vector<double>(1, static_cast<double>(s) + 0.5 * size));
  check_elements(f16.data(), 11, [&](std::int64_t) { return s; }, 0.0, "float16 Sum in flight");
  check_elements(bf16.data(), 13, [&](std::int64_t) { return (size - 1) / 2.0; },
                 tolerance<dtrain::bfloat16_t>(2), "bfloat16 Average in flight");
  check_elements(f32b.data(), 17, [&](std::int64_t) { return 3.0; }, tolerance<float>(2),
                 "float Average with postscale in flight");
}

TEST_CASE_TEMPLATE("grouped_allreduce reduces every member", T, DTRAIN_TEST_FLOAT_TYPES) {
  dtrain::init();
  const int rank = world_rank(), size = world_size();
  const std::vector<std::int64_t> sizes{3, 0, 1, 40, 7};
  std::vector<std::vector<T>> group;
  for (std::size_t m = 0; m < sizes.size(); ++m) {
    group.emplace_back(static_cast<std::size_t>(sizes[m]));
    for (std::int64_t i = 0; i < sizes[m]; ++i)
      group[m][i] = from_double<T>(value_for<T>(ReduceOp::Sum, rank, i + static_cast<std::int64_t>(m)));
  }
  dtrain::grouped_allreduce(group, {.op = ReduceOp::Sum, .prescale = 0.5});
  for (std::size_t m = 0; m < sizes.size(); ++m) {
    CHECK(static_cast<std::int64_t>(group[m].size()) == sizes[m]);
    check_elements(group[m].data(), sizes[m],
                   [&](std::int64_t i) {
                     return expected_for<T>(ReduceOp::Sum, 0.5, 1.0, size,
                                            i + static_cast<std::int64_t>(m));
                   },
                   0.0, fmt::format("grouped_allreduce member {}", m));
  }

  std::vector<std::vector<T>> empty_group;
  CHECK_NOTHROW(dtrain::grouped_allreduce(empty_group));
}
