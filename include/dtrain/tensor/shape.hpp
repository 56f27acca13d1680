#pragma once
// Shapes and the element counts they describe.
//
// Note [Element counts]
// A shape's element count is the product of its dimensions; the empty shape [] is a scalar with
// one element. A zero dimension makes the count 0 whatever the other dimensions are, so
// [2^40, 2^40, 0] is an empty tensor, not an overflow. A negative dimension, or a product beyond
// what std::int64_t holds, is an InvalidArgumentError that names the shape: either one would
// otherwise become a wrong byte count handed to an allocator or to MPI.
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include <fmt/format.h>

#include "dtrain/core/error.hpp"

namespace dtrain {

using Shape = std::vector<std::int64_t>;

namespace detail {

// The product of shape[first_dim], shape[first_dim + 1], ... (Note [Element counts]). Every
// dimension is checked for sign, including those before first_dim.
inline std::int64_t dims_product(std::span<const std::int64_t> shape, std::size_t first_dim) {
  for (std::size_t i = 0; i < shape.size(); ++i)
    if (shape[i] < 0)
      throw InvalidArgumentError(fmt::format("dtrain: negative dimension {} (dim {}) in shape [{}]",
                                             shape[i], i, fmt::join(shape, ", ")));
  for (std::size_t i = first_dim; i < shape.size(); ++i)
    if (shape[i] == 0) return 0;
  std::int64_t n = 1;
  for (std::size_t i = first_dim; i < shape.size(); ++i)
    if (__builtin_mul_overflow(n, shape[i], &n))
      throw InvalidArgumentError(fmt::format(
          "dtrain: shape [{}] has more elements than a 64-bit count holds", fmt::join(shape, ", ")));
  return n;
}

// Elements in a tensor of this shape; 1 for the scalar shape [].
inline std::int64_t numel(std::span<const std::int64_t> shape) { return dims_product(shape, 0); }

// Elements in one row (dim 0 is the row count): the product of the dimensions after the first;
// 1 for [] and for 1-D shapes.
inline std::int64_t row_numel(std::span<const std::int64_t> shape) {
  return dims_product(shape, 1);
}

}  // namespace detail
}  // namespace dtrain
