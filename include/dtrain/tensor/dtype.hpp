#pragma once
// Element types dtrain moves and reduces.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include <fmt/format.h>

#include "dtrain/core/error.hpp"

namespace dtrain {

enum class DataType : std::uint8_t {
  uint8,
  int8,
  int32,
  int64,
  float16,
  bfloat16,
  float32,
  float64,
};

inline constexpr DataType all_data_types[] = {DataType::uint8,   DataType::int8,
                                              DataType::int32,   DataType::int64,
                                              DataType::float16, DataType::bfloat16,
                                              DataType::float32, DataType::float64};

constexpr std::size_t element_size(DataType t) noexcept {
  switch (t) {
    case DataType::uint8:
    case DataType::int8: return 1;
    case DataType::float16:
    case DataType::bfloat16: return 2;
    case DataType::int32:
    case DataType::float32: return 4;
    case DataType::int64:
    case DataType::float64: return 8;
  }
  return 0;
}

constexpr bool is_floating_point(DataType t) noexcept {
  return t == DataType::float16 || t == DataType::bfloat16 || t == DataType::float32 ||
         t == DataType::float64;
}

constexpr std::string_view to_string(DataType t) noexcept {
  switch (t) {
    case DataType::uint8: return "uint8";
    case DataType::int8: return "int8";
    case DataType::int32: return "int32";
    case DataType::int64: return "int64";
    case DataType::float16: return "float16";
    case DataType::bfloat16: return "bfloat16";
    case DataType::float32: return "float32";
    case DataType::float64: return "float64";
  }
  return "unknown";
}

constexpr bool is_valid(DataType t) noexcept {
  return static_cast<std::uint8_t>(t) <= static_cast<std::uint8_t>(DataType::float64);
}

}  // namespace dtrain

// `{}` writes to_string(t); width and fill apply as to a string.
template <>
struct fmt::formatter<dtrain::DataType> : fmt::formatter<std::string_view> {
  auto format(dtrain::DataType t, fmt::format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(dtrain::to_string(t), ctx);
  }
};
