#pragma once
// The engine settings the autotuner may change, as one value type; which of them a job lets it
// change; and how they map to and from Config.
#include <fmt/format.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

#include "dtrain/core/config.hpp"
#include "dtrain/core/env.hpp"

namespace dtrain::autotune {

// One setting of every tunable knob. The engine applies a whole Knobs at once, on every rank at
// the same cycle (Note [Configuration generations] in tuner.hpp).
struct Knobs {
  std::int64_t fusion_threshold_bytes = Config{}.fusion_threshold_bytes;
  double cycle_time_ms = Config{}.cycle_time_ms;
  bool hierarchical_allreduce = Config{}.hierarchical_allreduce;
  // Off means a cache capacity of 0; on means the configured capacity (see apply_knobs).
  bool response_cache = Config{}.cache_capacity > 0;
  bool fusion_pipeline = Config{}.fusion_pipeline;

  friend bool operator==(const Knobs&, const Knobs&) = default;
};

enum class Knob : std::uint8_t {
  fusion_threshold,
  cycle_time,
  hierarchical_allreduce,
  response_cache,
  fusion_pipeline,
};

inline constexpr Knob all_knobs[] = {Knob::fusion_threshold, Knob::cycle_time,
                                     Knob::hierarchical_allreduce, Knob::response_cache,
                                     Knob::fusion_pipeline};

// The name used in the tuning log's columns and the saved result: the Config field it sets.
constexpr std::string_view to_string(Knob knob) noexcept {
  switch (knob) {
    case Knob::fusion_threshold: return "fusion_threshold_bytes";
    case Knob::cycle_time: return "cycle_time_ms";
    case Knob::hierarchical_allreduce: return "hierarchical_allreduce";
    case Knob::response_cache: return "response_cache";
    case Knob::fusion_pipeline: return "fusion_pipeline";
  }
  return "unknown";
}

// The variable suffix (after DTRAIN_/HOROVOD_) whose presence fixes the knob.
constexpr std::string_view env_suffix(Knob knob) noexcept {
  switch (knob) {
    case Knob::fusion_threshold: return "FUSION_THRESHOLD";
    case Knob::cycle_time: return "CYCLE_TIME";
    case Knob::hierarchical_allreduce: return "HIERARCHICAL_ALLREDUCE";
    case Knob::response_cache: return "CACHE_CAPACITY";
    case Knob::fusion_pipeline: return "FUSION_PIPELINE";
  }
  return "";
}

constexpr bool is_binary(Knob knob) noexcept {
  return knob != Knob::fusion_threshold && knob != Knob::cycle_time;
}

class KnobSet {
 public:
  constexpr KnobSet() = default;
  constexpr KnobSet(std::initializer_list<Knob> knobs) {
    for (Knob k : knobs) insert(k);
  }
  constexpr bool contains(Knob k) const noexcept { return (bits_ & bit(k)) != 0; }
  constexpr void insert(Knob k) noexcept { bits_ |= bit(k); }
  constexpr bool empty() const noexcept { return bits_ == 0; }
  friend constexpr bool operator==(KnobSet, KnobSet) = default;

 private:
  static constexpr unsigned bit(Knob k) noexcept { return 1u << static_cast<unsigned>(k); }
  unsigned bits_ = 0;
};

// The binary knobs read as 0/1 and the numbers as {fmt}'s shortest round-trip form, so the
// tuning log and the saved result can be parsed back exactly.
inline std::string knob_value_text(const Knobs& k, Knob knob) {
  switch (knob) {
    case Knob::fusion_threshold: return fmt::format("{}", k.fusion_threshold_bytes);
    case Knob::cycle_time: return fmt::format("{}", k.cycle_time_ms);
    case Knob::hierarchical_allreduce: return k.hierarchical_allreduce ? "1" : "0";
    case Knob::response_cache: return k.response_cache ? "1" : "0";
    case Knob::fusion_pipeline: return k.fusion_pipeline ? "1" : "0";
  }
  return "";
}

// For messages: "fusion threshold 64 MiB, cycle time 2.5 ms, hierarchical allreduce off, ...".
inline std::string describe(const Knobs& k) {
  const double mib = static_cast<double>(k.fusion_threshold_bytes) / (1 << 20);
  return fmt::format(
      "fusion threshold {:.4g} MiB, cycle time {:.4g} ms, hierarchical allreduce {}, response "
      "cache {}, fusion pipeline {}",
      mib, k.cycle_time_ms, k.hierarchical_allreduce ? "on" : "off",
      k.response_cache ? "on" : "off", k.fusion_pipeline ? "on" : "off");
}

inline Knobs knobs_from_config(const Config& c) {
  return Knobs{c.fusion_threshold_bytes, c.cycle_time_ms, c.hierarchical_allreduce,
               c.cache_capacity > 0, c.fusion_pipeline};
}

// The configuration to run with these knobs. A response cache switched on keeps the configured
// capacity, or the default one where the configured capacity was 0.
inline Config apply_knobs(Config c, const Knobs& k) {
  c.fusion_threshold_bytes = k.fusion_threshold_bytes;
  c.cycle_time_ms = k.cycle_time_ms;
  c.hierarchical_allreduce = k.hierarchical_allreduce;
  if (!k.response_cache) {
    c.cache_capacity = 0;
  } else if (c.cache_capacity == 0) {
    c.cache_capacity = Config{}.cache_capacity;
  }
  c.fusion_pipeline = k.fusion_pipeline;
  return c;
}

// Note [Knobs the user set]
// A knob the user chose stays as chosen: the tuner only searches the others. A knob counts as
// chosen when its variable is set (DTRAIN_ or HOROVOD_ spelling, as Horovod does) or when its
// Config field differs from the default (set in code before init(config)). A field set in code
// to exactly its default value cannot be told apart from an untouched one and is tuned.
inline KnobSet knobs_set_by_user(const Config& c, const dtrain::detail::EnvSource& env) {
  const Knobs defaults;
  const Knobs current = knobs_from_config(c);
  KnobSet set;
  for (Knob knob : all_knobs) {
    if (dtrain::detail::lookup_env(env, env_suffix(knob)).chosen ||
        knob_value_text(current, knob) != knob_value_text(defaults, knob)) {
      set.insert(knob);
    }
  }
  // A capacity other than the default is a choice even where it leaves the cache on.
  if (c.cache_capacity != Config{}.cache_capacity) set.insert(Knob::response_cache);
  return set;
}

}  // namespace dtrain::autotune
