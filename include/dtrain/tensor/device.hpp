#pragma once
// Where a tensor's memory lives.
#include <cstdint>
#include <string>
#include <string_view>

#include <fmt/format.h>

namespace dtrain {

enum class DeviceType : std::uint8_t { cpu, cuda };

struct Device {
  DeviceType type = DeviceType::cpu;
  int index = -1;  // CUDA ordinal; -1 for the host

  static constexpr Device cpu() noexcept { return {DeviceType::cpu, -1}; }
  static constexpr Device cuda(int index) noexcept { return {DeviceType::cuda, index}; }

  constexpr bool is_cpu() const noexcept { return type == DeviceType::cpu; }
  constexpr bool is_cuda() const noexcept { return type == DeviceType::cuda; }
  friend constexpr bool operator==(const Device&, const Device&) = default;
};

inline std::string to_string(const Device& d) {
  return d.is_cpu() ? std::string("cpu") : "cuda:" + std::to_string(d.index);
}

}  // namespace dtrain

// `{}` writes to_string(d): "cpu" or "cuda:<index>".
template <>
struct fmt::formatter<dtrain::Device> : fmt::formatter<std::string_view> {
  auto format(const dtrain::Device& d, fmt::format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(dtrain::to_string(d), ctx);
  }
};
