#pragma once
// Counters for observing the engine (tests, benchmarks, profiling: Note [Engine counters in
// profiles] in profile/engine_counters.hpp). Every field only grows.
#include <cstdint>

namespace dtrain {

struct EngineStats {
  std::uint64_t collectives = 0;        // data collectives executed on this rank
  std::uint64_t fused_collectives = 0;  // of which packed several tensors
  std::uint64_t bytes_reduced = 0;
  std::uint64_t buffer_allocations = 0; // fusion/scratch buffer (re)allocations
  std::uint64_t hierarchical_collectives = 0;  // allreduces run host by host
  std::uint64_t cache_ids_sent = 0;     // requests this rank sent as response-cache ids
  std::uint64_t requests_sent = 0;      // requests this rank sent in any form
  // Payload bytes of this rank's completed ops, by kind (its own tensors: inputs for allgather,
  // alltoall and reducescatter).
  std::uint64_t allreduce_bytes = 0;
  std::uint64_t allgather_bytes = 0;
  std::uint64_t broadcast_bytes = 0;
  std::uint64_t alltoall_bytes = 0;
  std::uint64_t reducescatter_bytes = 0;
  std::uint64_t fused_bytes = 0;             // of those, carried by collectives of several tensors
  std::uint64_t fused_tensors_executed = 0;  // tensors carried by such collectives
  std::uint64_t negotiation_ns = 0;  // per op, from its submission to its response, summed
  std::uint64_t collective_ns = 0;   // time the engine thread spent executing collectives
  // Coordinator view (rank 0 only; zero elsewhere):
  std::uint64_t responses = 0;
  std::uint64_t fused_tensors = 0;
  std::uint64_t cache_hits = 0;
  std::uint64_t stall_warnings = 0;
  std::uint64_t wait_for_slowest_ns = 0;  // per op, first to last rank's submission, summed
};

}  // namespace dtrain
