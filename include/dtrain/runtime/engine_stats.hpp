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
  // Coordinator view (rank 0 only; zero elsewhere):
  std::uint64_t responses = 0;
  std::uint64_t fused_tensors = 0;
  std::uint64_t cache_hits = 0;
  std::uint64_t stall_warnings = 0;
};

}  // namespace dtrain
