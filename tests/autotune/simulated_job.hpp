#pragma once
// A synthetic data-parallel job where the engine's knobs matter, for driving the tuner without an
// engine: a model with many small gradients, produced one after another during backward, reduced
// by an engine that wakes every cycle, fuses what is ready up to the fusion threshold and runs
// one collective per fused buffer on a single link. Costs are of the order measured on the 2-core
// machines (docs/performance.md): a per-collective latency, a bandwidth that falls for messages
// over 32 MiB (MPICH's per-call scratch allocation), copies into and out of the fusion buffer
// (hidden by the fusion pipeline except for its first piece), and negotiation per cycle that the
// response cache makes cheaper per tensor.
//
// So: a small threshold or a short cycle makes many small collectives (latency-bound); a long
// cycle holds gradients back and leaves a tail after backward; a huge threshold with a long cycle
// makes messages that hit the slow large-message path. The best configuration is interior.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "dtrain/autotune/knobs.hpp"

namespace dtrain::autotune::test {

struct SimulatedJob {
  std::vector<std::int64_t> gradient_bytes;  // in the order backward produces them
  double forward_ms = 60.0;
  double backward_ms = 120.0;
  double optimizer_ms = 5.0;
  double latency_ms = 0.3;               // per collective
  double bandwidth_bytes_per_ms = 2e6;   // 2 GB/s
  double large_message_bytes = 32.0 * (1 << 20);
  double large_bandwidth_bytes_per_ms = 0.5e6;
  double copy_bytes_per_ms = 2e6;        // into and out of the fusion buffer together
  double pipeline_piece_bytes = 4.0 * (1 << 20);
  double negotiation_ms = 0.1;           // per cycle with work
  double per_tensor_ms_uncached = 0.03;
  double per_tensor_ms_cached = 0.003;
  double collective_cpu_ms = 0.5;        // CPU a collective takes from compute

  // 400 gradients, ~100 MB: 320 small ones of 16-256 KiB, and 80 of 1-1.75 MiB.
  static SimulatedJob many_small_tensors() {
    SimulatedJob job;
    for (int i = 0; i < 400; ++i) {
      const std::int64_t bytes = i % 5 == 4 ? (std::int64_t{1} << 20) * (4 + i % 4) / 4
                                            : std::int64_t{16384} << (i % 5);
      job.gradient_bytes.push_back(bytes);
    }
    return job;
  }

  std::int64_t total_bytes() const {
    std::int64_t s = 0;
    for (std::int64_t b : gradient_bytes) s += b;
    return s;
  }

  double collective_ms(double bytes, int tensors, bool pipeline) const {
    const double bw = bytes > large_message_bytes ? large_bandwidth_bytes_per_ms : bandwidth_bytes_per_ms;
    double ms = latency_ms + bytes / bw;
    if (tensors > 1) ms += (pipeline ? std::min(bytes, pipeline_piece_bytes) : bytes) / copy_bytes_per_ms;
    return ms;
  }

  // Wall time of one training step, without noise. The engine thread wakes, negotiates the
  // gradients ready by then, runs their collectives, and wakes again one cycle after it last
  // woke, or at once if the work took longer than that. Each wake with work and each collective
  // also take CPU from backward (ranks share cores), delaying the gradients not yet produced.
  double step_ms(const Knobs& k) const {
    const std::size_t n = gradient_bytes.size();
    const double interval = backward_ms / static_cast<double>(n);
    double stall = 0.0;  // CPU taken from backward so far
    auto ready_at = [&](std::size_t i) {
      return forward_ms + interval * static_cast<double>(i + 1) + stall;
    };
    const double cycle = std::max(k.cycle_time_ms, 1e-3);
    const double per_tensor = k.response_cache ? per_tensor_ms_cached : per_tensor_ms_uncached;
    std::size_t next = 0;  // first gradient not yet reduced
    double now = 0.0;      // when the engine wakes
    while (next < n) {
      if (ready_at(next) > now) {  // idle: sleep whole cycles until the next gradient is ready
        now += cycle * std::ceil((ready_at(next) - now) / cycle);
      }
      std::size_t ready = next;
      while (ready < n && ready_at(ready) <= now) ++ready;
      if (ready == next) {
        now += cycle;  // rounding put the wake-up a hair early
        continue;
      }
      const double negotiation = negotiation_ms + per_tensor * static_cast<double>(ready - next);
      double t = now + negotiation;
      int collectives = 0;
      // Fuse in order up to the threshold; a gradient larger than it goes alone.
      while (next < ready) {
        double bytes = 0.0;
        int tensors = 0;
        while (next < ready &&
               (tensors == 0 || bytes + static_cast<double>(gradient_bytes[next]) <=
                                    static_cast<double>(k.fusion_threshold_bytes))) {
          bytes += static_cast<double>(gradient_bytes[next++]);
          ++tensors;
        }
        t += collective_ms(bytes, tensors, k.fusion_pipeline);
        ++collectives;
      }
      stall += negotiation + collective_cpu_ms * collectives;
      now = std::max(now + cycle, t);
    }
    return std::max(now, ready_at(n - 1)) + optimizer_ms;
  }

  double bytes_per_second(const Knobs& k) const {
    return static_cast<double>(total_bytes()) / (step_ms(k) / 1000.0);
  }
};

}  // namespace dtrain::autotune::test
