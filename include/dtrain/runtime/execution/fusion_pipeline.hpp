#pragma once
// Note [Fusion pipeline]
// A fused allreduce copies every tensor into the fusion buffer, reduces it, and copies the
// results back. Done in sequence the copies cost a large share of the reduction time, so the
// buffer is cut into pieces (DTRAIN_MPI_CHUNK_BYTES) and a helper thread packs piece k+1 and
// unpacks piece k-1 while the engine thread reduces piece k. Prescale is applied while packing
// and postscale while unpacking, so scaling costs no extra pass. The helper blocks on futex-backed
// atomics between jobs; it never spins while idle.
//
// The overlap only pays where the helper has a core of its own. MPI's reduction keeps the engine
// thread's core busy (copying, reducing, polling for the peer), so where the ranks on a host
// already fill its cores the helper just takes CPU from the reductions: on a 2-core machine the
// fused gradient sync was slower with the overlap than without it, at 2 ranks and at 4 (figures
// in docs/performance.md, "Gradient sync"). overlap_pays() asks for two cores per rank on the
// host; elsewhere the backend packs, reduces and unpacks inline even when DTRAIN_FUSION_PIPELINE
// is on.
//
// Note [Direct segments]
// Packing costs two passes over every byte (copy in, copy out). Where each rank has a core, an
// extra MPI call costs tens of microseconds while copying a 1 MiB tensor twice costs more, and most
// of a model's bytes sit in its few large tensors (ResNet-50: 29 of 161 tensors hold 94% of the
// bytes at >= 1 MiB). So there a fused response reduces each tensor of at least
// kFusionDirectMinBytes in place, in its own memory (in pieces of at most DTRAIN_MPI_CHUNK_BYTES),
// and packs only the small ones. Where ranks outnumber the host's cores every MPI call waits for
// the peers to be scheduled (docs/performance.md, "Gradient sync"), so there everything is packed
// into as few calls as possible (direct_pays()). Which tensors are direct shapes the MPI calls, so
// it is decided once for all ranks: each rank tells at init() whether it has a core of its own, and
// tensors are reduced in place only if every rank does (Note [Agreed settings]). The pieces are
// then planned from the response alone (element counts, dtype, chunk size, that agreed verdict),
// so every rank makes the same MPI calls in the same order; a
// rank that joined has no memory for a direct tensor and contributes the op's identity (zeros for a
// sum) from the fusion buffer.
// Direct pieces come first, so the helper packs the small tensors while the large ones reduce.
//
// Note [Gradients in fusion memory]
// Where a rank's packed tensors already sit back to back in one memory, in the order and with the
// gaps (none) of the packed layout, that memory is used as the fusion buffer: the pieces are
// reduced where the tensors live, and "packing" and "unpacking" only scale (in place) or do
// nothing. GradientBuffer (train/gradient_buffer.hpp) lays gradients out so. Whether a rank takes
// this road is its own affair: the pieces, and so the MPI calls, are planned from the response
// alone, and only the memory a piece is reduced in differs.
// Scaling a direct tensor (Average, postscale) happens inside its reduction, on this rank's shard
// only (Note [Scaled allreduce] in comm/host_collectives.hpp); packed tensors are scaled by the
// copies that happen anyway.
#if defined(__linux__)
#include <sched.h>
#endif

#include <algorithm>
#include <atomic>
#include <cstring>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "dtrain/comm/copy_direction.hpp"
#include "dtrain/comm/local_reduce.hpp"
#include "dtrain/runtime/fusion_layout.hpp"

namespace dtrain::detail {

// Set before dtrain::init() to overlap wherever DTRAIN_FUSION_PIPELINE is on, whatever the core
// count: tests use it to exercise the helper thread on small machines, benchmarks to measure it.
inline bool& force_fusion_overlap() noexcept {
  static bool force = false;
  return force;
}

// Cores this process may run on (its affinity mask), 0 if unknown.
inline unsigned usable_cores() noexcept {
  unsigned cores = std::thread::hardware_concurrency();
#if defined(__linux__)
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof(allowed), &allowed) == 0)
    cores = static_cast<unsigned>(CPU_COUNT(&allowed));
#endif
  return cores;
}

// Whether overlapping packing with reduction can help when `ranks_on_host` ranks share the cores
// this process may run on (Note [Fusion pipeline]).
inline bool overlap_pays(int ranks_on_host) noexcept {
  if (force_fusion_overlap()) return true;
  const unsigned cores = usable_cores();
  if (cores == 0) return true;  // unknown: trust the configuration
  return cores >= 2u * static_cast<unsigned>(std::max(ranks_on_host, 1));
}

// Whether reducing large tensors in place beats packing them (Note [Direct segments]): every rank
// on the host has a core of its own.
inline bool direct_pays(int ranks_on_host) noexcept {
  const unsigned cores = usable_cores();
  return cores == 0 || cores >= static_cast<unsigned>(std::max(ranks_on_host, 1));
}

// One tensor of a fused response. `src`/`dst` are null for a rank that joined: it contributes
// the op's identity and keeps nothing.
struct FusedSegment {
  const void* src = nullptr;
  void* dst = nullptr;
  std::int64_t numel = 0;
  std::int64_t offset = 0;  // elements from the buffer start (set by FusedJob::lay_out)
  bool direct = false;      // reduced in its own memory (set by FusedJob::lay_out)
};

// One MPI call's worth of a fused job: a range of the fusion buffer, or of one direct tensor.
struct FusedPiece {
  std::int64_t segment = -1;  // the direct segment; -1 for a range of the packed buffer
  std::int64_t lo = 0;        // first element: in the segment (direct) or the buffer (packed)
  std::int64_t n = 0;         // elements
};

struct FusedJob {
  std::vector<FusedSegment> segments;
  std::vector<FusedPiece> plan;  // in execution order (set by lay_out)
  void* buffer = nullptr;        // at least `total` elements
  DataType dtype = DataType::float32;
  std::int64_t total = 0;        // elements of fusion buffer this rank needs (set by lay_out)
  std::int64_t piece = 0;        // elements per MPI call, at most
  double prescale = 1.0, postscale = 1.0;  // packed segments: applied by the copies
  // Direct segments are scaled by their reduction (Note [Scaled allreduce]): `direct_prescale`
  // in place before it, `direct_factor` on the reduced shard. Unpacking leaves them alone.
  double direct_prescale = 1.0, direct_factor = 1.0;
  ReduceOp op = ReduceOp::Sum;   // the reduction: a joined rank contributes its identity

  // Marks the segments of at least `direct_min` elements direct (none when it is <= 0), places
  // the others (and, on a rank that joined, the stand-ins for the direct ones) in the buffer, and
  // plans the pieces: direct ones first, then the packed buffer. Set `segments` and `piece` first.
  void lay_out(std::int64_t direct_min) {
    plan.clear();
    packed_.clear();
    std::int64_t offset = 0;
    for (std::size_t i = 0; i < segments.size(); ++i) {
      FusedSegment& s = segments[i];
      s.direct = direct_min > 0 && s.numel >= direct_min;
      if (s.direct) continue;
      s.offset = offset;
      offset += s.numel;
      packed_.push_back(i);
    }
    const std::int64_t packed_total = offset;
    for (std::size_t i = 0; i < segments.size(); ++i) {
      FusedSegment& s = segments[i];
      if (!s.direct) continue;
      if (!s.dst) {
        s.offset = offset;
        offset += s.numel;
      }
      for (std::int64_t lo = 0; lo < s.numel; lo += piece)
        plan.push_back({static_cast<std::int64_t>(i), lo, std::min(piece, s.numel - lo)});
    }
    for (std::int64_t lo = 0; lo < packed_total; lo += piece)
      plan.push_back({-1, lo, std::min(piece, packed_total - lo)});
    total = offset;
  }

  // This rank's packed segments, when they already lie back to back in the buffer's layout, in
  // memory of their own: the start of that memory, which can serve as the fusion buffer so that
  // packing and unpacking copy nothing (Note [Gradients in fusion memory]). Null otherwise, and
  // on a rank that joined (its stand-ins need the buffer). Call after lay_out().
  void* packed_in_place() const noexcept {
    if (packed_.empty()) return nullptr;
    const std::int64_t es = static_cast<std::int64_t>(element_size(dtype));
    for (const FusedSegment& s : segments)
      if (!s.dst || s.src != s.dst) return nullptr;
    char* base = static_cast<char*>(segments[packed_.front()].dst);  // offset 0
    for (std::size_t i : packed_)
      if (segments[i].dst != base + segments[i].offset * es) return nullptr;
    return base;
  }

  std::int64_t pieces() const noexcept { return static_cast<std::int64_t>(plan.size()); }
  std::int64_t piece_numel(std::int64_t k) const noexcept { return plan[k].n; }
  // The factor the reduction of piece k multiplies its result by: packed pieces are scaled while
  // unpacking. The same on every rank, joined or not, so every rank makes the same MPI calls.
  double reduce_factor(std::int64_t k) const noexcept {
    return plan[k].segment >= 0 ? direct_factor : 1.0;
  }

  // The memory piece k is reduced in.
  void* piece_data(std::int64_t k) const noexcept {
    const FusedPiece& p = plan[k];
    const std::int64_t es = static_cast<std::int64_t>(element_size(dtype));
    if (p.segment < 0) return static_cast<char*>(buffer) + p.lo * es;
    const FusedSegment& s = segments[p.segment];
    if (s.dst) return static_cast<char*>(s.dst) + p.lo * es;
    return static_cast<char*>(buffer) + (s.offset + p.lo) * es;
  }

  // Before piece k is reduced (pack) or after (unpack): copies and scales packed segments, scales
  // direct ones in place, fills a joined rank's contribution with the op's identity.
  void copy_piece(std::int64_t k, CopyDirection direction) const {
    const bool pack = direction == CopyDirection::pack;
    const FusedPiece& p = plan[k];
    const std::int64_t es = static_cast<std::int64_t>(element_size(dtype));
    if (p.segment >= 0) {
      const FusedSegment& s = segments[p.segment];
      if (!s.dst) {
        if (pack) fill_identity(dtype, op, piece_data(k), p.n);
      } else if (pack) {
        scale_copy(dtype, static_cast<const char*>(s.src) + p.lo * es, piece_data(k), p.n,
                   direct_prescale);
      }
      return;
    }
    const std::int64_t lo = p.lo, hi = p.lo + p.n;
    auto first = std::upper_bound(packed_.begin(), packed_.end(), lo,
                                  [&](std::int64_t v, std::size_t i) { return v < segments[i].offset; });
    if (first != packed_.begin()) --first;
    for (auto it = first; it != packed_.end() && segments[*it].offset < hi; ++it) {
      const FusedSegment& s = segments[*it];
      const std::int64_t a = std::max(lo, s.offset), b = std::min(hi, s.offset + s.numel);
      if (a >= b) continue;
      char* buf = static_cast<char*>(buffer) + a * es;
      const std::int64_t within = a - s.offset;
      if (pack) {
        if (s.src)
          scale_copy(dtype, static_cast<const char*>(s.src) + within * es, buf, b - a, prescale);
        else
          fill_identity(dtype, op, buf, b - a);
      } else if (s.dst) {
        scale_copy(dtype, buf, static_cast<char*>(s.dst) + within * es, b - a, postscale);
      }
    }
  }

 private:
  std::vector<std::size_t> packed_;  // indices of the packed segments, by offset
};

class FusionPipeline {
 public:
  FusionPipeline() = default;
  FusionPipeline(const FusionPipeline&) = delete;
  FusionPipeline& operator=(const FusionPipeline&) = delete;
  ~FusionPipeline() {
    if (!worker_.joinable()) return;
    stop_ = true;
    job_seq_.fetch_add(1);
    job_seq_.notify_one();
    worker_.join();
  }

  // Runs `reduce(k)` for every piece on the calling thread, with packing and unpacking overlapped
  // on the helper thread (or inline when `overlap` is false or there is a single piece).
  void run(const FusedJob& job, const std::function<void(std::int64_t)>& reduce, bool overlap) {
    const std::int64_t n = job.pieces();
    if (!overlap || n <= 1) {
      for (std::int64_t k = 0; k < n; ++k) job.copy_piece(k, CopyDirection::pack);
      for (std::int64_t k = 0; k < n; ++k) reduce(k);
      for (std::int64_t k = 0; k < n; ++k) job.copy_piece(k, CopyDirection::unpack);
      return;
    }
    if (!worker_.joinable()) worker_ = std::thread([this] { worker_loop(); });
    job_ = &job;
    packed_.store(0);
    reduced_.store(0);
    finished_.store(false);
    job_seq_.fetch_add(1, std::memory_order_release);
    job_seq_.notify_one();
    for (std::int64_t k = 0; k < n; ++k) {
      wait_until_above(packed_, k);
      reduce(k);
      reduced_.store(k + 1, std::memory_order_release);
      reduced_.notify_one();
    }
    finished_.wait(false, std::memory_order_acquire);
    job_ = nullptr;
  }

 private:
  static void wait_until_above(std::atomic<std::int64_t>& a, std::int64_t k) {
    for (std::int64_t v = a.load(std::memory_order_acquire); v <= k;
         v = a.load(std::memory_order_acquire))
      a.wait(v, std::memory_order_acquire);
  }

  void worker_loop() {
    std::uint64_t seen = 0;
    while (true) {
      job_seq_.wait(seen, std::memory_order_acquire);
      seen = job_seq_.load(std::memory_order_acquire);
      if (stop_) return;
      const FusedJob& job = *job_;
      const std::int64_t n = job.pieces();
      std::int64_t next_pack = 0, next_unpack = 0;
      while (next_unpack < n) {
        const std::int64_t reduced = reduced_.load(std::memory_order_acquire);
        // Keep the reducer fed one piece ahead; otherwise drain finished pieces.
        if (next_pack < n && next_pack <= reduced + 1) {
          job.copy_piece(next_pack, CopyDirection::pack);
          packed_.store(++next_pack, std::memory_order_release);
          packed_.notify_one();
        } else if (next_unpack < reduced) {
          job.copy_piece(next_unpack++, CopyDirection::unpack);
        } else if (next_pack < n) {
          job.copy_piece(next_pack, CopyDirection::pack);
          packed_.store(++next_pack, std::memory_order_release);
          packed_.notify_one();
        } else {
          reduced_.wait(reduced, std::memory_order_acquire);
        }
      }
      finished_.store(true, std::memory_order_release);
      finished_.notify_one();
    }
  }

  std::thread worker_;
  const FusedJob* job_ = nullptr;
  std::atomic<std::uint64_t> job_seq_{0};
  std::atomic<std::int64_t> packed_{0};
  std::atomic<std::int64_t> reduced_{0};
  std::atomic<bool> finished_{false};
  std::atomic<bool> stop_{false};
};

}  // namespace dtrain::detail
