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

struct CoordinatorOptions {
  int size = 1;
  std::int64_t fusion_threshold_bytes = 134217728;
  double cycle_time_ms = 1.0;
  std::int64_t cache_capacity = 1024;
  bool stall_check_disable = false;
  double stall_check_time_seconds = 60;
  double stall_shutdown_time_seconds = 0;
  double op_timeout_seconds = 600;  // 0: none (Note [Failed ops])

  // The options `config` sets, for a world of `size` ranks (the world is not a setting).
  static CoordinatorOptions from(const Config& config, int size) {
    CoordinatorOptions o;
    o.size = size;
    o.fusion_threshold_bytes = config.fusion_threshold_bytes;
    o.cycle_time_ms = config.cycle_time_ms;
    o.cache_capacity = config.cache_capacity;
    o.stall_check_disable = config.stall_check_disable;
    o.stall_check_time_seconds = config.stall_check_time_seconds;
    o.stall_shutdown_time_seconds = config.stall_shutdown_time_seconds;
    o.op_timeout_seconds = config.op_timeout_seconds;
    return o;
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
