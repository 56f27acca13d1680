#pragma once
#include <cstdint>
#include <string_view>

#include <fmt/format.h>

namespace dtrain {

// Average divides the sum by the number of ranks that contributed (ranks that joined do not
// count). It is defined for floating-point tensors only: an integer average would silently
// truncate, so dtrain asks for Sum and an explicit division instead.
enum class ReduceOp : std::uint8_t { Average, Sum, Min, Max, Product };

constexpr std::string_view to_string(ReduceOp op) noexcept {
  switch (op) {
    case ReduceOp::Average: return "Average";
    case ReduceOp::Sum: return "Sum";
    case ReduceOp::Min: return "Min";
    case ReduceOp::Max: return "Max";
    case ReduceOp::Product: return "Product";
  }
  return "unknown";
}

}  // namespace dtrain

// `{}` writes to_string(op), the enumerator's name ("Average", "Sum", ...).
template <>
struct fmt::formatter<dtrain::ReduceOp> : fmt::formatter<std::string_view> {
  auto format(dtrain::ReduceOp op, fmt::format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(dtrain::to_string(op), ctx);
  }
};
