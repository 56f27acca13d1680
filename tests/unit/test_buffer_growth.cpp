// detail::grown_capacity, the growth rule of the engine's host, device and pinned buffers, and
// HostBuffer, which follows it.
#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <new>

#include "dtrain/comm/host_buffer.hpp"

using dtrain::detail::grown_capacity;

TEST_CASE("grown_capacity rounds the request up to the granule") {
  CHECK(grown_capacity(1, 0, 4096) == 4096);
  CHECK(grown_capacity(4096, 0, 4096) == 4096);
  CHECK(grown_capacity(4097, 0, 4096) == 8192);
  CHECK(grown_capacity(1, 0, std::size_t{2} << 20) == std::size_t{2} << 20);
  CHECK(grown_capacity((std::size_t{2} << 20) + 1, 0, std::size_t{2} << 20) == std::size_t{4} << 20);
}

TEST_CASE("grown_capacity grows by at least half the current capacity") {
  // 8192 * 1.5 = 12288 = 3 pages, more than the 8193 bytes asked for.
  CHECK(grown_capacity(8193, 8192, 4096) == 12288);
  // 40000 * 1.5 = 60000, rounded up to 15 pages.
  CHECK(grown_capacity(40001, 40000, 4096) == 15 * 4096);
  // A request beyond half again is taken as it is (rounded).
  CHECK(grown_capacity(100000, 8192, 4096) == 25 * 4096);
}

TEST_CASE("grown_capacity refuses a size that cannot be rounded, as an allocator would") {
  constexpr std::size_t max = std::numeric_limits<std::size_t>::max();
  CHECK_THROWS_AS(grown_capacity(max - 10, 0, 4096), std::bad_alloc);
  CHECK_THROWS_AS(grown_capacity(1, max / 4 * 3, 4096), std::bad_alloc);
  CHECK(grown_capacity(max - 4095, 0, 4096) == max - 4095);
}

TEST_CASE("HostBuffer grows by the rule, keeps its memory, and counts its allocations") {
  dtrain::detail::HostBuffer b;
  CHECK(b.capacity() == 0);
  void* p = b.reserve(100);
  CHECK(b.capacity() == 4096);
  CHECK(reinterpret_cast<std::uintptr_t>(p) % 4096 == 0);
  CHECK(b.reserve(4096) == p);
  CHECK(b.allocations() == 1);
  b.reserve(5000);
  CHECK(b.capacity() == 8192);
  b.reserve(8193);
  CHECK(b.capacity() == 12288);
  CHECK(b.allocations() == 3);
}
