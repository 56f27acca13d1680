#pragma once
// Collectives on host memory over one MPI communicator, safe for any element count. Every one is
// posted in its nonblocking form and waited for as the RequestWait says (Note [Waiting for data
// collectives] in comm/request_wait.hpp): no data collective blocks inside MPI.
//
// Note [MPI counts]
// MPI counts are `int`. Allreduce and broadcast are cut into pieces of at most `chunk_elems`
// elements; that bound also keeps each call's message below the size at which the MPI library's
// per-call scratch buffer would be freshly mapped (see docs/performance.md). Ops with per-rank
// counts (allgatherv, alltoallv, reduce_scatter) use one call when every count and displacement
// fits in an int, and otherwise fall back to chunked point-to-point or rooted calls.
#include <mpi.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cstdint>
#include <functional>
#include <numeric>
#include <span>
#include <string_view>
#include <vector>

#include "dtrain/comm/host_buffer.hpp"
#include "dtrain/comm/local_reduce.hpp"
#include "dtrain/comm/mpi_datatype.hpp"
#include "dtrain/comm/pieces_in_flight.hpp"
#include "dtrain/comm/request_wait.hpp"

namespace dtrain::detail {

// Largest count handed to one MPI call. A variable, not a constant, so tests can lower it and
// exercise the large-count paths with small buffers.
inline std::int64_t& mpi_count_limit() noexcept {
  static std::int64_t limit = INT_MAX;
  return limit;
}

inline std::int64_t chunk_elements(std::int64_t chunk_bytes, DataType dtype) noexcept {
  std::int64_t e = std::max<std::int64_t>(1, chunk_bytes / static_cast<std::int64_t>(element_size(dtype)));
  return std::min(e, mpi_count_limit());
}

// In-place allreduce of `n` elements in pieces of at most `chunk_elems`, up to `in_flight` of them
// posted at once (Note [Pieces in flight]). `op` must not be Average (the caller folds it into a
// scale).
inline void host_allreduce(void* buf, std::int64_t n, DataType dtype, ReduceOp op, MPI_Comm comm,
                           std::int64_t chunk_elems, const RequestWait& wait = RequestWait::hot(),
                           int in_flight = 1) {
  PiecesInFlight pieces;
  const std::int64_t count = (n + chunk_elems - 1) / chunk_elems;
  pieces.run(
      count,
      [&](std::int64_t k) {
        const std::int64_t off = k * chunk_elems;
        return PieceSpec{byte_ptr(buf, off, dtype), std::min(chunk_elems, n - off), dtype, op};
      },
      [](std::int64_t) {}, [](std::int64_t) {}, comm, in_flight, wait);
}

// Posts nonblocking calls made by `post(offset, count, request)` over `n` elements in chunks of at
// most `chunk_elems`, up to `in_flight` at once in chunk order, and waits for them all.
template <class Post>
void chunked_in_flight(std::int64_t n, std::int64_t chunk_elems, int in_flight,
                       const RequestWait& wait, std::string_view call, Post&& post) {
  std::array<MPI_Request, kMaxPiecesInFlight> window;
  window.fill(MPI_REQUEST_NULL);
  const int slots = std::clamp(in_flight, 1, kMaxPiecesInFlight);
  int next = 0;
  for (std::int64_t off = 0; off < n; off += chunk_elems) {
    MPI_Request& slot = window[static_cast<std::size_t>(next)];
    if (slot != MPI_REQUEST_NULL) wait.wait(slot, call);  // the oldest in flight
    post(off, static_cast<int>(std::min(chunk_elems, n - off)), &slot);
    next = (next + 1) % slots;
  }
  wait.wait_all(std::span<MPI_Request>(window.data(), static_cast<std::size_t>(slots)), call);
}

inline void host_broadcast(void* buf, std::int64_t n, DataType dtype, int root, MPI_Comm comm,
                           std::int64_t chunk_elems, const RequestWait& wait = RequestWait::hot(),
                           int in_flight = 1) {
  const MPI_Datatype type = mpi_datatype(dtype);
  chunked_in_flight(n, chunk_elems, in_flight, wait, "MPI_Ibcast",
                    [&](std::int64_t off, int count, MPI_Request* request) {
                      mpi_check(MPI_Ibcast(byte_ptr(buf, off, dtype), count, type, root, comm,
                                           request),
                                "MPI_Ibcast");
                    });
}

inline bool fits_in_count(const std::vector<std::int64_t>& counts) {
  std::int64_t total = 0;
  for (auto c : counts) {
    if (c > mpi_count_limit()) return false;
    total += c;
  }
  return total <= mpi_count_limit();
}

inline std::vector<int> to_int(const std::vector<std::int64_t>& v) {
  return std::vector<int>(v.begin(), v.end());
}
inline std::vector<std::int64_t> exclusive_prefix(const std::vector<std::int64_t>& v) {
  std::vector<std::int64_t> out(v.size(), 0);
  for (std::size_t i = 1; i < v.size(); ++i) out[i] = out[i - 1] + v[i - 1];
  return out;
}

// Note [Allgather, not Allgatherv]
// MPICH 4.0.2 runs a large MPI_Allgatherv as point-to-point messages whose every hand-off waits for
// the peer to be scheduled, while MPI_Allgather takes its shared-memory collective path. Measured
// (16 MiB of float32, in place, minimum of 3): two ranks on one core 2072 ms against 16 ms, three
// ranks on two cores 2729 ms against 23 ms, two ranks with a core each 8.6 ms against 3.9 ms; the
// same across namespace hosts, where it made the hierarchical allreduce's in-host gather 2 s of
// its 2.1 s (docs/scaling.md). So blocks of one size, the usual case (every rank gathers the same
// rows; an even split), go through MPI_Allgather. Blocks of different sizes still take
// MPI_Allgatherv: padding them to the largest would multiply the bytes by up to the rank count.
inline bool equal_counts(const std::vector<std::int64_t>& counts) {
  return std::adjacent_find(counts.begin(), counts.end(), std::not_equal_to<>()) == counts.end();
}

// Gathers in place: rank r's `counts[r]` elements already lie at their offset in `recv` (the sum
// of the counts before r); every rank receives every other rank's.
inline void host_allgatherv_in_place(void* recv, const std::vector<std::int64_t>& counts,
                                     DataType dtype, MPI_Comm comm, std::int64_t chunk_elems,
                                     const RequestWait& wait = RequestWait::hot()) {
  const auto displs = exclusive_prefix(counts);
  MPI_Request request = MPI_REQUEST_NULL;
  if (!counts.empty() && equal_counts(counts) && fits_in_count(counts)) {
    mpi_check(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv,
                             static_cast<int>(counts[0]), mpi_datatype(dtype), comm, &request),
              "MPI_Iallgather");
    wait.wait(request, "MPI_Iallgather");
    return;
  }
  if (fits_in_count(counts)) {
    auto c = to_int(counts), d = to_int(displs);
    mpi_check(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, c.data(), d.data(),
                              mpi_datatype(dtype), comm, &request),
              "MPI_Iallgatherv");
    wait.wait(request, "MPI_Iallgatherv");
    return;
  }
  for (std::size_t r = 0; r < counts.size(); ++r)
    host_broadcast(byte_ptr(recv, displs[r], dtype), counts[r], dtype, static_cast<int>(r), comm,
                   chunk_elems, wait);
}

// Gathers `counts[r]` elements from every rank r into `recv`, in rank order.
inline void host_allgatherv(const void* send, void* recv, const std::vector<std::int64_t>& counts,
                            DataType dtype, MPI_Comm comm, std::int64_t chunk_elems,
                            const RequestWait& wait = RequestWait::hot()) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  const auto displs = exclusive_prefix(counts);
  const MPI_Datatype type = mpi_datatype(dtype);
  MPI_Request request = MPI_REQUEST_NULL;
  if (equal_counts(counts) && fits_in_count(counts)) {  // Note [Allgather, not Allgatherv]
    const int count = static_cast<int>(counts[static_cast<std::size_t>(rank)]);
    mpi_check(MPI_Iallgather(count ? send : recv, count, type, recv, count, type, comm, &request),
              "MPI_Iallgather");
    wait.wait(request, "MPI_Iallgather");
    return;
  }
  if (fits_in_count(counts)) {
    auto c = to_int(counts), d = to_int(displs);
    mpi_check(MPI_Iallgatherv(counts[rank] ? send : recv, c[rank], type, recv, c.data(), d.data(),
                              type, comm, &request),
              "MPI_Iallgatherv");
    wait.wait(request, "MPI_Iallgatherv");
    return;
  }
  std::copy_n(static_cast<const char*>(send), counts[rank] * element_size(dtype),
              byte_ptr(recv, displs[rank], dtype));
  host_allgatherv_in_place(recv, counts, dtype, comm, chunk_elems, wait);
}

// Sends send_counts[r] elements to rank r; receives recv_counts[r] elements from rank r.
inline void host_alltoallv(const void* send, const std::vector<std::int64_t>& send_counts,
                           void* recv, const std::vector<std::int64_t>& recv_counts,
                           DataType dtype, MPI_Comm comm, std::int64_t chunk_elems,
                           const RequestWait& wait = RequestWait::hot()) {
  const auto sdispls = exclusive_prefix(send_counts);
  const auto rdispls = exclusive_prefix(recv_counts);
  const MPI_Datatype type = mpi_datatype(dtype);
  if (fits_in_count(send_counts) && fits_in_count(recv_counts)) {
    auto sc = to_int(send_counts), sd = to_int(sdispls), rc = to_int(recv_counts),
         rd = to_int(rdispls);
    MPI_Request request = MPI_REQUEST_NULL;
    mpi_check(MPI_Ialltoallv(send, sc.data(), sd.data(), type, recv, rc.data(), rd.data(), type,
                             comm, &request),
              "MPI_Ialltoallv");
    wait.wait(request, "MPI_Ialltoallv");
    return;
  }
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  // Pairwise exchange: in step s, send to rank+s and receive from rank-s, chunk by chunk. The
  // number of messages from a to b must be ceil(count / chunk) on both sides, whatever else either
  // rank exchanges in that step, so a side with nothing left talks to MPI_PROC_NULL rather than
  // sending (or waiting for) an empty message.
  for (int s = 0; s < size; ++s) {
    const int to = (rank + s) % size, from = (rank - s + size) % size;
    std::int64_t sent = 0, received = 0;
    while (sent < send_counts[to] || received < recv_counts[from]) {
      const int sc = static_cast<int>(std::min(chunk_elems, send_counts[to] - sent));
      const int rc = static_cast<int>(std::min(chunk_elems, recv_counts[from] - received));
      MPI_Request requests[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
      mpi_check(MPI_Irecv(byte_ptr(recv, rdispls[from] + received, dtype), rc, type,
                          rc > 0 ? from : MPI_PROC_NULL, 0, comm, &requests[0]),
                "MPI_Irecv");
      mpi_check(MPI_Isend(byte_ptr(send, sdispls[to] + sent, dtype), sc, type,
                          sc > 0 ? to : MPI_PROC_NULL, 0, comm, &requests[1]),
                "MPI_Isend");
      wait.wait_all(requests, "MPI_Isend/MPI_Irecv (alltoall)");
      sent += sc;
      received += rc;
    }
  }
}

// Reduces `send` (sum of counts elements) across ranks; rank r receives counts[r] elements at
// offset sum(counts[0..r)).
inline void host_reduce_scatter(const void* send, void* recv,
                                const std::vector<std::int64_t>& counts, DataType dtype,
                                ReduceOp op, MPI_Comm comm, std::int64_t chunk_elems,
                                const RequestWait& wait = RequestWait::hot()) {
  const MPI_Datatype type = mpi_datatype(dtype);
  const MPI_Op mop = mpi_op(op, dtype);
  MPI_Request request = MPI_REQUEST_NULL;
  if (fits_in_count(counts)) {
    auto c = to_int(counts);
    mpi_check(MPI_Ireduce_scatter(send, recv, c.data(), type, mop, comm, &request),
              "MPI_Ireduce_scatter");
    wait.wait(request, "MPI_Ireduce_scatter");
    return;
  }
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  const auto displs = exclusive_prefix(counts);
  for (std::size_t r = 0; r < counts.size(); ++r) {
    for (std::int64_t off = 0; off < counts[r]; off += chunk_elems) {
      const int count = static_cast<int>(std::min(chunk_elems, counts[r] - off));
      const bool mine = static_cast<int>(r) == rank;
      mpi_check(MPI_Ireduce(byte_ptr(send, displs[r] + off, dtype),
                            mine ? byte_ptr(recv, off, dtype) : nullptr, count, type, mop,
                            static_cast<int>(r), comm, &request),
                "MPI_Ireduce");
      wait.wait(request, "MPI_Ireduce");
    }
  }
}

// Note [Scaled allreduce]
// MPI has no Average: an average is a sum scaled by 1/n, and a postscale is a scaling too. Scaling
// the whole result after MPI_Allreduce is a full extra pass over the tensor, a large share of the
// reduction's own cost for a big gradient list (docs/performance.md, "Average and Sum side by
// side"). But a large allreduce is, inside
// MPI, a reduce-scatter followed by an allgather, and between the two each rank holds only its
// 1/n shard of the result. host_allreduce_scaled() runs those two steps itself: a ring
// reduce-scatter of point-to-point exchanges, whose last addition into each part also multiplies
// it ((a + b) * f in the one pass that adds anyway), and MPI's allgather. So the scaling costs no
// pass and no copy at all. Small tensors are not worth a second collective's latency: below
// kScaledAllreduceMinBytes one MPI_Allreduce is followed by a scaling pass that stays in cache.
// The choice depends only on the count, the dtype and the communicator's size, so every rank makes
// the same MPI calls. Each part is summed around the ring in a fixed order, and every rank
// receives the same bits from the allgather. A reduce-scatter of MPI's own with a scaling pass
// over the shard was tried first and still left part of a pass (same section).
// Two collectives instead of one only pay where each rank has a core of its own: where ranks
// outnumber cores every MPI call waits for descheduled peers (Note [Direct segments]), and on a
// 2-core machine loaded by other processes the two calls' medians were many times one
// allreduce's, their minima below it. So the host backend takes this road only where every rank
// agreed at init that it has a core (the same verdict as direct segments); elsewhere a scaled
// allreduce is one allreduce and a scaling pass.

// Set before dtrain::init(), on every rank alike, to scale every allreduce's whole result after
// one MPI_Allreduce instead: benchmarks use it to measure what the shards save.
inline bool& disable_scaling_in_shards() noexcept {
  static bool disable = false;
  return disable;
}

// Tensors at least this large are scaled shard by shard (Note [Scaled allreduce]).
inline constexpr std::int64_t kScaledAllreduceMinBytes = std::int64_t{64} << 10;

// Whether an allreduce of `n` elements over `size` ranks scales its shard between a
// reduce-scatter and an allgather rather than the whole result after one allreduce.
inline bool scales_in_shards(std::int64_t n, DataType dtype, int size) noexcept {
  return size > 1 && n >= size &&
         n * static_cast<std::int64_t>(element_size(dtype)) >= kScaledAllreduceMinBytes;
}

// The bytes of shard memory host_allreduce_scaled() needs for `n` elements scaled by `factor`; 0
// where it takes the one-allreduce road.
inline std::size_t scaled_allreduce_shard_bytes(std::int64_t n, DataType dtype, double factor,
                                                int size, std::int64_t chunk_elems) noexcept {
  if (factor == 1.0 || !is_floating_point(dtype) || !scales_in_shards(n, dtype, size)) return 0;
  const std::int64_t step = std::max<std::int64_t>(chunk_elems, size);
  return (static_cast<std::size_t>(std::min(step, n)) / static_cast<std::size_t>(size) + 1) *
         element_size(dtype);
}

// The pieces of an in-place allreduce of `n` elements whose result is multiplied by `factor`, in
// chunks of at most `chunk_elems`: piece k as PiecesInFlight runs it (Note [Scaled allreduce]).
// Every rank plans the same pieces: the plan depends on the count, dtype, factor and size only.
struct ScaledAllreducePlan {
  void* buf = nullptr;
  std::int64_t n = 0;
  DataType dtype = DataType::float32;
  ReduceOp op = ReduceOp::Sum;
  double factor = 1.0;
  std::int64_t step = 1;  // elements per piece
  bool shards = false;    // scaled in shards (ring) where a piece is large enough

  ScaledAllreducePlan(void* b, std::int64_t count, DataType d, ReduceOp o, double f, int size,
                      std::int64_t chunk_elems)
      : buf(b), n(count), dtype(d), op(o), factor(f),
        step(std::max<std::int64_t>(chunk_elems, size)),
        shards(scaled_allreduce_shard_bytes(count, d, f, size, chunk_elems) > 0), size_(size) {}

  std::int64_t pieces() const noexcept { return (n + step - 1) / step; }
  PieceSpec piece(std::int64_t k) const noexcept {
    const std::int64_t off = k * step, len = std::min(step, n - off);
    // A short tail, too small to split, is one allreduce and a scaling pass.
    return PieceSpec{byte_ptr(buf, off, dtype), len, dtype, op, factor, shards && len >= size_};
  }

 private:
  int size_ = 1;
};

// In-place allreduce of `n` elements, the result multiplied by `factor` (Note [Scaled
// allreduce]), up to `in_flight` pieces at once (Note [Pieces in flight]). `op` must not be
// Average. `pieces` keeps the ring memory between calls.
inline void host_allreduce_scaled(void* buf, std::int64_t n, DataType dtype, ReduceOp op,
                                  double factor, MPI_Comm comm, std::int64_t chunk_elems,
                                  PiecesInFlight& pieces,
                                  const RequestWait& wait = RequestWait::hot(), int in_flight = 1) {
  int size = 1;
  MPI_Comm_size(comm, &size);
  if (size == 1) {
    scale_in_place(dtype, buf, n, factor);
    return;
  }
  const ScaledAllreducePlan plan(buf, n, dtype, op, factor, size, chunk_elems);
  pieces.run(
      plan.pieces(), [&](std::int64_t k) { return plan.piece(k); }, [](std::int64_t) {},
      [](std::int64_t) {}, comm, in_flight, wait);
}

}  // namespace dtrain::detail
