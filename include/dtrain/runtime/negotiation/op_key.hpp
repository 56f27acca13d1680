#pragma once
// What identifies an op among those in flight: its name within its process set. Two sets may use
// the same name at the same time (each half of a job averaging its own "grad"), so every table
// that finds an op by name (the in-flight table, the response cache and its mirrors) keys it by
// both.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include <fmt/format.h>

#include "dtrain/runtime/negotiation/request.hpp"

namespace dtrain::detail {

struct OpKey {
  std::int32_t process_set = 0;
  std::string name;

  static OpKey of(const Request& q) { return OpKey{q.process_set, q.name}; }
  friend bool operator==(const OpKey&, const OpKey&) = default;
};

struct OpKeyHash {
  std::size_t operator()(const OpKey& k) const noexcept {
    return std::hash<std::string>{}(k.name) ^
           (static_cast<std::size_t>(k.process_set) * 0x9e3779b97f4a7c15ull);
  }
};

// The name an op's timeline row and the coordinator's hooks know it by: its own on the world,
// qualified with its process set otherwise.
inline std::string display_name(std::int32_t process_set, const std::string& name) {
  return process_set == 0 ? name : fmt::format("{} (process set {})", name, process_set);
}

}  // namespace dtrain::detail
