#pragma once
// Persistent buffers that only grow, and the pre-touched host one. Fresh memory costs a page fault
// per 4 KiB page the first time it is written, and glibc maps large allocations afresh on every
// malloc (the device allocators are slower still); so the engine allocates its fusion, scratch and
// staging buffers once, touches every host page, and only grows them.
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

// A buffer that only grows, over the memory `Memory` hands out:
// Memory::allocate(bytes) (throws when it cannot), Memory::release(p) and Memory::granule. The
// host, pinned and device buffers differ in nothing else.
template <class Memory>
class GrowingBuffer {
 public:
  GrowingBuffer() = default;
  GrowingBuffer(const GrowingBuffer&) = delete;
  GrowingBuffer& operator=(const GrowingBuffer&) = delete;
  ~GrowingBuffer() { reset(); }

  // Returns a buffer of at least `bytes`; contents are unspecified after it grows. The caller makes
  // sure nothing still uses the old memory (the device backends complete every op before the next).
  void* reserve(std::size_t bytes) {
    if (bytes <= capacity_) return data_;
    const std::size_t cap = grown_capacity(bytes, capacity_, Memory::granule);
    void* p = Memory::allocate(cap);
    if (data_) Memory::release(data_);
    data_ = p;
    capacity_ = cap;
    ++allocations_;
    return data_;
  }
  // Frees the memory (a device buffer: with its device current).
  void reset() noexcept {
    if (data_) Memory::release(data_);
    data_ = nullptr;
    capacity_ = 0;
  }
  void* data() const noexcept { return data_; }
  std::size_t capacity() const noexcept { return capacity_; }
  std::uint64_t allocations() const noexcept { return allocations_; }

 private:
  void* data_ = nullptr;
  std::size_t capacity_ = 0;
  std::uint64_t allocations_ = 0;
};

// Page-aligned host memory, every page touched when it is allocated: the faults happen now, not
// inside a collective.
struct PrefaultedHostMemory {
  static constexpr std::size_t granule = 4096;
  static void* allocate(std::size_t bytes) {
    void* p = std::aligned_alloc(granule, bytes);
    if (!p) throw std::bad_alloc();
    std::memset(p, 0, bytes);
    return p;
  }
  static void release(void* p) noexcept { std::free(p); }
};

using HostBuffer = GrowingBuffer<PrefaultedHostMemory>;

}  // namespace dtrain::detail
