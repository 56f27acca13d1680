#pragma once
// The phases of a training step that the profiler times, and their names in profile files.
#include <array>
#include <cstddef>
#include <optional>
#include <string_view>

namespace dtrain {

// What a step is made of. `communication_wait` is the time the training thread blocks on
// gradient exchange (handles, DistributedOptimizer::synchronize), not the time the engine spends
// communicating in the background: overlapped communication costs the step nothing.
enum class Phase { data, forward, backward, communication_wait, optimizer };

inline constexpr std::size_t standard_phase_count = 5;

constexpr std::string_view to_string(Phase phase) noexcept {
  switch (phase) {
    case Phase::data: return "data";
    case Phase::forward: return "forward";
    case Phase::backward: return "backward";
    case Phase::communication_wait: return "communication_wait";
    case Phase::optimizer: return "optimizer";
  }
  return "unknown";
}

inline constexpr std::array<Phase, standard_phase_count> standard_phases = {
    Phase::data, Phase::forward, Phase::backward, Phase::communication_wait, Phase::optimizer};

// A user-named phase spelled like a standard one is that standard phase.
constexpr std::optional<Phase> standard_phase_named(std::string_view name) noexcept {
  for (Phase p : standard_phases)
    if (to_string(p) == name) return p;
  return std::nullopt;
}

}  // namespace dtrain
