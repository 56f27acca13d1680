#pragma once
#include <cstdint>
#include <string_view>

#include <fmt/format.h>

namespace dtrain {

// Average divides the sum by the number of ranks that contributed (ranks that joined do not
// count). It is defined for floating-point tensors only: an integer average would silently
// truncate, so dtrain asks for Sum and an explicit division instead.
//
// Adasum (Maleki et al., MLSys'21; Horovod's hvd.Adasum) combines gradients pairwise, scaling down
// what two vectors have in common: adasum(a, b) = (1 - a·b/2|a|²) a + (1 - a·b/2|b|²) b, so
// orthogonal gradients add and identical ones average. allreduce and grouped_allreduce only, on
// host float32/float64 tensors (Note [Adasum tree] in runtime/detail/adasum_tree.hpp).
enum class ReduceOp : std::uint8_t { Average, Sum, Min, Max, Product, Adasum };

constexpr std::string_view to_string(ReduceOp op) noexcept {
  switch (op) {
    case ReduceOp::Average: return "Average";
    case ReduceOp::Sum: return "Sum";
    case ReduceOp::Min: return "Min";
    case ReduceOp::Max: return "Max";
    case ReduceOp::Product: return "Product";
    case ReduceOp::Adasum: return "Adasum";
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
