#pragma once
// What a Coordinator (runtime/negotiation/coordinator.hpp) is built from, its options and its
// observers' hooks, and the counters it keeps.
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

#include "dtrain/core/config.hpp"
#include "dtrain/runtime/negotiation/messages.hpp"

namespace dtrain::detail {

// The clock of every time point the coordinator takes and gives.
using Clock = std::chrono::steady_clock;

// The settings the coordinator reads, whole (Note [Settings by component] in core/config.hpp);
// op_timeout_seconds fails ops that outlive it (Note [Failed ops]).
struct CoordinatorOptions : NegotiationSettings, DeadlineSettings {
  int size = 1;  // of the world, which is not a setting

  static CoordinatorOptions from(const Config& config, int size) {
    return CoordinatorOptions{config, config, size};
  }
};

struct CoordinatorStats {
  std::uint64_t responses = 0;         // collectives emitted
  std::uint64_t fused_tensors = 0;     // tensors that shared a response with another
  std::uint64_t cache_hits = 0;        // requests that arrived as cache ids
  std::uint64_t requests = 0;          // requests received, in either form
  std::uint64_t stall_warnings = 0;
  // Per op, from the first rank's submission reaching the coordinator to the last one's: how long
  // the fastest rank waited for the slowest, summed over ops.
  std::uint64_t wait_for_slowest_ns = 0;
};

// Hooks for observers (timeline, logging); all optional.
struct CoordinatorHooks {
  std::function<void(const std::string& name, int rank, Clock::time_point when)> rank_ready;
  // `started`: when the first rank submitted it.
  std::function<void(const std::string& name, OpKind kind, Clock::time_point started,
                     Clock::time_point when)>
      negotiated;
  std::function<void(const std::string& report)> stall_warning;
};

}  // namespace dtrain::detail
