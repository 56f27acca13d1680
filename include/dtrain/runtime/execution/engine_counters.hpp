#pragma once
// The engine's counters as it keeps them: one relaxed atomic per EngineStats field (Note [Engine
// counters, named once] in runtime/engine_stats.hpp), bumped by the engine thread and the
// backends, read by any thread through snapshot().
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "dtrain/runtime/engine_stats.hpp"

namespace dtrain::detail {

class EngineCounters {
 public:
  void add(Counter c, std::uint64_t n = 1) noexcept {
    values_[index(c)].fetch_add(n, std::memory_order_relaxed);
  }
  // For counters whose value is kept elsewhere (the coordinator's, the host buffers').
  void set(Counter c, std::uint64_t n) noexcept {
    values_[index(c)].store(n, std::memory_order_relaxed);
  }
  std::uint64_t get(Counter c) const noexcept {
    return values_[index(c)].load(std::memory_order_relaxed);
  }

  EngineStats snapshot() const noexcept {
    EngineStats s;
    for_each_engine_counter([&](std::string_view, Counter c, auto member) { s.*member = get(c); });
    return s;
  }

 private:
  static constexpr std::size_t index(Counter c) noexcept { return static_cast<std::size_t>(c); }
  std::array<std::atomic<std::uint64_t>, engine_counter_count> values_{};
};

}  // namespace dtrain::detail
