#pragma once
// The buffers Adasum ops exchange their vectors in (Note [Adasum tree] in
// runtime/detail/adasum_tree.hpp), kept from one op to the next. A fresh allocation of a large
// vector costs a page fault per page on first touch, about as long as exchanging it, and the same
// gradients come back every step.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

namespace dtrain::detail {

// Uninitialized bytes: every byte is written (packed or received) before it is read.
struct AdasumBuffer {
  std::unique_ptr<std::byte[]> data;
  std::int64_t capacity = 0;
};

class AdasumBufferPool {
 public:
  // A buffer of at least `bytes`: the smallest kept one that fits, else a new one.
  AdasumBuffer take(std::int64_t bytes) {
    std::lock_guard lock(mutex_);
    std::size_t best = kept_.size();
    for (std::size_t i = 0; i < kept_.size(); ++i)
      if (kept_[i].capacity >= bytes &&
          (best == kept_.size() || kept_[i].capacity < kept_[best].capacity))
        best = i;
    AdasumBuffer out;
    if (best < kept_.size()) {
      out = std::move(kept_[best]);
      kept_[best] = std::move(kept_.back());
      kept_.pop_back();
      kept_bytes_ -= out.capacity;
    } else {
      // new[] rather than make_unique: no zero fill, and operator new's alignment suits float64.
      out.data.reset(new std::byte[static_cast<std::size_t>(bytes > 0 ? bytes : 1)]);
      out.capacity = bytes;
    }
    in_use_bytes_ += out.capacity;
    peak_bytes_ = std::max(peak_bytes_, in_use_bytes_);
    return out;
  }

  // Keeps `b` for a later op, unless that would hold more than the ops ever used at once.
  void give_back(AdasumBuffer b) {
    if (!b.data) return;
    std::lock_guard lock(mutex_);
    in_use_bytes_ -= b.capacity;
    if (kept_bytes_ + b.capacity > peak_bytes_) return;
    kept_bytes_ += b.capacity;
    kept_.push_back(std::move(b));
  }

 private:
  std::mutex mutex_;
  std::vector<AdasumBuffer> kept_;
  std::int64_t kept_bytes_ = 0, in_use_bytes_ = 0, peak_bytes_ = 0;
};

// The process's pool; ops hold it, so one that ends during static destruction still finds it.
inline std::shared_ptr<AdasumBufferPool> adasum_buffers() {
  static const auto pool = std::make_shared<AdasumBufferPool>();
  return pool;
}

}  // namespace dtrain::detail
