#pragma once
// Counters for observing the engine (tests, benchmarks, profiling). Every field only grows.
//
// Note [Engine counters, named once]
// DTRAIN_ENGINE_STATS_FIELDS is the one list of the counters: EngineStats' fields, the names the
// profiler writes into profile files (Note [Engine counters in profiles] in
// profile/records.hpp) and the engine's own atomic counters (runtime/execution/engine_counters.hpp)
// are all made from it, so a new counter is one line here. Fields marked "rank 0" count the
// coordinator's work and are zero on other ranks. dtrain-report shows any counter it finds.
#include <cstddef>
#include <cstdint>
#include <string_view>

// X(name): one counter. The comment after each says what it counts.
#define DTRAIN_ENGINE_STATS_FIELDS(X)                                                          \
  X(collectives)              /* data collectives executed on this rank */                   \
  X(fused_collectives)        /* of which packed several tensors */                          \
  X(bytes_reduced)                                                                            \
  X(buffer_allocations)       /* fusion/scratch buffer (re)allocations */                    \
  X(hierarchical_collectives) /* allreduces run host by host */                              \
  X(gloo_collectives)         /* data collectives whose host tensors went over Gloo */       \
  X(cache_ids_sent)           /* requests this rank sent as response-cache ids */            \
  X(requests_sent)            /* requests this rank sent in any form */                      \
  /* Payload bytes of this rank's completed ops, by kind (its own tensors: inputs for */      \
  /* allgather, alltoall and reducescatter). */                                               \
  X(allreduce_bytes)                                                                          \
  X(allgather_bytes)                                                                          \
  X(broadcast_bytes)                                                                          \
  X(alltoall_bytes)                                                                           \
  X(reducescatter_bytes)                                                                      \
  X(fused_bytes)              /* of those, carried by collectives of several tensors */      \
  X(fused_tensors_executed)   /* tensors carried by such collectives */                      \
  X(negotiation_ns)           /* per op, from its submission to its response, summed */     \
  X(collective_ns)            /* time the engine thread spent executing collectives */       \
  X(engine_cpu_ns)            /* CPU time the engine thread used (Note [Engine CPU time]) */ \
  X(responses)                /* rank 0: collectives emitted */                              \
  X(fused_tensors)            /* rank 0: tensors that shared a response with another */      \
  X(cache_hits)               /* rank 0: requests that arrived as cache ids */               \
  X(stall_warnings)           /* rank 0 */                                                   \
  X(wait_for_slowest_ns)      /* rank 0: per op, first to last rank's submission, summed */

namespace dtrain {

struct EngineStats {
#define DTRAIN_ENGINE_STATS_MEMBER(name) std::uint64_t name = 0;
  DTRAIN_ENGINE_STATS_FIELDS(DTRAIN_ENGINE_STATS_MEMBER)
#undef DTRAIN_ENGINE_STATS_MEMBER
};

namespace detail {

// The counters by position, in the order of the list.
enum class Counter : std::size_t {
#define DTRAIN_ENGINE_STATS_ENUMERATOR(name) name,
  DTRAIN_ENGINE_STATS_FIELDS(DTRAIN_ENGINE_STATS_ENUMERATOR)
#undef DTRAIN_ENGINE_STATS_ENUMERATOR
};

#define DTRAIN_ENGINE_STATS_ONE(name) +1
inline constexpr std::size_t engine_counter_count = 0 DTRAIN_ENGINE_STATS_FIELDS(DTRAIN_ENGINE_STATS_ONE);
#undef DTRAIN_ENGINE_STATS_ONE

// visit(name, Counter, &EngineStats::field) for every counter, in the order of the list.
template <class Visitor>
void for_each_engine_counter(Visitor&& visit) {
#define DTRAIN_ENGINE_STATS_VISIT(name) \
  visit(std::string_view(#name), Counter::name, &EngineStats::name);
  DTRAIN_ENGINE_STATS_FIELDS(DTRAIN_ENGINE_STATS_VISIT)
#undef DTRAIN_ENGINE_STATS_VISIT
}

// `later - earlier`, counter by counter. A counter that went down (the engine was restarted by
// shutdown() and init() between the snapshots) counts from zero.
inline EngineStats engine_stats_delta(const EngineStats& later, const EngineStats& earlier) {
  EngineStats d;
  for_each_engine_counter([&](std::string_view, Counter, auto member) {
    d.*member = later.*member >= earlier.*member ? later.*member - earlier.*member : later.*member;
  });
  return d;
}

}  // namespace detail
}  // namespace dtrain
