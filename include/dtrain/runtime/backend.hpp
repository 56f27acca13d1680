#pragma once
// What executes a negotiated response: the Backend interface, the context the engine hands a
// device backend, the counters backends keep, and the rules every backend applies to a response
// (Average as Sum with a folded postscale).
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>

#include "dtrain/comm/hierarchical.hpp"
#include "dtrain/core/config.hpp"
#include "dtrain/runtime/entry.hpp"
#include "dtrain/runtime/timeline.hpp"

namespace dtrain::detail {

// Executes responses for one kind of memory. entries[i] is this rank's entry for
// response.names[i], or nullptr when this rank joined and contributes nothing of its own.
// `arrival`: when the response reached this rank (the end of the ops' queueing on the timeline).
class Backend {
 public:
  virtual ~Backend() = default;
  virtual void execute(const Response& response, std::span<Entry* const> entries,
                       std::chrono::steady_clock::time_point arrival) = 0;
};

struct BackendStats {
  std::atomic<std::uint64_t> collectives{0};      // data collectives executed (fused count as one)
  std::atomic<std::uint64_t> fused_collectives{0};
  std::atomic<std::uint64_t> bytes_reduced{0};
  std::atomic<std::uint64_t> buffer_allocations{0};
  std::atomic<std::uint64_t> hierarchical_collectives{0};  // allreduces run host by host
};

// Average becomes Sum with the division folded into the postscale.
inline double effective_postscale(const Response& r) {
  return r.reduce_op == ReduceOp::Average ? r.postscale / std::max(1, r.active_ranks) : r.postscale;
}
inline ReduceOp effective_op(const Response& r) {
  return r.reduce_op == ReduceOp::Average ? ReduceOp::Sum : r.reduce_op;
}

// What the engine hands a device backend: the data communicator (shared with the host backend;
// both run on the engine thread), the host hierarchy (engine-owned duplicates of the topology's
// communicators; invalid when the engine has no topology), counters, and the timeline (rank 0).
struct BackendContext {
  const Config* config = nullptr;
  MPI_Comm data_comm = MPI_COMM_NULL;
  HierarchyComms hierarchy;
  BackendStats* stats = nullptr;
  Timeline* timeline = nullptr;
};

// A device backend (CUDA/NCCL or staging) registers a factory here when its header is included.
using DeviceBackendFactory = std::unique_ptr<Backend> (*)(const BackendContext&);
inline DeviceBackendFactory& device_backend_factory() noexcept {
  static DeviceBackendFactory f = nullptr;
  return f;
}

}  // namespace dtrain::detail
