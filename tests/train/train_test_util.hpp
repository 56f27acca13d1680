#pragma once
// Helpers for the training-API tests: the world read straight from MPI (independent of dtrain), a
// cross-rank bitwise agreement check in plain MPI, and closeness checks that report the worst
// element instead of one line per element.
//
// Every rank runs the same cases and submits the same collectives; checks use CHECK, never
// REQUIRE, so a failure on one rank does not make it skip collectives the others wait in.
#include <doctest/doctest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include "support/world.hpp"

namespace train_test {

using dtrain_test_support::world_rank;
using dtrain_test_support::world_size;

// True on every rank iff the `bytes` bytes at `p` are identical on every rank.
inline bool same_on_all_ranks(const void* p, std::size_t bytes) {
  unsigned long long n = bytes;
  MPI_Bcast(&n, 1, MPI_UNSIGNED_LONG_LONG, 0, MPI_COMM_WORLD);
  int ok = n == bytes ? 1 : 0;
  if (ok) {
    std::vector<char> root(static_cast<const char*>(p), static_cast<const char*>(p) + bytes);
    MPI_Bcast(root.data(), static_cast<int>(bytes), MPI_BYTE, 0, MPI_COMM_WORLD);
    ok = bytes == 0 || std::memcmp(root.data(), p, bytes) == 0 ? 1 : 0;
  }
  int all = 0;
  MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
  return all != 0;
}

// The largest |got - want| / max(1, |want|) over the elements (infinity on a size mismatch).
template <class A, class B>
double max_rel_error(const A& got, const B& want) {
  if (got.size() != want.size()) return INFINITY;
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double g = static_cast<double>(got[i]), w = static_cast<double>(want[i]);
    const double e = std::abs(g - w) / std::max(1.0, std::abs(w));
    worst = std::isnan(e) ? INFINITY : std::max(worst, e);
  }
  return worst;
}

template <class A, class B>
double max_rel_error(const std::vector<A>& got, const std::vector<B>& want)
  requires requires(const A& a) { a.size(); }
{
  if (got.size() != want.size()) return INFINITY;
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i) worst = std::max(worst, max_rel_error(got[i], want[i]));
  return worst;
}

// CHECKs that `got` is within `tolerance` (relative, floored at 1 in magnitude) of `want`.
template <class A, class B>
void check_close(const A& got, const B& want, double tolerance, std::string_view what) {
  const double e = max_rel_error(got, want);
  CHECK_MESSAGE(e <= tolerance, fmt::format("rank {}: {}: max relative error {:.3e} exceeds {:.1e}",
                                            world_rank(), what, e, tolerance));
}

}  // namespace train_test
