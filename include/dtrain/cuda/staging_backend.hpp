#pragma once
// Device tensors over MPI through pinned host memory: used when NCCL cannot serve the job (ranks
// sharing a GPU, an NCCL library older than 2.14) or when asked for
// (dtrain::cuda::set_transport(Transport::staging)). Correct for every op, slower than NCCL.
//
// Each response: the copy stream waits on the producers' streams (events, as with NCCL), copies
// every input to one pinned buffer, and the engine thread waits for those copies. The host
// backend then runs the very same MPI collective it runs for host tensors (fusion, hierarchical
// allreduce and joined ranks included) on the pinned copies, and the results are copied back to
// the device (outputs are allocated there with the tensor's own allocator). The op completes once
// the copies back have completed on the device.
#include <mpi.h>
#include <cuda_runtime.h>

#include <functional>
#include <map>
#include <memory>
#include <vector>

#include <fmt/format.h>

#include "dtrain/cuda/device.hpp"
#include "dtrain/cuda/nccl_comm.hpp"
#include "dtrain/cuda/transport.hpp"
#include "dtrain/runtime/execution/host_backend.hpp"

namespace dtrain::detail {

class StagingBackend final : public DeviceTransport {
 public:
  explicit StagingBackend(const BackendContext& ctx) : ctx_(ctx), host_(host_options(ctx)) {}

  ~StagingBackend() override {
    for (auto& [device, c] : copy_) {
      cudaSetDevice(device);
      if (c.stream) cudaStreamDestroy(c.stream);
      if (c.ready) cudaEventDestroy(c.ready);
      if (c.done) cudaEventDestroy(c.done);
    }
  }

  void execute(const Response& r, std::span<Entry* const> entries, int device) override {
    DeviceGuard guard(device);
    const Deadline deadline = Deadline::after(ctx_.op_timeout_seconds, ctx_.own_pauses);
    CopyLane& lane = lane_for(device);
    order_after_producers(lane.stream, lane.ready, entries);
    const std::string what = fmt::format("staging copies for {} '{}'", r.kind,
                                         r.names.empty() ? "" : r.names.front());

    // Device -> pinned host: every input, back to back (64-byte aligned for the host kernels).
    const std::size_t es = element_size(r.dtype);
    std::vector<std::size_t> offsets(entries.size(), 0);
    std::size_t total = 0;
    for (std::size_t i = 0; i < entries.size(); ++i) {
      offsets[i] = total;
      if (entries[i]) total += (static_cast<std::size_t>(entries[i]->request.numel()) * es + 63) / 64 * 64;
    }
    char* staged = static_cast<char*>(in_.reserve(std::max<std::size_t>(total, 64)));
    for (std::size_t i = 0; i < entries.size(); ++i) {
      Entry* e = entries[i];
      if (!e) continue;
      const std::size_t bytes = static_cast<std::size_t>(e->request.numel()) * es;
      const void* src = in_place(r.kind) ? e->data : e->input;
      if (bytes > 0)
        cuda_check(cudaMemcpyAsync(staged + offsets[i], src, bytes, cudaMemcpyDeviceToHost, lane.stream),
                   "cudaMemcpyAsync (device to pinned host)");
    }
    cuda_check(cudaEventRecord(lane.done, lane.stream), "cudaEventRecord");
    wait_for_device(lane.done, {}, deadline, what);

    // The host collective on the pinned copies.
    std::vector<Entry> host_entries(entries.size());
    std::vector<Entry*> host_ptrs(entries.size(), nullptr);
    Shape out_shape;
    void* out_host = nullptr;
    for (std::size_t i = 0; i < entries.size(); ++i) {
      Entry* e = entries[i];
      if (!e) continue;
      Entry& h = host_entries[i];
      h.request = e->request;
      h.data = staged + offsets[i];
      h.input = staged + offsets[i];
      h.splits = e->splits;
      h.set_received_splits = e->set_received_splits;
      h.make_output = [&, es](const Shape& s) -> void* {
        out_shape = s;
        out_host = out_.reserve(std::max<std::size_t>(static_cast<std::size_t>(numel(s)) * es, 64));
        return out_host;
      };
      h.state = e->state;
      host_ptrs[i] = &h;
    }
    // The staged copies are what the host collective waited for.
    host_.execute(r, host_ptrs, std::chrono::steady_clock::now());

    // Pinned host -> device.
    for (std::size_t i = 0; i < entries.size(); ++i) {
      Entry* e = entries[i];
      if (!e) continue;
      if (in_place(r.kind)) {
        const std::size_t bytes = static_cast<std::size_t>(e->request.numel()) * es;
        if (bytes > 0)
          cuda_check(cudaMemcpyAsync(e->data, staged + offsets[i], bytes, cudaMemcpyHostToDevice,
                                     lane.stream),
                     "cudaMemcpyAsync (pinned host to device)");
      } else if (out_host) {
        void* out = e->make_output(out_shape);
        const std::size_t bytes = static_cast<std::size_t>(numel(out_shape)) * es;
        if (bytes > 0)
          cuda_check(cudaMemcpyAsync(out, out_host, bytes, cudaMemcpyHostToDevice, lane.stream),
                     "cudaMemcpyAsync (pinned host to device)");
      }
    }
    cuda_check(cudaEventRecord(lane.done, lane.stream), "cudaEventRecord");
    wait_for_device(lane.done, {}, deadline, what);
  }

 private:
  struct CopyLane {
    cudaStream_t stream = nullptr;
    cudaEvent_t ready = nullptr;
    cudaEvent_t done = nullptr;
  };

  static bool in_place(OpKind k) noexcept {
    return k == OpKind::allreduce || k == OpKind::broadcast;
  }

  static HostBackend::Options host_options(const BackendContext& ctx) {
    HostBackend::Options o;
    o.comm = ctx.data_comm;
    o.settings = *ctx.config;
    o.timeline = ctx.timeline;
    o.stats = ctx.stats;
    o.hierarchy = ctx.hierarchy;
    o.wait = data_wait(*ctx.config, ctx.hierarchy);
    return o;
  }

  CopyLane& lane_for(int device) {
    auto [it, fresh] = copy_.try_emplace(device);
    if (fresh) {
      cuda_check(cudaStreamCreateWithFlags(&it->second.stream, cudaStreamNonBlocking),
                 "cudaStreamCreate");
      cuda_check(cudaEventCreateWithFlags(&it->second.ready, cudaEventDisableTiming),
                 "cudaEventCreate");
      cuda_check(cudaEventCreateWithFlags(&it->second.done, cudaEventDisableTiming),
                 "cudaEventCreate");
    }
    return it->second;
  }

  BackendContext ctx_;
  HostBackend host_;
  PinnedBuffer in_;
  PinnedBuffer out_;
  std::map<int, CopyLane> copy_;
};

}  // namespace dtrain::detail
