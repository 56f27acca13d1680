#pragma once
// Helpers shared by the multi-process tests: world rank/size read straight from MPI (independent
// of dtrain), conversions between element types and double, result checks that report the first
// wrong element instead of one line per element, and a plain-MPI cross-rank agreement check.
//
// Every rank runs the same test cases in the same order and submits the same collectives; checks
// use CHECK (never REQUIRE) so a failure on one rank does not make it skip collectives that the
// other ranks are waiting in.
#include <doctest/doctest.h>
#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <fmt/format.h>

#include "dtrain/comm/host_collectives.hpp"  // mpi_count_limit(), which CountLimit lowers
#include "dtrain/dtrain.hpp"
#include "dtrain/comm/host_collectives.hpp"
#include "support/world.hpp"

// Every element type dtrain supports, for TEST_CASE_TEMPLATE.
#define DTRAIN_TEST_ALL_TYPES                                                                   \
  std::uint8_t, std::int8_t, std::int32_t, std::int64_t, dtrain::float16_t, dtrain::bfloat16_t, \
      float, double
#define DTRAIN_TEST_FLOAT_TYPES dtrain::float16_t, dtrain::bfloat16_t, float, double

namespace dtrain_test {

using dtrain_test_support::world_rank;
using dtrain_test_support::world_size;

template <class T>
inline constexpr bool is_half_v =
    std::is_same_v<T, dtrain::float16_t> || std::is_same_v<T, dtrain::bfloat16_t>;
template <class T>
inline constexpr bool is_float_v = is_half_v<T> || std::is_floating_point_v<T>;

template <class T>
double to_double(T v) {
  if constexpr (is_half_v<T>) return static_cast<double>(static_cast<float>(v));
  else return static_cast<double>(v);
}
template <class T>
T from_double(double d) {
  if constexpr (is_half_v<T>) return T(d);
  else return static_cast<T>(d);
}

// Relative error allowed for one value that went through `roundings` roundings in T.
template <class T>
double tolerance(int roundings = 1) {
  if constexpr (std::is_same_v<T, dtrain::float16_t>) return roundings * std::ldexp(1.0, -10);
  else if constexpr (std::is_same_v<T, dtrain::bfloat16_t>) return roundings * std::ldexp(1.0, -7);
  else if constexpr (std::is_same_v<T, float>) return roundings * 1e-6;
  else if constexpr (std::is_same_v<T, double>) return roundings * 1e-14;
  else return 0.0;  // integers are exact
}

// Checks got[i] against expected(i) for every i, within `rel` (relative, with an absolute floor of
// `rel` for values near zero). One CHECK per call, naming the first wrong element.
template <class T, class F>
void check_elements(const T* got, std::int64_t n, F&& expected, double rel, std::string_view what) {
  std::int64_t bad = 0, first = -1;
  double first_got = 0, first_expected = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const double g = to_double(got[i]);
    const double e = static_cast<double>(expected(i));
    if (!(std::abs(g - e) <= rel * std::max(1.0, std::abs(e)))) {
      if (first < 0) {
        first = i;
        first_got = g;
        first_expected = e;
      }
      ++bad;
    }
  }
  CHECK_MESSAGE(bad == 0, fmt::format("rank {}: {}: {} of {} elements wrong; first at [{}]: got {}, "
                                      "expected {}",
                                      world_rank(), what, bad, n, first, first_got,
                                      first_expected));
}

// True on every rank iff `bytes` bytes at `p` are identical on every rank (checked with plain MPI
// on MPI_COMM_WORLD, independent of dtrain).
inline bool same_on_all_ranks(const void* p, std::size_t bytes) {
  std::vector<char> root(static_cast<const char*>(p), static_cast<const char*>(p) + bytes);
  unsigned long long n = bytes;
  MPI_Bcast(&n, 1, MPI_UNSIGNED_LONG_LONG, 0, MPI_COMM_WORLD);
  int ok = n == bytes ? 1 : 0;
  if (ok) {
    MPI_Bcast(root.data(), static_cast<int>(bytes), MPI_BYTE, 0, MPI_COMM_WORLD);
    ok = bytes == 0 || std::memcmp(root.data(), p, bytes) == 0 ? 1 : 0;
  }
  int all = 0;
  MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
  return all != 0;
}

// The rows of dim 0 that rank k owns after a reducescatter of `rows` rows over `n` ranks: an even
// split, the first rows % n ranks taking one extra row.
inline std::int64_t scatter_rows(std::int64_t rows, int n, int k) {
  return rows / n + (k < rows % n ? 1 : 0);
}
inline std::int64_t scatter_start(std::int64_t rows, int n, int k) {
  std::int64_t s = 0;
  for (int j = 0; j < k; ++j) s += scatter_rows(rows, n, j);
  return s;
}

// Lowers detail::mpi_count_limit() for one scope so the large-count code paths (chunking and the
// point-to-point / rooted fallbacks) run on small buffers. The engine thread reads the limit when it
// executes an op; submitting the op after the change and waiting for it before the restore orders
// both accesses through the engine's queue mutex and the op's completion.
class CountLimit {
 public:
  explicit CountLimit(std::int64_t limit) : saved_(dtrain::detail::mpi_count_limit()) {
    dtrain::detail::mpi_count_limit() = limit;
  }
  ~CountLimit() { dtrain::detail::mpi_count_limit() = saved_; }
  CountLimit(const CountLimit&) = delete;
  CountLimit& operator=(const CountLimit&) = delete;

 private:
  std::int64_t saved_;
};

}  // namespace dtrain_test
