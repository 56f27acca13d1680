#pragma once
// Executes responses on host memory over MPI (the data communicator of one process set, separate
// from the control communicator the engine negotiates on).
//
// Note [Fused allgather]
// A small allgather costs its latency, not its bytes: a hundred of them one after another pay a
// hundred MPI rounds (and, with ranks sharing cores, a hundred waits for descheduled peers). A
// response of several allgathers (Note [Fusion planning]) runs as one MPI_Allgatherv on the fusion
// buffer, laid out rank by rank: rank k's block holds its rows of every tensor of the response,
// in the response's order, so its contribution is its own tensors packed back to back, and every
// block's size follows from the response (rank_rows, row_numels) on every rank. Each rank copies
// its tensors into its own block, gathers in place, and builds tensor i's output from tensor i's
// part of every block, in rank order. A rank that joined contributes an empty block. The layout
// is a function of the response alone, so every rank makes the same call; dim 0 may differ per
// rank and per tensor, and a rank may have no rows at all.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>

#include <fmt/format.h>

#include "dtrain/comm/gloo_group.hpp"
#include "dtrain/comm/hierarchical.hpp"
#include "dtrain/comm/host_buffer.hpp"
#include "dtrain/comm/host_collectives.hpp"
#include "dtrain/comm/pieces_in_flight.hpp"
#include "dtrain/comm/request_wait.hpp"
#include "dtrain/core/config.hpp"
#include "dtrain/runtime/execution/backend.hpp"
#include "dtrain/runtime/execution/fusion_pipeline.hpp"
#include "dtrain/runtime/execution/timeline.hpp"
#include "dtrain/runtime/negotiation/op_key.hpp"

namespace dtrain::detail {

// How the host path applies a response's scale factors around a reduction (Note [Scaled
// allreduce]): `before` multiplies each input, `after` the reduced result. For a float32/float64
// sum the prescale moves to the result, where it costs nothing extra: scaling distributes over a
// sum up to rounding. 16-bit floats keep it on the inputs, where it exists to keep their sum in
// range; Min, Max and Product keep it there because scaling does not distribute over them.
struct ScaleSplit {
  double before = 1.0, after = 1.0;
};
inline ScaleSplit split_scaling(ReduceOp op, DataType dtype, double prescale, double postscale) {
  if (op == ReduceOp::Sum && (dtype == DataType::float32 || dtype == DataType::float64))
    return {1.0, prescale * postscale};
  return {prescale, postscale};
}

// How a rank waits for its data collectives over a group whose host layout is `hierarchy`: with
// sleeps of at most DTRAIN_WAIT_MAX_SLEEP_US where the group spans hosts, hot within one (Note
// [Waiting for data collectives] in comm/request_wait.hpp). It changes no MPI call, only when this
// rank makes its next one, so it need not be agreed.
inline RequestWait data_wait(const HostPathSettings& config, const HierarchyComms& hierarchy) {
  RequestWait w = RequestWait::hot();
  if (hierarchy.valid() && hierarchy.layout.hosts() >= 2 && config.wait_max_sleep_us > 0)
    w = RequestWait::sleeping(std::chrono::duration_cast<RequestWait::Clock::duration>(
        std::chrono::duration<double, std::micro>(config.wait_max_sleep_us)));
  w.blocking_allreduce = !config.mpi_nonblocking;
  return w;
}

// The settings a backend starts from, before the autotuner moves them.
inline TunedSettings untuned(const HostPathSettings& s) {
  return TunedSettings{0, s.fusion_pipeline, s.hierarchical_allreduce, s.mpi_pieces_in_flight};
}

class HostBackend final : public Backend {
 public:
  using Clock = std::chrono::steady_clock;
  struct Options {
    MPI_Comm comm = MPI_COMM_NULL;
    // Whole (Note [Settings by component] in core/config.hpp). The tunable ones are where the
    // backend starts; retune() moves it on.
    HostPathSettings settings;
    Timeline* timeline = nullptr;  // non-null on the rank that writes the timeline
    EngineCounters* stats = nullptr;
    // DTRAIN_HIERARCHICAL_ALLREDUCE: allreduce through `hierarchy` (comm/hierarchical.hpp).
    HierarchyComms hierarchy;
    // Reduce large tensors of fused responses in their own memory: agreed by every rank at init
    // (Note [Direct segments]).
    bool direct_segments = false;
    // How this rank waits for its requests on `comm`: with sleeps where it spans hosts (Note
    // [Waiting for data collectives] in comm/request_wait.hpp).
    RequestWait wait = RequestWait::hot();
    // DTRAIN_CPU_OPERATIONS=gloo: the data collectives go over `gloo_group`, connected over
    // `comm` (Note [Gloo on the host path] in comm/gloo_group.hpp); a process set's executor
    // connects its own like it. No hierarchy: Gloo's ring spans every rank.
    std::shared_ptr<GlooGroup> gloo_group;
  };
  explicit HostBackend(Options options) : options_(std::move(options)) {
    MPI_Comm_rank(options_.comm, &rank_);
    MPI_Comm_size(options_.comm, &size_);
    gloo_ = options_.gloo_group.get();
    const Options& o = options_;
    // Without the host layout, assume the worst: every rank on this host.
    ranks_on_host_ = o.hierarchy.valid() ? o.hierarchy.layout.local_size : size_;
    direct_min_bytes_ = o.direct_segments ? kFusionDirectMinBytes : 0;
    shards_ = o.direct_segments && !disable_scaling_in_shards();
    retune(untuned(o.settings));
  }

  // The autotuner's settings, applied by every rank at the same response message (Note [Applying
  // tuned settings] in runtime/engine/engine_autotuner.hpp).
  void retune(const TunedSettings& tuned) {
    overlap_ = tuned.fusion_pipeline && overlap_pays(ranks_on_host_);  // local: moves no MPI call
    hierarchical_ = tuned.hierarchical_allreduce && options_.hierarchy.valid() && !gloo_;
    pieces_in_flight_ = tuned.pieces_in_flight;
  }

  // Whether fused allreduces overlap packing with reduction here (Note [Fusion pipeline]).
  bool overlaps() const noexcept { return overlap_; }

  void execute(const Response& r, std::span<Entry* const> entries,
               Clock::time_point arrival) override {
    const auto start = Clock::now();
    if (timeline())
      for (std::size_t i = 0; i < entries.size(); ++i)
        if (entries[i]) options_.timeline->span(timeline_row(r, i), "QUEUE", arrival, start);
    switch (r.kind) {
      case OpKind::allreduce: allreduce(r, entries); break;
      case OpKind::allgather:
        if (entries.size() == 1) allgather(r, entries[0]);
        else fused_allgather(r, entries);
        break;
      case OpKind::broadcast: broadcast(r, entries[0]); break;
      case OpKind::alltoall: alltoall(r, entries[0]); break;
      case OpKind::reducescatter: reducescatter(r, entries[0]); break;
      case OpKind::barrier:
      case OpKind::join:
      case OpKind::process_set: break;  // negotiation itself is the synchronization
    }
    options_.stats->add(Counter::collectives);
    if (gloo_) options_.stats->add(Counter::gloo_collectives);
  }

  std::uint64_t buffer_allocations() const noexcept {
    return fusion_.allocations() + scratch_.allocations() + piece_.allocations() +
           pieces_.allocations();
  }

 private:
  Timeline* timeline() const noexcept {
    return options_.timeline && options_.timeline->active() ? options_.timeline : nullptr;
  }
  // The timeline row of tensor i of `r`.
  static std::string timeline_row(const Response& r, std::size_t i) {
    return display_name(r.process_set, r.names[i]);
  }
  std::int64_t chunk(DataType d) const noexcept { return chunk_elements(options_.settings.mpi_chunk_bytes, d); }

  // Reduces in place and multiplies the result by `factor` (Note [Scaled allreduce]).
  void reduce(void* buf, std::int64_t n, DataType dtype, ReduceOp op, std::int64_t chunk_elems,
              double factor) {
    const int in_flight = pieces_in_flight_;
    if (gloo_) {
      gloo_->allreduce(buf, n, dtype, op);
      scale_in_place(dtype, buf, n, factor);
      return;
    }
    if (hierarchical_) {
      hierarchical_allreduce(buf, n, dtype, op, options_.hierarchy, piece_, chunk_elems, factor,
                             options_.wait, in_flight);
    } else if (shards_) {  // every rank has a core: shards pay (Note [Scaled allreduce])
      host_allreduce_scaled(buf, n, dtype, op, factor, options_.comm, chunk_elems, pieces_,
                            options_.wait, in_flight);
    } else {
      host_allreduce(buf, n, dtype, op, options_.comm, chunk_elems, options_.wait, in_flight);
      scale_in_place(dtype, buf, n, factor);
    }
  }

  // A piece of a fused job as PiecesInFlight runs it: scaled in shards where reduce() would.
  PieceSpec fused_piece(const FusedJob& job, std::int64_t k, ReduceOp op) const {
    const std::int64_t n = job.piece_numel(k);
    const double factor = job.reduce_factor(k);
    const bool ring =
        shards_ && scaled_allreduce_shard_bytes(n, job.dtype, factor, size_, job.piece) > 0;
    return PieceSpec{job.piece_data(k), n, job.dtype, op, factor, ring};
  }

  void allreduce(const Response& r, std::span<Entry* const> entries) {
    const DataType dtype = r.dtype;
    const ReduceOp op = effective_op(r);
    const double post = effective_postscale(r);
    const std::size_t es = element_size(dtype);
    if (hierarchical_) options_.stats->add(Counter::hierarchical_collectives);
    options_.stats->add(Counter::bytes_reduced, static_cast<std::uint64_t>(r.total_numel()) * es);
    if (entries.size() == 1) {
      // A lone tensor is reduced in place: no copies into a fusion buffer. A rank that joined
      // contributes the op's identity from scratch memory, through the same calls: whether the
      // reduction scales in shards changes the MPI calls (Note [Scaled allreduce]).
      const std::int64_t n = r.numels[0];
      void* data = entries[0] ? entries[0]->data : nullptr;
      if (!data) {
        data = scratch_.reserve(static_cast<std::size_t>(std::max<std::int64_t>(n, 1)) * es);
        fill_identity(dtype, op, data, n);
      }
      const ScaleSplit scale = split_scaling(op, dtype, r.prescale, post);
      auto t0 = Clock::now();
      scale_in_place(dtype, data, n, scale.before);
      auto t1 = Clock::now();
      reduce(data, n, dtype, op, chunk(dtype), scale.after);
      auto t2 = Clock::now();
      if (!entries[0]) return;
      if (auto* tl = timeline()) {
        tl->span(timeline_row(r, 0), "MPI_ALLREDUCE", t1, t2);
        if (scale.before != 1.0) tl->span(timeline_row(r, 0), "SCALE_IN", t0, t1);
      }
      return;
    }
    // Persistent: its vectors keep their capacity, so a steady-state step allocates nothing.
    FusedJob& job = job_;
    job.dtype = dtype;
    job.prescale = r.prescale;
    job.postscale = post;
    const ScaleSplit direct_scale = split_scaling(op, dtype, r.prescale, post);
    job.direct_prescale = direct_scale.before;
    job.direct_factor = direct_scale.after;
    job.op = op;
    job.segments.clear();
    for (std::size_t i = 0; i < entries.size(); ++i) {
      FusedSegment s;
      s.numel = r.numels[i];
      if (entries[i]) s.src = s.dst = entries[i]->data;
      job.segments.push_back(s);
    }
    job.piece = chunk(dtype);
    reserve_shards_for_lone(r, dtype, direct_scale.after);
    job.lay_out(direct_min_bytes_ / static_cast<std::int64_t>(es));  // Note [Direct segments]
    job.buffer = job.packed_in_place();  // Note [Gradients in fusion memory]
    if (!job.buffer) job.buffer = fusion_.reserve(static_cast<std::size_t>(job.total) * es);
    const std::int64_t pieces = job.pieces();
    auto t0 = Clock::now();
    Clock::time_point reduce_begin = t0, reduce_end = t0;
    if (overlap_ || hierarchical_ || gloo_) {
      // A helper thread packs and unpacks around one piece at a time (Note [Fusion pipeline]); the
      // hierarchy's steps run on three communicators, and Gloo's on its own, one piece at a time.
      pipeline_.run(job, [&](std::int64_t k) {
        if (k == 0) reduce_begin = Clock::now();
        reduce(job.piece_data(k), job.piece_numel(k), dtype, op, job.piece, job.reduce_factor(k));
        if (k + 1 == pieces) reduce_end = Clock::now();
      }, overlap_);
    } else {
      // Each piece is packed as it starts and unpacked as it completes, with the next ones in
      // flight meanwhile (Note [Pieces in flight]).
      std::int64_t completed = 0;
      pieces_.run(
          pieces, [&](std::int64_t k) { return fused_piece(job, k, op); },
          [&](std::int64_t k) {
            job.copy_piece(k, CopyDirection::pack);
            if (k == 0) reduce_begin = Clock::now();
          },
          [&](std::int64_t k) {
            if (++completed == pieces) reduce_end = Clock::now();
            job.copy_piece(k, CopyDirection::unpack);
          },
          options_.comm, pieces_in_flight_, options_.wait);
    }
    auto t3 = Clock::now();
    options_.stats->add(Counter::fused_collectives);
    if (auto* tl = timeline()) {
      for (std::size_t i = 0; i < entries.size(); ++i) {
        if (!entries[i]) continue;
        tl->span(timeline_row(r, i), "MEMCPY_IN_FUSION_BUFFER", t0, reduce_begin);
        tl->span(timeline_row(r, i), "MPI_ALLREDUCE", reduce_begin, reduce_end);
        tl->span(timeline_row(r, i), "MEMCPY_OUT_FUSION_BUFFER", reduce_end, t3);
      }
    }
  }

  // Timing decides which tensors share a batch, so any tensor of this one may come alone in a
  // later step, and a lone tensor is scaled in shards where this batch's packed pieces were not
  // (Note [Scaled allreduce]). Sizing the shard memory for each of them now keeps the first such
  // step from allocating: steady-state steps grow no buffer.
  void reserve_shards_for_lone(const Response& r, DataType dtype, double lone_factor) {
    if (!shards_ || hierarchical_) return;
    const std::int64_t step = std::max<std::int64_t>(chunk(dtype), size_);
    std::size_t bytes = 0;
    for (std::int64_t n : r.numels)
      if (scaled_allreduce_shard_bytes(n, dtype, lone_factor, size_, chunk(dtype)) > 0)
        bytes = std::max(bytes, PiecesInFlight::ring_bytes(std::min(step, n), dtype, size_,
                                                           pieces_in_flight_));
    pieces_.reserve_ring(bytes);
  }

  void allgather(const Response& r, Entry* e) {
    const AllgatherLayout layout = allgather_layout(r);
    const std::vector<std::int64_t>& counts = layout.counts;
    const std::size_t es = element_size(r.dtype);
    void* out = e ? e->make_output(layout.out_shape)
                  : scratch_.reserve(static_cast<std::size_t>(layout.total) * es);
    auto t0 = Clock::now();
    if (gloo_)
      gloo_->allgatherv(e ? e->input : nullptr, out, counts, r.dtype);
    else
    host_allgatherv(e ? e->input : nullptr, out, counts, r.dtype, options_.comm, chunk(r.dtype),
                    options_.wait);
    if (auto* tl = timeline(); tl && e)
      tl->span(timeline_row(r, 0), "MPI_ALLGATHER", t0, Clock::now());
  }

  // Several allgathers in one MPI_Allgatherv (Note [Fused allgather]).
  void fused_allgather(const Response& r, std::span<Entry* const> entries) {
    const std::size_t ranks = static_cast<std::size_t>(size_);
    const std::size_t es = element_size(r.dtype);
    auto elements = [&](std::size_t i, std::size_t k) {  // tensor i's elements from rank k
      return r.rank_rows[i * ranks + k] * r.row_numels[i];
    };
    gather_counts_.assign(ranks, 0);
    for (std::size_t i = 0; i < entries.size(); ++i)
      for (std::size_t k = 0; k < ranks; ++k) gather_counts_[k] += elements(i, k);
    const std::vector<std::int64_t> displs = exclusive_prefix(gather_counts_);
    const std::int64_t total = displs.back() + gather_counts_.back();
    char* buf = static_cast<char*>(
        fusion_.reserve(static_cast<std::size_t>(std::max<std::int64_t>(total, 1)) * es));
    const auto t0 = Clock::now();
    const auto me = static_cast<std::size_t>(rank_);
    std::int64_t at = displs[me];
    for (std::size_t i = 0; i < entries.size(); ++i) {
      const std::int64_t n = elements(i, me);
      if (n > 0 && entries[i])
        std::memcpy(buf + at * static_cast<std::int64_t>(es), entries[i]->input,
                    static_cast<std::size_t>(n) * es);
      at += n;
    }
    const auto t1 = Clock::now();
    if (gloo_) gloo_->allgatherv(nullptr, buf, gather_counts_, r.dtype);
    else
    host_allgatherv_in_place(buf, gather_counts_, r.dtype, options_.comm, chunk(r.dtype),
                             options_.wait);
    const auto t2 = Clock::now();
    gather_used_.assign(ranks, 0);  // elements of each rank's block taken by earlier tensors
    for (std::size_t i = 0; i < entries.size(); ++i) {
      char* out = nullptr;
      if (entries[i]) {
        std::int64_t rows = 0;
        for (std::size_t k = 0; k < ranks; ++k) rows += r.rank_rows[i * ranks + k];
        Shape shape = entries[i]->request.shape;
        shape[0] = rows;
        out = static_cast<char*>(entries[i]->make_output(shape));
      }
      std::int64_t written = 0;
      for (std::size_t k = 0; k < ranks; ++k) {
        const std::int64_t n = elements(i, k);
        if (out && n > 0)
          std::memcpy(out + written * static_cast<std::int64_t>(es),
                      buf + (displs[k] + gather_used_[k]) * static_cast<std::int64_t>(es),
                      static_cast<std::size_t>(n) * es);
        written += n;
        gather_used_[k] += n;
      }
    }
    const auto t3 = Clock::now();
    options_.stats->add(Counter::fused_collectives);
    if (auto* tl = timeline()) {
      for (std::size_t i = 0; i < entries.size(); ++i) {
        if (!entries[i]) continue;
        tl->span(timeline_row(r, i), "MEMCPY_IN_FUSION_BUFFER", t0, t1);
        tl->span(timeline_row(r, i), "MPI_ALLGATHER", t1, t2);
        tl->span(timeline_row(r, i), "MEMCPY_OUT_FUSION_BUFFER", t2, t3);
      }
    }
  }

  void broadcast(const Response& r, Entry* e) {
    const std::int64_t n = r.numels[0];
    void* buf = e ? e->data : scratch_.reserve(static_cast<std::size_t>(n) * element_size(r.dtype));
    auto t0 = Clock::now();
    if (gloo_) gloo_->broadcast(buf, n, r.dtype, r.root);
    else
    host_broadcast(buf, n, r.dtype, r.root, options_.comm, chunk(r.dtype), options_.wait,
                   pieces_in_flight_);
    if (auto* tl = timeline(); tl && e) tl->span(timeline_row(r, 0), "MPI_BCAST", t0, Clock::now());
  }

  void alltoall(const Response& r, Entry* e) {
    AlltoallCounts c =
        exchange_alltoall_counts(*e, size_, options_.comm, "MPI_Ialltoall", options_.wait);
    void* out = e->make_output(c.out_shape);
    auto t0 = Clock::now();
    if (gloo_) gloo_->alltoallv(e->input, c.send_counts, out, c.recv_counts, r.dtype);
    else
    host_alltoallv(e->input, c.send_counts, out, c.recv_counts, r.dtype, options_.comm,
                   chunk(r.dtype), options_.wait);
    if (auto* tl = timeline()) tl->span(timeline_row(r, 0), "MPI_ALLTOALL", t0, Clock::now());
    e->set_received_splits(std::move(c.recv_rows));
  }

  void reducescatter(const Response& r, Entry* e) {
    const Shape& shape = e->request.shape;
    const std::int64_t rows = shape.empty() ? 1 : shape[0];
    const std::int64_t row = row_numel(shape);
    std::vector<std::int64_t> counts(size_);
    for (int k = 0; k < size_; ++k)
      counts[k] = (rows / size_ + (k < rows % size_ ? 1 : 0)) * row;
    Shape out_shape = shape.empty() ? Shape{counts[rank_]} : shape;
    out_shape[0] = counts[rank_] / std::max<std::int64_t>(row, 1);
    if (row == 0) out_shape[0] = rows / size_ + (rank_ < rows % size_ ? 1 : 0);
    void* out = e->make_output(out_shape);
    const void* send = e->input;
    if (r.prescale != 1.0) {
      const std::int64_t n = rows * row;
      void* tmp = scratch_.reserve(static_cast<std::size_t>(n) * element_size(r.dtype));
      scale_copy(r.dtype, send, tmp, n, r.prescale);
      send = tmp;
    }
    auto t0 = Clock::now();
    if (gloo_) gloo_->reduce_scatter(send, out, counts, r.dtype, effective_op(r));
    else
    host_reduce_scatter(send, out, counts, r.dtype, effective_op(r), options_.comm, chunk(r.dtype),
                        options_.wait);
    scale_in_place(r.dtype, out, counts[rank_], effective_postscale(r));
    if (auto* tl = timeline()) tl->span(timeline_row(r, 0), "MPI_REDUCESCATTER", t0, Clock::now());
  }

  GlooGroup* gloo_ = nullptr;  // options_.gloo_group's
  bool hierarchical_ = false;   // tuned, and possible here (Note [Applying tuned settings])
  int pieces_in_flight_ = 1;
  Options options_;
  int rank_ = 0, size_ = 1;
  HostBuffer fusion_;
  HostBuffer scratch_;
  int ranks_on_host_ = 1;
  HostBuffer piece_;  // this rank's piece during a hierarchical allreduce
  PiecesInFlight pieces_;  // Note [Pieces in flight]; its ring memory (Note [Scaled allreduce])
  FusedJob job_;  // the fused allreduce being executed (Note [Direct segments])
  std::vector<std::int64_t> gather_counts_, gather_used_;  // a fused allgather's, reused
  FusionPipeline pipeline_;
  bool overlap_ = false;
  std::int64_t direct_min_bytes_ = 0;  // 0: pack every tensor of a fused response
  bool shards_ = false;  // scaled allreduces scale their shard (Note [Scaled allreduce])
};

}  // namespace dtrain::detail
