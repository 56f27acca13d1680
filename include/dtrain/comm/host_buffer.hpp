#pragma once
// A persistent, pre-touched host buffer. Fresh memory costs a page fault per 4 KiB page the first
// time it is written, and glibc maps large allocations afresh on every malloc; so the engine
// allocates its fusion and scratch buffers once, touches every page, and only grows them.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>

namespace dtrain::detail {

// The capacity a buffer that only grows takes on to hold `bytes`: at least half again its
// current `capacity`, so slowly rising requests reallocate a logarithmic number of times, rounded
// up to a multiple of `granule` (the page, or the device allocator's 2 MiB). A size that cannot
// be rounded in std::size_t could never be allocated: std::bad_alloc, as from the allocator.
inline std::size_t grown_capacity(std::size_t bytes, std::size_t capacity, std::size_t granule) {
  constexpr std::size_t max = std::numeric_limits<std::size_t>::max();
  const std::size_t half_again = capacity > max / 3 * 2 ? max : capacity + capacity / 2;
  const std::size_t cap = std::max(bytes, half_again);
  if (cap > max - (granule - 1)) throw std::bad_alloc();
  return (cap + granule - 1) / granule * granule;
}

class HostBuffer {
 public:
  HostBuffer() = default;
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  ~HostBuffer() { std::free(data_); }

  // Returns a buffer of at least `bytes`; contents are unspecified.
  void* reserve(std::size_t bytes) {
    if (bytes <= capacity_) return data_;
    const std::size_t cap = grown_capacity(bytes, capacity_, 4096);
    void* p = std::aligned_alloc(4096, cap);
    if (!p) throw std::bad_alloc();
    std::memset(p, 0, cap);  // pre-touch: fault the pages in now, not inside a collective
    std::free(data_);
    data_ = p;
    capacity_ = cap;
    ++allocations_;
    return data_;
  }
  void* data() noexcept { return data_; }
  std::size_t capacity() const noexcept { return capacity_; }
  std::uint64_t allocations() const noexcept { return allocations_; }

 private:
  void* data_ = nullptr;
  std::size_t capacity_ = 0;
  std::uint64_t allocations_ = 0;
};

}  // namespace dtrain::detail
