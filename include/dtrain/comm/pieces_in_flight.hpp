#pragma once
// In-place allreduces of several pieces in flight at once, each a small state machine of
// nonblocking MPI calls (Note [Pieces in flight]).
//
// Note [Pieces in flight]
// A large reduction is cut into pieces (DTRAIN_MPI_CHUNK_BYTES), and up to
// DTRAIN_MPI_PIECES_IN_FLIGHT of them are posted before the first completes, so the arithmetic of
// one piece (the additions of a reduce-scatter, a scaling pass, unpacking a fused buffer) overlaps
// the transfer of the next, and the link never waits for the CPU. A piece is either one
// MPI_Iallreduce, followed by a scaling pass where its result is scaled, or, where it is scaled
// in shards (Note [Scaled allreduce] in comm/host_collectives.hpp), a ring reduce-scatter of
// point-to-point exchanges whose last addition scales, then an MPI_Iallgatherv.
//
// MPI matches nonblocking collectives on a communicator by the order in which each rank posts
// them, so that order must be the same on every rank whatever the timing. Point-to-point messages
// match by tag instead: each piece in flight has its own. So every piece posts exactly one
// collective (its Iallreduce, or its ring's Iallgatherv), and the pieces post them in piece order:
// a piece whose turn has not come waits, its ring exchanges going on meanwhile. The pieces, their
// kinds and their order follow from the response alone, so every rank makes the same calls.
#include <mpi.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

#include "dtrain/comm/host_buffer.hpp"
#include "dtrain/comm/local_reduce.hpp"
#include "dtrain/comm/mpi_datatype.hpp"
#include "dtrain/comm/mpi_error.hpp"
#include "dtrain/comm/request_wait.hpp"

namespace dtrain::detail {

inline constexpr int kMaxPiecesInFlight = 16;

inline char* byte_ptr(void* p, std::int64_t elems, DataType dtype) noexcept {
  return static_cast<char*>(p) + elems * static_cast<std::int64_t>(element_size(dtype));
}
inline const char* byte_ptr(const void* p, std::int64_t elems, DataType dtype) noexcept {
  return static_cast<const char*>(p) + elems * static_cast<std::int64_t>(element_size(dtype));
}

// One piece's allreduce: `n` elements of `buf` in place, the result multiplied by `factor`.
// `op` must not be Average (the caller folds it into the factor). `n` fits an MPI count.
struct PieceSpec {
  void* buf = nullptr;
  std::int64_t n = 0;
  DataType dtype = DataType::float32;
  ReduceOp op = ReduceOp::Sum;
  double factor = 1.0;
  bool ring = false;  // scaled in shards: ring reduce-scatter + allgather (needs n >= size)
};

// The elements of ring part k of an n-element piece over `size` ranks: the first n % size parts
// take one more.
inline std::int64_t ring_part_count(std::int64_t n, int size, int k) noexcept {
  return n / size + (k < n % size ? 1 : 0);
}

class PieceAllreduce {
 public:
  PieceAllreduce() = default;
  PieceAllreduce(const PieceAllreduce&) = delete;
  PieceAllreduce& operator=(const PieceAllreduce&) = delete;

  // Starts piece `spec`, which is `index` in its job's collective order and exchanges with tag
  // `tag`; `incoming` holds a ring part (ring pieces only). Nothing is posted yet but ring
  // exchanges; advance() posts the rest.
  void start(const PieceSpec& spec, std::int64_t index, int tag, void* incoming, MPI_Comm comm,
             int rank, int size, bool blocking = false) {
    spec_ = spec;
    blocking_ = blocking;
    index_ = index;
    tag_ = tag;
    incoming_ = incoming;
    comm_ = comm;
    rank_ = rank;
    size_ = size;
    requests_ = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    if (!spec.ring || size < 2) {
      phase_ = Phase::awaiting_turn;
      return;
    }
    counts_.resize(static_cast<std::size_t>(size));
    displs_.resize(static_cast<std::size_t>(size));
    int at = 0;
    for (int k = 0; k < size; ++k) {
      counts_[k] = static_cast<int>(ring_part_count(spec.n, size, k));
      displs_[k] = at;
      at += counts_[k];
    }
    step_ = 0;
    post_ring_step();
    phase_ = Phase::ring;
  }

  bool active() const noexcept { return phase_ != Phase::idle; }

  enum class Progress { none, stepped, complete };

  // Tests this piece's requests and takes the next step where they are done; `turn` is the index
  // of the next piece allowed to post its collective, advanced when this one posts. `complete`
  // once the piece is done (then it is idle again).
  Progress advance(std::int64_t& turn) {
    bool posted = false;  // a step taken in this call, though the piece is not done
    switch (phase_) {
      case Phase::idle: return Progress::none;
      case Phase::ring:
        if (!test()) return Progress::none;
        reduce_ring_step();
        if (++step_ < size_ - 1) {
          post_ring_step();
          return Progress::stepped;
        }
        phase_ = Phase::awaiting_turn;
        posted = true;
        [[fallthrough]];
      case Phase::awaiting_turn:
        if (turn != index_) return posted ? Progress::stepped : Progress::none;
        post_collective();
        ++turn;
        phase_ = Phase::collective;
        posted = true;
        [[fallthrough]];
      case Phase::collective:
        // Only a step taken counts as progress: a collective still in flight is not, or the
        // caller would never pace its waiting (Note [Waiting for data collectives]).
        if (!test()) return posted ? Progress::stepped : Progress::none;
        if (!spec_.ring || size_ < 2)
          scale_in_place(spec_.dtype, spec_.buf, spec_.n, spec_.factor);
        phase_ = Phase::idle;
        return Progress::complete;
    }
    return Progress::none;
  }

 private:
  enum class Phase { idle, ring, awaiting_turn, collective };

  bool test() {
    int done = 0;
    mpi_check(MPI_Testall(2, requests_.data(), &done, MPI_STATUSES_IGNORE),
              spec_.ring ? "MPI_Isend/MPI_Irecv (ring reduce-scatter)" : "MPI_Iallreduce");
    return done != 0;
  }

  // Ring reduce-scatter, step s: send this rank's partial sum of part (rank-s-1) to the next rank
  // and receive the previous rank's partial sum of part (rank-s-2); after size-1 steps this rank
  // holds part `rank` complete, and the last addition also scales it (Note [Scaled allreduce]).
  int send_part() const noexcept { return ((rank_ - step_ - 1) % size_ + size_) % size_; }
  int recv_part() const noexcept { return ((rank_ - step_ - 2) % size_ + size_) % size_; }

  void post_ring_step() {
    const MPI_Datatype type = mpi_datatype(spec_.dtype);
    const int next = (rank_ + 1) % size_, prev = (rank_ - 1 + size_) % size_;
    mpi_check(MPI_Irecv(incoming_, counts_[recv_part()], type, prev, tag_, comm_, &requests_[0]),
              "MPI_Irecv (ring reduce-scatter)");
    mpi_check(MPI_Isend(byte_ptr(spec_.buf, displs_[send_part()], spec_.dtype),
                        counts_[send_part()], type, next, tag_, comm_, &requests_[1]),
              "MPI_Isend (ring reduce-scatter)");
  }

  void reduce_ring_step() {
    const int part = recv_part();
    const double f = step_ == size_ - 2 ? spec_.factor : 1.0;
    visit_dtype(spec_.dtype, [&](auto tag) {
      using T = decltype(tag);
      T* mine = reinterpret_cast<T*>(byte_ptr(spec_.buf, displs_[part], spec_.dtype));
      const T* in = static_cast<const T*>(incoming_);
      if (f == 1.0) reduce_into(spec_.op, in, mine, counts_[part]);
      else reduce_scale_into(spec_.op, in, mine, counts_[part], f);
    });
  }

  void post_collective() {
    const MPI_Datatype type = mpi_datatype(spec_.dtype);
    if (blocking_) {  // DTRAIN_MPI_NONBLOCKING=0: MPI waits inside its call; test() is then done
      if (spec_.ring && size_ >= 2)
        mpi_check(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, spec_.buf, counts_.data(),
                                 displs_.data(), type, comm_),
                  "MPI_Allgatherv");
      else if (size_ > 1)
        mpi_check(MPI_Allreduce(MPI_IN_PLACE, spec_.buf, static_cast<int>(spec_.n), type,
                                mpi_op(spec_.op, spec_.dtype), comm_),
                  "MPI_Allreduce");
      requests_ = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
      return;
    }
    if (spec_.ring && size_ >= 2) {
      mpi_check(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, spec_.buf, counts_.data(),
                                displs_.data(), type, comm_, &requests_[0]),
                "MPI_Iallgatherv");
    } else if (size_ > 1) {
      mpi_check(MPI_Iallreduce(MPI_IN_PLACE, spec_.buf, static_cast<int>(spec_.n), type,
                               mpi_op(spec_.op, spec_.dtype), comm_, &requests_[0]),
                "MPI_Iallreduce");
    }
    requests_[1] = MPI_REQUEST_NULL;
  }

  PieceSpec spec_;
  bool blocking_ = false;
  std::int64_t index_ = 0;
  int tag_ = 0;
  void* incoming_ = nullptr;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  Phase phase_ = Phase::idle;
  int step_ = 0;
  std::array<MPI_Request, 2> requests_{MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  std::vector<int> counts_, displs_;  // ring parts; keep their capacity between pieces
};

// Runs a job's pieces with up to `in_flight` of them posted at once (Note [Pieces in flight]).
// Persistent: its slots and ring memory are reused, so a steady-state step allocates nothing.
class PiecesInFlight {
 public:
  // The ring memory `pieces_in_flight` ring pieces of at most `piece_elems` elements need.
  static std::size_t ring_bytes(std::int64_t piece_elems, DataType dtype, int size,
                                int in_flight) noexcept {
    if (size < 2) return 0;
    const std::int64_t part = piece_elems / size + 1;
    return static_cast<std::size_t>(part) * element_size(dtype) *
           static_cast<std::size_t>(std::clamp(in_flight, 1, kMaxPiecesInFlight));
  }

  // Reserves ring memory ahead, so the first step that needs it does not allocate.
  void reserve_ring(std::size_t bytes) {
    if (bytes > 0) ring_.reserve(bytes);
  }
  std::uint64_t allocations() const noexcept { return ring_.allocations(); }

  // Reduces pieces 0..count-1 in place over `comm`: `spec(k)` describes piece k, `before(k)` runs
  // right before it starts (packing), `after(k)` once it is complete (unpacking), in completion
  // order. At most `in_flight` pieces at once; waits as `wait` says. Collective over `comm`.
  template <class Spec, class Before, class After>
  void run(std::int64_t count, Spec&& spec, Before&& before, After&& after, MPI_Comm comm,
           int in_flight, const RequestWait& wait) {
    if (count <= 0) return;
    int rank = 0, size = 1;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    const int slots = std::clamp(in_flight, 1, kMaxPiecesInFlight);
    // Ring memory: one part per slot, of the largest ring piece.
    std::int64_t largest = 0;
    for (std::int64_t k = 0; k < count; ++k) {
      const PieceSpec s = spec(k);
      if (s.ring) largest = std::max(largest, s.n);
    }
    const std::size_t part_bytes = largest > 0 ? ring_bytes(largest, spec(0).dtype, size, 1) : 0;
    char* ring = nullptr;
    if (part_bytes > 0)
      ring = static_cast<char*>(ring_.reserve(part_bytes * static_cast<std::size_t>(slots)));

    std::int64_t next = 0, done = 0, turn = 0;
    RequestWait::Pacer pacer(wait);
    while (done < count) {
      bool moved = false;
      for (int s = 0; s < slots && next < count; ++s) {
        if (slots_[s].active()) continue;
        before(next);
        void* incoming = ring ? ring + static_cast<std::size_t>(s) * part_bytes : nullptr;
        slots_[s].start(spec(next), next, static_cast<int>(next % kTagSpan), incoming, comm, rank,
                        size, wait.blocking_allreduce);
        slot_piece_[s] = next++;
        moved = true;
      }
      for (int s = 0; s < slots; ++s) {
        const auto progress = slots_[s].advance(turn);
        if (progress == PieceAllreduce::Progress::none) continue;
        moved = true;
        if (progress != PieceAllreduce::Progress::complete) continue;
        after(slot_piece_[s]);
        ++done;
      }
      if (moved) pacer.progressed();
      else pacer.idle();
    }
  }

 private:
  // Tags of pieces in flight: far more than can be in flight at once, below MPI's least tag bound.
  static constexpr std::int64_t kTagSpan = 4096;

  std::array<PieceAllreduce, kMaxPiecesInFlight> slots_;
  std::array<std::int64_t, kMaxPiecesInFlight> slot_piece_{};
  HostBuffer ring_;
};

}  // namespace dtrain::detail
