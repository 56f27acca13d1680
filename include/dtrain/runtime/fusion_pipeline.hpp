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
// fused ResNet-50 gradient sync was 0-16% slower with the overlap at 2 ranks and 2-23% slower at
// 4 ranks (docs/performance.md). overlap_pays() asks for two cores per rank on the host; elsewhere
// the backend packs, reduces and unpacks inline even when DTRAIN_FUSION_PIPELINE is on.
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

#include "dtrain/comm/local_reduce.hpp"

namespace dtrain::detail {

// Set before dtrain::init() to overlap wherever DTRAIN_FUSION_PIPELINE is on, whatever the core
// count: tests use it to exercise the helper thread on small machines, benchmarks to measure it.
inline bool& force_fusion_overlap() noexcept {
  static bool force = false;
  return force;
}

// Whether overlapping packing with reduction can help when `ranks_on_host` ranks share the cores
// this process may run on (Note [Fusion pipeline]).
inline bool overlap_pays(int ranks_on_host) noexcept {
  if (force_fusion_overlap()) return true;
  unsigned cores = std::thread::hardware_concurrency();
#if defined(__linux__)
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof(allowed), &allowed) == 0)
    cores = static_cast<unsigned>(CPU_COUNT(&allowed));
#endif
  if (cores == 0) return true;  // unknown: trust the configuration
  return cores >= 2u * static_cast<unsigned>(std::max(ranks_on_host, 1));
}

// One tensor's place in the fusion buffer. `src`/`dst` are null for a rank that joined: it
// contributes zeros and keeps nothing.
struct FusedSegment {
  const void* src = nullptr;
  void* dst = nullptr;
  std::int64_t offset = 0;  // elements from the buffer start
  std::int64_t numel = 0;
};

struct FusedJob {
  std::vector<FusedSegment> segments;
  void* buffer = nullptr;
  DataType dtype = DataType::float32;
  std::int64_t total = 0;         // elements
  std::int64_t piece = 0;         // elements per piece
  double prescale = 1.0, postscale = 1.0;

  std::int64_t pieces() const noexcept { return piece > 0 ? (total + piece - 1) / piece : 0; }

  // Copies (pack) or copies back (unpack) the part of every segment that lies in piece k.
  void copy_piece(std::int64_t k, bool pack) const {
    const std::int64_t lo = k * piece, hi = std::min(total, lo + piece);
    const std::size_t es = element_size(dtype);
    auto first = std::upper_bound(segments.begin(), segments.end(), lo,
                                  [](std::int64_t v, const FusedSegment& s) { return v < s.offset; });
    if (first != segments.begin()) --first;
    for (auto s = first; s != segments.end() && s->offset < hi; ++s) {
      const std::int64_t a = std::max(lo, s->offset), b = std::min(hi, s->offset + s->numel);
      if (a >= b) continue;
      char* buf = static_cast<char*>(buffer) + a * es;
      const std::int64_t within = a - s->offset;
      if (pack) {
        if (s->src)
          scale_copy(dtype, static_cast<const char*>(s->src) + within * es, buf, b - a, prescale);
        else
          std::memset(buf, 0, static_cast<std::size_t>(b - a) * es);
      } else if (s->dst) {
        scale_copy(dtype, buf, static_cast<char*>(s->dst) + within * es, b - a, postscale);
      }
    }
  }
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
      for (std::int64_t k = 0; k < n; ++k) job.copy_piece(k, true);
      for (std::int64_t k = 0; k < n; ++k) reduce(k);
      for (std::int64_t k = 0; k < n; ++k) job.copy_piece(k, false);
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
          job.copy_piece(next_pack, true);
          packed_.store(++next_pack, std::memory_order_release);
          packed_.notify_one();
        } else if (next_unpack < reduced) {
          job.copy_piece(next_unpack++, false);
        } else if (next_pack < n) {
          job.copy_piece(next_pack, true);
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
