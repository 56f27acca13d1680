#pragma once
// The engine's counters as the profiler records them: per-step differences of the cumulative
// dtrain::engine_stats() snapshot.
//
// Note [Engine counters in profiles]
// Every EngineStats field is a counter that only grows, so a step's share is the difference of
// two snapshots. The list below is the one place that names them in profile files; a field the
// engine adds is recorded by adding one line here, and dtrain-report shows any counter it finds
// (it reads the names from the file, and knows the meaning of those it uses in its rules).
// Fields marked "rank 0" count the coordinator's work and are zero on other ranks.
#include <cstdint>
#include <string_view>

#include "dtrain/runtime/engine_stats.hpp"

namespace dtrain::detail {

template <class Visitor>
void for_each_engine_counter(Visitor&& visit) {
  visit(std::string_view("collectives"), &EngineStats::collectives);
  visit(std::string_view("fused_collectives"), &EngineStats::fused_collectives);
  visit(std::string_view("bytes_reduced"), &EngineStats::bytes_reduced);
  visit(std::string_view("buffer_allocations"), &EngineStats::buffer_allocations);
  visit(std::string_view("hierarchical_collectives"), &EngineStats::hierarchical_collectives);
  visit(std::string_view("cache_ids_sent"), &EngineStats::cache_ids_sent);
  visit(std::string_view("requests_sent"), &EngineStats::requests_sent);
  visit(std::string_view("allreduce_bytes"), &EngineStats::allreduce_bytes);
  visit(std::string_view("allgather_bytes"), &EngineStats::allgather_bytes);
  visit(std::string_view("broadcast_bytes"), &EngineStats::broadcast_bytes);
  visit(std::string_view("alltoall_bytes"), &EngineStats::alltoall_bytes);
  visit(std::string_view("reducescatter_bytes"), &EngineStats::reducescatter_bytes);
  visit(std::string_view("fused_bytes"), &EngineStats::fused_bytes);
  visit(std::string_view("fused_tensors_executed"), &EngineStats::fused_tensors_executed);
  visit(std::string_view("negotiation_ns"), &EngineStats::negotiation_ns);
  visit(std::string_view("collective_ns"), &EngineStats::collective_ns);
  visit(std::string_view("responses"), &EngineStats::responses);            // rank 0
  visit(std::string_view("fused_tensors"), &EngineStats::fused_tensors);    // rank 0
  visit(std::string_view("cache_hits"), &EngineStats::cache_hits);          // rank 0
  visit(std::string_view("stall_warnings"), &EngineStats::stall_warnings);  // rank 0
  visit(std::string_view("wait_for_slowest_ns"), &EngineStats::wait_for_slowest_ns);  // rank 0
}

// `later - earlier`, counter by counter. A counter that went down (the engine was restarted by
// shutdown() and init() between the snapshots) counts from zero.
inline EngineStats engine_stats_delta(const EngineStats& later, const EngineStats& earlier) {
  EngineStats d;
  for_each_engine_counter([&](std::string_view, auto member) {
    d.*member = later.*member >= earlier.*member ? later.*member - earlier.*member : later.*member;
  });
  return d;
}

}  // namespace dtrain::detail
