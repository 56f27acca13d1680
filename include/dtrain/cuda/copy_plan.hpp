#pragma once
// Host-side planning for the batched copy kernels (see Note [Batched copies]). Plain C++ with no
// CUDA headers, so the arithmetic is tested on machines without a GPU.
//
// Note [Batched copies]
// Packing a fusion buffer means copying many tensors of very different sizes (ResNet-50: 161
// tensors from 256 B to 9 MB). One launch per tensor costs a few microseconds each and leaves the
// GPU idle between small copies, so one launch copies up to kCopyBatchCapacity tensors. The
// descriptors travel in the kernel's parameter block (no host-to-device copy, nothing to keep
// alive after the launch). Every tensor is cut into blocks of `elems_per_block` elements; a
// descriptor records the index of its first block, and each CUDA block finds its descriptor by
// binary search over those indices, so big and small tensors get work in proportion to their
// size. A null source writes zeros (a rank that joined contributes nothing to an allreduce).
#include <cstdint>
#include <span>
#include <vector>

#include <fmt/format.h>

#include "dtrain/comm/copy_direction.hpp"
#include "dtrain/core/error.hpp"

namespace dtrain::detail {

// Layouts shared with the kernel source (cuda/kernel_source.hpp); both sides static_assert sizes.
struct DeviceCopyDesc {
  const void* src = nullptr;  // null: write zeros
  void* dst = nullptr;
  std::int64_t count = 0;        // elements
  std::int64_t first_block = 0;  // index of this descriptor's first block within its batch
};
static_assert(sizeof(DeviceCopyDesc) == 32);

// The parameter block stays under the 4 KiB every CUDA architecture accepts.
inline constexpr int kCopyBatchCapacity = 96;
struct DeviceCopyBatch {
  DeviceCopyDesc desc[kCopyBatchCapacity];
  std::int32_t size = 0;             // descriptors in use
  std::int32_t elems_per_block = 0;  // elements one CUDA block copies
  double scale = 1.0;                // multiplies every element (floating-point kernels only)
  std::int64_t blocks = 0;           // total blocks of the batch: the launch's grid size
};
static_assert(sizeof(DeviceCopyBatch) == 96 * 32 + 24);
static_assert(sizeof(DeviceCopyBatch) <= 4096);

// One tensor-sized copy: `count` elements from `src` (null: zeros) to `dst`.
struct CopySegment {
  const void* src = nullptr;
  void* dst = nullptr;
  std::int64_t count = 0;
};

// Groups segments into launches. Empty segments are dropped; order is preserved.
inline std::vector<DeviceCopyBatch> plan_copy_batches(std::span<const CopySegment> segments,
                                                      std::int32_t elems_per_block,
                                                      double scale = 1.0) {
  if (elems_per_block <= 0)
    throw InvalidArgumentError(
        fmt::format("dtrain: copy plan: elems_per_block is {}; expected a positive count",
                    elems_per_block));
  std::vector<DeviceCopyBatch> out;
  for (const CopySegment& s : segments) {
    if (s.count < 0)
      throw InvalidArgumentError(
          fmt::format("dtrain: copy plan: a segment has a negative count {}", s.count));
    if (s.count == 0) continue;
    if (out.empty() || out.back().size == kCopyBatchCapacity) {
      out.emplace_back();
      out.back().elems_per_block = elems_per_block;
      out.back().scale = scale;
    }
    DeviceCopyBatch& b = out.back();
    DeviceCopyDesc& d = b.desc[b.size++];
    d.src = s.src;
    d.dst = s.dst;
    d.count = s.count;
    d.first_block = b.blocks;
    b.blocks += (s.count + elems_per_block - 1) / elems_per_block;
  }
  return out;
}

// The descriptor that CUDA block `block` of `b` works on: the last one whose first block is at or
// before it. The kernel source runs the same search.
inline int find_copy_desc(const DeviceCopyBatch& b, std::int64_t block) noexcept {
  int lo = 0, hi = b.size - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (b.desc[mid].first_block <= block) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

// A fused buffer's layout: tensor i occupies [offsets[i], offsets[i] + counts[i]) elements.
struct FusedLayout {
  std::vector<std::int64_t> offsets;
  std::int64_t total = 0;  // elements, including trailing padding
};

// Packs tensors back to back; the total is rounded up to a multiple of `multiple` elements so a
// reduce-scatter can split the buffer evenly (the padding is reduced and then ignored).
inline FusedLayout plan_fused_layout(std::span<const std::int64_t> counts,
                                     std::int64_t multiple = 1) {
  FusedLayout l;
  l.offsets.reserve(counts.size());
  std::int64_t offset = 0;
  for (auto c : counts) {
    l.offsets.push_back(offset);
    offset += c;
  }
  if (multiple > 1) offset = (offset + multiple - 1) / multiple * multiple;
  l.total = offset;
  return l;
}

// Segments that copy tensors into (pack) or out of (unpack) a fused buffer of `element_bytes`
// elements. tensors[i] may be null: pack writes zeros there, unpack skips it.
inline std::vector<CopySegment> fused_segments(const FusedLayout& layout,
                                               std::span<const std::int64_t> counts,
                                               std::span<void* const> tensors, void* buffer,
                                               std::size_t element_bytes,
                                               CopyDirection direction) {
  std::vector<CopySegment> out;
  out.reserve(counts.size());
  char* base = static_cast<char*>(buffer);
  for (std::size_t i = 0; i < counts.size(); ++i) {
    char* slot = base + layout.offsets[i] * static_cast<std::int64_t>(element_bytes);
    if (direction == CopyDirection::pack) {
      out.push_back({tensors[i], slot, counts[i]});
    } else if (tensors[i]) {
      out.push_back({slot, tensors[i], counts[i]});
    }
  }
  return out;
}

// Blocks of 256 threads, each thread moving 16 bytes per step for 8 steps: 32 KiB per block,
// whatever the element size, so a block's work (and its alignment) does not depend on the dtype.
inline constexpr int kCopyThreads = 256;
inline constexpr std::int64_t kCopyBytesPerBlock = 32768;
inline std::int32_t copy_elems_per_block(std::size_t element_bytes) noexcept {
  return static_cast<std::int32_t>(kCopyBytesPerBlock / static_cast<std::int64_t>(element_bytes));
}

}  // namespace dtrain::detail
