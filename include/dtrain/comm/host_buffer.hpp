#pragma once
// A persistent, pre-touched host buffer. Fresh memory costs a page fault per 4 KiB page the first
// time it is written, and glibc maps large allocations afresh on every malloc; so the engine
// allocates its fusion and scratch buffers once, touches every page, and only grows them.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>

namespace dtrain::detail {

class HostBuffer {
 public:
  HostBuffer() = default;
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  ~HostBuffer() { std::free(data_); }

  // Returns a buffer of at least `bytes`; contents are unspecified.
  void* reserve(std::size_t bytes) {
    if (bytes <= capacity_) return data_;
    std::size_t cap = std::max<std::size_t>(bytes, capacity_ + capacity_ / 2);
    cap = (cap + 4095) / 4096 * 4096;
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
