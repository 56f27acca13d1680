#pragma once
// How device tensors travel between ranks: NCCL (cuda/nccl_backend.hpp) or pinned host staging
// over MPI (cuda/staging_backend.hpp). The device backend (cuda/backend.hpp) chooses one at the
// first device op and sends every device response through it.
#include <cuda_runtime.h>

#include <algorithm>
#include <span>
#include <vector>

#include <fmt/format.h>

#include "dtrain/cuda/error.hpp"
#include "dtrain/runtime/execution/backend.hpp"

namespace dtrain::detail {

class DeviceTransport {
 public:
  virtual ~DeviceTransport() = default;
  // Runs `response` on this rank's GPU `device`; entries as in Backend::execute.
  virtual void execute(const Response& response, std::span<Entry* const> entries, int device) = 0;
};

// Orders `stream` after the work queued so far on every entry's producer stream
// (Note [Device stream ordering] in cuda/nccl_backend.hpp).
inline void order_after_producers(cudaStream_t stream, cudaEvent_t scratch_event,
                                  std::span<Entry* const> entries) {
  std::vector<cudaStream_t> seen;
  for (Entry* e : entries) {
    if (!e) continue;
    cudaStream_t producer = e->stream ? static_cast<cudaStream_t>(e->stream) : cudaStreamLegacy;
    if (std::find(seen.begin(), seen.end(), producer) != seen.end()) continue;
    seen.push_back(producer);
    // Re-recording is safe: cudaStreamWaitEvent captures the event's state at the call.
    cuda_check(cudaEventRecord(scratch_event, producer),
               fmt::format("cudaEventRecord on the producer stream of '{}'", e->request.name));
    cuda_check(cudaStreamWaitEvent(stream, scratch_event, 0), "cudaStreamWaitEvent");
  }
}

}  // namespace dtrain::detail
