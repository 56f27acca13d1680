#pragma once
// Executes device responses with NCCL on dtrain-owned streams. See docs/device.md.
//
// Note [Device stream ordering]
// Each op runs on a lane: a GPU, a non-blocking CUDA stream owned by dtrain, and a NCCL
// communicator. The lane's stream first waits (cudaStreamWaitEvent, no host sync) on an event
// recorded on each input's producer stream (a null stream means the legacy default stream), then
// runs pack -> collective -> unpack, then records a completion event. The engine thread waits on
// the host until that event has completed (Note [Non-blocking NCCL] in cuda/nccl_comm.hpp) and
// only then completes the op's handle. So when Handle::wait() returns, the results are in device
// memory and visible to any stream and to the host; nothing the caller enqueues afterwards can run
// before them.
//
// Lanes are keyed by (device slot, stream index). The device slot is the CUDA index in the
// response (rank 0's tensor), identical on every rank, so every rank creates the same lanes at
// the same response; each rank uses its own tensor's GPU for it. Stream indices go round robin
// over DTRAIN_NUM_NCCL_STREAMS, each stream with its own communicator. Communicators are created
// on a lane's first op (lazily: processes that never use a GPU never touch NCCL).
#include <mpi.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "dtrain/comm/hierarchical.hpp"
#include "dtrain/cuda/copy_plan.hpp"
#include "dtrain/cuda/device.hpp"
#include "dtrain/cuda/kernels.hpp"
#include "dtrain/cuda/nccl_comm.hpp"
#include "dtrain/cuda/transport.hpp"

namespace dtrain::detail {

class NcclBackend final : public DeviceTransport {
 public:
  explicit NcclBackend(const BackendContext& ctx) : ctx_(ctx) {
    MPI_Comm_rank(ctx.data_comm, &rank_);
    MPI_Comm_size(ctx.data_comm, &size_);
    streams_ = std::max(1, ctx.config->num_nccl_streams);
  }

  void execute(const Response& r, std::span<Entry* const> entries, int device) override {
    const auto start = std::chrono::steady_clock::now();
    DeviceGuard guard(device);
    const Deadline deadline = Deadline::after(ctx_.op_timeout_seconds, ctx_.own_pauses);
    Lane& lane = lane_for(r, device, deadline);
    order_after_producers(lane.stream, lane.ready, entries);
    std::vector<NcclComm*> used{&lane.world};
    switch (r.kind) {
      case OpKind::allreduce: allreduce(lane, r, entries, deadline, used); break;
      case OpKind::allgather: allgather(lane, r, entries[0], deadline); break;
      case OpKind::broadcast: broadcast(lane, r, entries[0], deadline); break;
      case OpKind::alltoall: alltoall(lane, r, entries[0], deadline); break;
      case OpKind::reducescatter: reducescatter(lane, r, entries[0], deadline); break;
      case OpKind::barrier:
      case OpKind::join:
      case OpKind::process_set: break;
    }
    cuda_check(cudaEventRecord(lane.done, lane.stream), "cudaEventRecord (op completion)");
    wait_for_device(lane.done, used,
                    deadline, fmt::format("NCCL {} '{}'", r.kind,
                                          r.names.empty() ? "" : r.names.front()));
    ctx_.stats->add(Counter::collectives);
    if (ctx_.timeline && ctx_.timeline->active()) {
      const auto end = std::chrono::steady_clock::now();
      const std::string phase = fmt::format("NCCL_{}", upper(to_string(r.kind)));
      for (std::size_t i = 0; i < entries.size() && i < r.names.size(); ++i)
        if (entries[i]) ctx_.timeline->span(r.names[i], phase, start, end);
    }
  }

  std::uint64_t buffer_allocations() const noexcept {
    std::uint64_t n = 0;
    for (const auto& [key, lane] : lanes_) n += lane->fusion.allocations() + lane->scratch.allocations();
    return n;
  }

 private:
  struct Lane {
    int device = 0;
    cudaStream_t stream = nullptr;
    cudaEvent_t ready = nullptr;  // re-recorded on each producer stream
    cudaEvent_t done = nullptr;
    DeviceBuffer fusion;
    DeviceBuffer scratch;
    NcclComm world;
    NcclComm local;   // hierarchical allreduce, created on first use
    NcclComm cross;
    const DeviceKernels* kernels = nullptr;

    Lane() = default;
    Lane(const Lane&) = delete;
    Lane& operator=(const Lane&) = delete;
    ~Lane() {
      int previous = -1;
      cudaGetDevice(&previous);
      cudaSetDevice(device);
      world = NcclComm();
      local = NcclComm();
      cross = NcclComm();
      fusion.reset();
      scratch.reset();
      if (stream) cudaStreamDestroy(stream);
      if (ready) cudaEventDestroy(ready);
      if (done) cudaEventDestroy(done);
      if (previous >= 0) cudaSetDevice(previous);
    }
  };

  static std::string upper(std::string_view s) {
    std::string out(s);
    for (auto& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    return out;
  }

  Lane& lane_for(const Response& r, int device, const Deadline& deadline) {
    const int slot = r.device.index;
    const int stream_index = static_cast<int>(next_stream_[slot]++ % static_cast<std::uint64_t>(streams_));
    auto& lane = lanes_[{slot, stream_index}];
    if (lane) {
      if (lane->device != device)
        throw InvalidArgumentError(fmt::format(
            "dtrain: rank {} submitted '{}' on cuda:{} but earlier device ops of the same device "
            "slot ran on cuda:{}: keep each rank's device tensors on one GPU",
            rank_, r.names.empty() ? "" : r.names.front(), device, lane->device));
      return *lane;
    }
    auto l = std::make_unique<Lane>();
    l->device = device;
    cuda_check(cudaStreamCreateWithFlags(&l->stream, cudaStreamNonBlocking), "cudaStreamCreate");
    cuda_check(cudaEventCreateWithFlags(&l->ready, cudaEventDisableTiming), "cudaEventCreate");
    cuda_check(cudaEventCreateWithFlags(&l->done, cudaEventDisableTiming), "cudaEventCreate");
    l->kernels = &KernelLibrary::instance().for_device(device);
    l->world = NcclComm::create(ctx_.data_comm, deadline,
                                fmt::format("world (device slot {}, stream {})", slot, stream_index));
    lane = std::move(l);
    return *lane;
  }

  void ensure_hierarchy_comms(Lane& lane, const Deadline& deadline) {
    if (lane.local.valid()) return;
    lane.local = NcclComm::create(ctx_.hierarchy.local, deadline, "intra-host");
    lane.cross = NcclComm::create(ctx_.hierarchy.cross, deadline, "cross-host");
  }

  bool hierarchical() const noexcept {
    return ctx_.config->hierarchical_allreduce && ctx_.hierarchy.valid() && size_ > 1;
  }

  void copy(Lane& lane, const std::vector<CopySegment>& segments, DataType dtype, double scale) {
    batched_copy(*lane.kernels, segments, dtype, scale, lane.stream);
  }

  // ---- allreduce --------------------------------------------------------------------------------

  void allreduce(Lane& lane, const Response& r, std::span<Entry* const> entries,
                 const Deadline& deadline, std::vector<NcclComm*>& used) {
    const std::int64_t n = r.total_numel();
    const DataType dtype = r.dtype;
    const std::size_t es = element_size(dtype);
    ctx_.stats->add(Counter::bytes_reduced, static_cast<std::uint64_t>(n) * es);
    if (n == 0) return;
    const bool hier = hierarchical();
    // ncclAvg divides by the communicator size, which is right only when nobody joined.
    const bool avg = !hier && r.reduce_op == ReduceOp::Average && nccl_has_avg() &&
                     r.active_ranks == size_;
    const ReduceOp op = avg ? ReduceOp::Average : effective_op(r);
    const double post = avg ? r.postscale : effective_postscale(r);
    const ncclDataType_t type = nccl_datatype(dtype);

    if (entries.size() == 1 && entries[0] && !hier) {
      // A lone tensor is reduced in place: no fusion-buffer copies.
      void* d = entries[0]->data;
      if (r.prescale != 1.0) copy(lane, {{d, d, n}}, dtype, r.prescale);
      lane.world.check(ncclAllReduce(d, d, static_cast<std::size_t>(n), type, nccl_op(op),
                                     lane.world.get(), lane.stream),
                       "ncclAllReduce", deadline);
      if (post != 1.0) copy(lane, {{d, d, n}}, dtype, post);
      return;
    }

    // Even pieces for NCCL's reduce-scatter: pad the buffer to a multiple of the local size. Only
    // when every host has the same size: the padding must be the same on every host, or the
    // cross-host pieces would differ in length.
    const bool even = hier && ctx_.hierarchy.layout.homogeneous;
    std::vector<void*> tensors(entries.size(), nullptr);
    for (std::size_t i = 0; i < entries.size(); ++i)
      if (entries[i]) tensors[i] = entries[i]->data;
    const FusedLayout layout = plan_fused_layout(r.numels, even ? ctx_.hierarchy.layout.local_size : 1);
    void* buf = lane.fusion.reserve(static_cast<std::size_t>(layout.total) * es);
    auto pack = fused_segments(layout, r.numels, tensors, buf, es, CopyDirection::pack);
    if (layout.total > n) pack.push_back({nullptr, static_cast<char*>(buf) + n * es, layout.total - n});
    copy(lane, pack, dtype, r.prescale);
    if (hier) {
      hierarchical_allreduce_nccl(lane, buf, layout.total, dtype, op, even, deadline);
      used.push_back(&lane.local);
      used.push_back(&lane.cross);
      ctx_.stats->add(Counter::hierarchical_collectives);
    } else {
      lane.world.check(ncclAllReduce(buf, buf, static_cast<std::size_t>(n), type, nccl_op(op),
                                     lane.world.get(), lane.stream),
                       "ncclAllReduce", deadline);
    }
    copy(lane, fused_segments(layout, r.numels, tensors, buf, es, CopyDirection::unpack), dtype, post);
    if (entries.size() > 1) ctx_.stats->add(Counter::fused_collectives);
  }

  // See Note [Hierarchical parts] in comm/hierarchical.hpp. `op` is never Average here.
  void hierarchical_allreduce_nccl(Lane& lane, void* buf, std::int64_t n, DataType dtype,
                                   ReduceOp op, bool even, const Deadline& deadline) {
    ensure_hierarchy_comms(lane, deadline);
    const HierarchyComms& h = ctx_.hierarchy;
    const ncclDataType_t type = nccl_datatype(dtype);
    const ncclRedOp_t nop = nccl_op(op);
    const std::size_t es = element_size(dtype);
    auto at = [&](std::int64_t elems) { return static_cast<char*>(buf) + elems * static_cast<std::int64_t>(es); };
    const HierarchicalPlan plan = plan_hierarchical(n, h.layout.local_size, h.layout.parts());
    const std::int64_t mine = plan.counts[h.layout.local_rank];
    void* piece = at(plan.displs[h.layout.local_rank]);

    if (h.layout.local_size > 1) {
      if (even) {
        lane.local.check(ncclReduceScatter(buf, piece, static_cast<std::size_t>(mine), type, nop,
                                           lane.local.get(), lane.stream),
                         "ncclReduceScatter", deadline);
      } else {
        ncclGroupStart();
        for (int k = 0; k < h.layout.local_size; ++k)
          if (plan.counts[k] > 0)
            ncclReduce(at(plan.displs[k]), at(plan.displs[k]),
                       static_cast<std::size_t>(plan.counts[k]), type, nop, k, lane.local.get(),
                       lane.stream);
        lane.local.check(ncclGroupEnd(), "ncclReduce (intra-host group)", deadline);
      }
    }
    if (mine > 0 && h.layout.cross_size > 1)
      lane.cross.check(ncclAllReduce(piece, piece, static_cast<std::size_t>(mine), type, nop,
                                     lane.cross.get(), lane.stream),
                       "ncclAllReduce (cross-host)", deadline);
    if (h.layout.local_size > 1) {
      if (even) {
        lane.local.check(ncclAllGather(piece, buf, static_cast<std::size_t>(mine), type,
                                       lane.local.get(), lane.stream),
                         "ncclAllGather", deadline);
      } else {
        ncclGroupStart();
        for (int k = 0; k < h.layout.local_size; ++k)
          if (plan.counts[k] > 0)
            ncclBroadcast(at(plan.displs[k]), at(plan.displs[k]),
                          static_cast<std::size_t>(plan.counts[k]), type, k, lane.local.get(),
                          lane.stream);
        lane.local.check(ncclGroupEnd(), "ncclBroadcast (intra-host group)", deadline);
      }
    }
  }

  // ---- allgather / broadcast ---------------------------------------------------------------------

  void allgather(Lane& lane, const Response& r, Entry* e, const Deadline& deadline) {
    const AllgatherLayout layout = allgather_layout(r);
    const std::vector<std::int64_t>& counts = layout.counts;
    const DataType dtype = r.dtype;
    const std::size_t es = element_size(dtype);
    void* out = e ? e->make_output(layout.out_shape)
                  : lane.scratch.reserve(
                        static_cast<std::size_t>(std::max<std::int64_t>(layout.total, 1)) * es);
    const void* in = e ? e->input : nullptr;
    const auto displs = exclusive_prefix(counts);
    const ncclDataType_t type = nccl_datatype(dtype);
    const bool equal = std::all_of(counts.begin(), counts.end(), [&](auto c) { return c == counts[0]; });
    if (equal) {
      if (counts[0] == 0) return;
      lane.world.check(ncclAllGather(in, out, static_cast<std::size_t>(counts[0]), type,
                                     lane.world.get(), lane.stream),
                       "ncclAllGather", deadline);
      return;
    }
    ncclGroupStart();
    for (int k = 0; k < size_; ++k) {
      if (counts[k] == 0) continue;
      void* slot = static_cast<char*>(out) + displs[k] * static_cast<std::int64_t>(es);
      ncclBroadcast(k == rank_ ? in : slot, slot, static_cast<std::size_t>(counts[k]), type, k,
                    lane.world.get(), lane.stream);
    }
    lane.world.check(ncclGroupEnd(), "ncclBroadcast (allgather of unequal rows)", deadline);
  }

  void broadcast(Lane& lane, const Response& r, Entry* e, const Deadline& deadline) {
    const std::int64_t n = r.numels[0];
    if (n == 0) return;
    void* buf = e ? e->data : lane.scratch.reserve(static_cast<std::size_t>(n) * element_size(r.dtype));
    lane.world.check(ncclBroadcast(buf, buf, static_cast<std::size_t>(n), nccl_datatype(r.dtype),
                                   r.root, lane.world.get(), lane.stream),
                     "ncclBroadcast", deadline);
  }

  // ---- alltoall / reducescatter ------------------------------------------------------------------

  void alltoall(Lane& lane, const Response& r, Entry* e, const Deadline& deadline) {
    AlltoallCounts c =
        exchange_alltoall_counts(*e, size_, ctx_.data_comm, "MPI_Ialltoall (alltoall splits)");
    const auto& send_counts = c.send_counts;
    const auto& recv_counts = c.recv_counts;
    void* out = e->make_output(c.out_shape);
    const auto sd = exclusive_prefix(send_counts), rd = exclusive_prefix(recv_counts);
    const std::size_t es = element_size(r.dtype);
    const ncclDataType_t type = nccl_datatype(r.dtype);
    ncclGroupStart();
    for (int k = 0; k < size_; ++k) {
      if (send_counts[k] > 0)
        ncclSend(static_cast<const char*>(e->input) + sd[k] * static_cast<std::int64_t>(es),
                 static_cast<std::size_t>(send_counts[k]), type, k, lane.world.get(), lane.stream);
      if (recv_counts[k] > 0)
        ncclRecv(static_cast<char*>(out) + rd[k] * static_cast<std::int64_t>(es),
                 static_cast<std::size_t>(recv_counts[k]), type, k, lane.world.get(), lane.stream);
    }
    lane.world.check(ncclGroupEnd(), "ncclSend/ncclRecv (alltoall)", deadline);
    e->set_received_splits(std::move(c.recv_rows));
  }

  void reducescatter(Lane& lane, const Response& r, Entry* e, const Deadline& deadline) {
    const Shape& shape = e->request.shape;
    const std::int64_t rows = shape.empty() ? 1 : shape[0];
    const std::int64_t row = row_numel(shape);
    std::vector<std::int64_t> counts(size_);
    for (int k = 0; k < size_; ++k) counts[k] = (rows / size_ + (k < rows % size_ ? 1 : 0)) * row;
    Shape out_shape = shape.empty() ? Shape{counts[rank_]} : shape;
    out_shape[0] = rows / size_ + (rank_ < rows % size_ ? 1 : 0);
    void* out = e->make_output(out_shape);
    const DataType dtype = r.dtype;
    const std::size_t es = element_size(dtype);
    const std::int64_t n = rows * row;
    if (n == 0) return;
    const void* send = e->input;
    if (r.prescale != 1.0) {
      void* tmp = lane.scratch.reserve(static_cast<std::size_t>(n) * es);
      copy(lane, {{send, tmp, n}}, dtype, r.prescale);
      send = tmp;
    }
    const bool avg = r.reduce_op == ReduceOp::Average && nccl_has_avg() && r.active_ranks == size_;
    const ReduceOp op = avg ? ReduceOp::Average : effective_op(r);
    const double post = avg ? r.postscale : effective_postscale(r);
    const ncclDataType_t type = nccl_datatype(dtype);
    if (rows % size_ == 0) {
      lane.world.check(ncclReduceScatter(send, out, static_cast<std::size_t>(counts[0]), type,
                                         nccl_op(op), lane.world.get(), lane.stream),
                       "ncclReduceScatter", deadline);
    } else {
      const auto displs = exclusive_prefix(counts);
      ncclGroupStart();
      for (int k = 0; k < size_; ++k) {
        if (counts[k] == 0) continue;
        ncclReduce(static_cast<const char*>(send) + displs[k] * static_cast<std::int64_t>(es), out,
                   static_cast<std::size_t>(counts[k]), type, nccl_op(op), k, lane.world.get(),
                   lane.stream);
      }
      lane.world.check(ncclGroupEnd(), "ncclReduce (reducescatter of uneven rows)", deadline);
    }
    if (post != 1.0 && counts[rank_] > 0) copy(lane, {{out, out, counts[rank_]}}, dtype, post);
  }

  BackendContext ctx_;
  int rank_ = 0, size_ = 1;
  int streams_ = 1;
  std::map<int, std::uint64_t> next_stream_;
  std::map<std::pair<int, int>, std::unique_ptr<Lane>> lanes_;
};

}  // namespace dtrain::detail
