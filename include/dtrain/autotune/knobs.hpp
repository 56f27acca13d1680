#pragma once
// The engine settings the autotuner may change, as one value type; which of them a job lets it
// change; and how they map to and from Config.
#include <fmt/format.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "dtrain/core/config.hpp"
#include "dtrain/core/config_knobs.hpp"
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
  // Pieces of one host reduction posted before the first completes (Note [Pieces in flight]).
  int pieces_in_flight = Config{}.mpi_pieces_in_flight;

  friend bool operator==(const Knobs&, const Knobs&) = default;
};

enum class Knob : std::uint8_t {
  fusion_threshold,
  cycle_time,
  hierarchical_allreduce,
  response_cache,
  fusion_pipeline,
  pieces_in_flight,
};

inline constexpr Knob all_knobs[] = {Knob::fusion_threshold,       Knob::cycle_time,
                                     Knob::hierarchical_allreduce, Knob::response_cache,
                                     Knob::fusion_pipeline,        Knob::pieces_in_flight};

// The member `member` of Config's. `&Config::cycle_time_ms` names the member of the settings
// struct that declares it (Note [Settings by component]); env_suffix() compares member
// pointers by type, so the table below gives them all as Config's.
template <class T, class Settings>
constexpr T Config::*config_member(T Settings::*member) noexcept {
  return member;
}

// Note [Tunable knobs]
// Each tunable knob is named once, here: its id, its name in the tuning log's columns and the
// saved result, the Knobs member that holds its value and the Config setting it changes. The
// variable that fixes a knob (Note [Knobs the user set]) is that setting's, from the knob table of
// core/config_knobs.hpp; whether a knob is binary follows from its member's type. The search
// space (search_space.hpp) adds the ranges of the continuous ones. A new knob is a member of
// Knobs, an id, and a row here.
template <class Visitor>
constexpr void for_each_tunable(Visitor&& visit) {
  visit(Knob::fusion_threshold, std::string_view("fusion_threshold_bytes"),
        &Knobs::fusion_threshold_bytes, config_member(&Config::fusion_threshold_bytes));
  visit(Knob::cycle_time, std::string_view("cycle_time_ms"), &Knobs::cycle_time_ms,
        config_member(&Config::cycle_time_ms));
  visit(Knob::hierarchical_allreduce, std::string_view("hierarchical_allreduce"),
        &Knobs::hierarchical_allreduce, config_member(&Config::hierarchical_allreduce));
  // On means the configured cache capacity, off a capacity of 0 (apply_knobs).
  visit(Knob::response_cache, std::string_view("response_cache"), &Knobs::response_cache,
        config_member(&Config::cache_capacity));
  visit(Knob::fusion_pipeline, std::string_view("fusion_pipeline"), &Knobs::fusion_pipeline,
        config_member(&Config::fusion_pipeline));
  visit(Knob::pieces_in_flight, std::string_view("mpi_pieces_in_flight"),
        &Knobs::pieces_in_flight, config_member(&Config::mpi_pieces_in_flight));
}

// Calls `f(name, knobs_member, config_member)` for the row of `knob`.
template <class F>
constexpr void with_tunable(Knob knob, F&& f) {
  for_each_tunable([&](Knob id, std::string_view name, auto member, auto setting) {
    if (id == knob) f(name, member, setting);
  });
}

// The name used in the tuning log's columns and the saved result.
constexpr std::string_view to_string(Knob knob) noexcept {
  std::string_view out = "unknown";
  with_tunable(knob, [&](std::string_view name, auto, auto) { out = name; });
  return out;
}

// The variable suffix (after DTRAIN_/HOROVOD_) whose presence fixes the knob.
inline std::string_view env_suffix(Knob knob) noexcept {
  std::string_view out;
  with_tunable(knob, [&](std::string_view, auto, auto setting) {
    using Setting = decltype(setting);  // named here: inside the inner lambda, GCC 12 gets it wrong
    dtrain::detail::for_each_knob([&](const auto& config_knob) {
      if constexpr (std::is_same_v<std::remove_cvref_t<decltype(config_knob.member)>, Setting>)
        if (config_knob.member == setting) out = config_knob.suffix;
    });
  });
  return out;
}

constexpr bool is_binary(Knob knob) noexcept {
  bool binary = false;
  with_tunable(knob, [&](std::string_view, auto member, auto) {
    binary = std::is_same_v<std::remove_cvref_t<decltype(Knobs{}.*member)>, bool>;
  });
  return binary;
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
  std::string out;
  with_tunable(knob, [&](std::string_view, auto member, auto) {
    if constexpr (std::is_same_v<std::remove_cvref_t<decltype(std::declval<const Knobs&>().*member)>,
                                 bool>)
      out = k.*member ? "1" : "0";
    else
      out = fmt::format("{}", k.*member);
  });
  return out;
}

// For messages: "fusion threshold 64 MiB, cycle time 2.5 ms, hierarchical allreduce off, ...".
inline std::string describe(const Knobs& k) {
  const double mib = static_cast<double>(k.fusion_threshold_bytes) / (1 << 20);
  return fmt::format(
      "fusion threshold {:.4g} MiB, cycle time {:.4g} ms, hierarchical allreduce {}, response "
      "cache {}, fusion pipeline {}, {} piece{} in flight",
      mib, k.cycle_time_ms, k.hierarchical_allreduce ? "on" : "off",
      k.response_cache ? "on" : "off", k.fusion_pipeline ? "on" : "off", k.pieces_in_flight,
      k.pieces_in_flight == 1 ? "" : "s");
}

inline Knobs knobs_from_config(const Config& c) {
  Knobs k;
  for_each_tunable([&](Knob, std::string_view, auto member, auto setting) {
    using Value = std::remove_cvref_t<decltype(std::declval<Knobs&>().*member)>;
    if constexpr (std::is_same_v<Value, bool> &&
                  !std::is_same_v<std::remove_cvref_t<decltype(std::declval<const Config&>().*setting)>,
                                   bool>)
      k.*member = c.*setting > 0;  // a capacity: on when above 0
    else
      k.*member = static_cast<Value>(c.*setting);
  });
  return k;
}

// The configuration to run with these knobs. A response cache switched on keeps the configured
// capacity, or the default one where the configured capacity was 0.
inline Config apply_knobs(Config c, const Knobs& k) {
  for_each_tunable([&](Knob, std::string_view, auto member, auto setting) {
    using Setting = std::remove_cvref_t<decltype(std::declval<Config&>().*setting)>;
    if constexpr (std::is_same_v<std::remove_cvref_t<decltype(std::declval<const Knobs&>().*member)>,
                                 bool> &&
                  !std::is_same_v<Setting, bool>) {
      if (!(k.*member)) c.*setting = 0;
      else if (c.*setting == 0) c.*setting = Config{}.*setting;
    } else {
      c.*setting = static_cast<Setting>(k.*member);
    }
  });
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
