#pragma once
// Element-wise kernels on host memory: reduce one buffer into another, scale, fill with zeros.
// Shared by the MPI user-defined ops for 16-bit floats, the fusion buffer's pack/unpack, and the
// scaling passes of allreduce. Dispatch on DataType happens once per call, never per element.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "dtrain/comm/reduce_op.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/tensor/dtype.hpp"
#include "dtrain/tensor/half.hpp"
#include "dtrain/tensor/half_arrays.hpp"

namespace dtrain::detail {

// Calls f(tag) with a value of the C++ storage type for `dtype` (uint16_t for 16-bit floats).
template <class F>
decltype(auto) visit_dtype(DataType dtype, F&& f) {
  switch (dtype) {
    case DataType::uint8: return f(std::uint8_t{});
    case DataType::int8: return f(std::int8_t{});
    case DataType::int32: return f(std::int32_t{});
    case DataType::int64: return f(std::int64_t{});
    case DataType::float16: return f(float16_t{});
    case DataType::bfloat16: return f(bfloat16_t{});
    case DataType::float32: return f(float{});
    case DataType::float64: return f(double{});
  }
  throw InvalidArgumentError("dtrain: invalid DataType value " +
                             std::to_string(static_cast<int>(dtype)));
}

template <class T>
inline constexpr bool is_half_v = std::is_same_v<T, float16_t> || std::is_same_v<T, bfloat16_t>;

template <class T>
inline float to_f32(T v) noexcept {
  if constexpr (std::is_same_v<T, float16_t>) return half_to_float(v.bits);
  else return bf16_to_float(v.bits);
}
template <class T>
inline T from_f32(float f) noexcept {
  T out;
  if constexpr (std::is_same_v<T, float16_t>) out.bits = float_to_half(f);
  else out.bits = float_to_bf16(f);
  return out;
}

template <class V>
inline V apply_op(ReduceOp op, V a, V b) noexcept {
  switch (op) {
    case ReduceOp::Average:
    case ReduceOp::Sum: return static_cast<V>(a + b);
    case ReduceOp::Min: return b < a ? b : a;
    case ReduceOp::Max: return b > a ? b : a;
    case ReduceOp::Product: return static_cast<V>(a * b);
    case ReduceOp::Adasum: break;  // never reaches a reduction (Note [Adasum tree])
  }
  return a;
}

// inout[i] = op(in[i], inout[i])
// float16 arrays as their bits, for the vectorized sums of tensor/half_arrays.hpp.
inline const std::uint16_t* half_bits(const float16_t* p) noexcept {
  static_assert(sizeof(float16_t) == sizeof(std::uint16_t));
  return reinterpret_cast<const std::uint16_t*>(p);
}
inline std::uint16_t* half_bits(float16_t* p) noexcept {
  return reinterpret_cast<std::uint16_t*>(p);
}

template <class T>
void reduce_into(ReduceOp op, const T* in, T* inout, std::int64_t n) noexcept {
  if constexpr (std::is_same_v<T, float16_t>) {
    if (op == ReduceOp::Sum || op == ReduceOp::Average) {  // Note [Vectorized float16]
      add_halves(half_bits(in), half_bits(inout), n);
      return;
    }
  }
  if constexpr (is_half_v<T>) {
    for (std::int64_t i = 0; i < n; ++i)
      inout[i] = from_f32<T>(apply_op(op, to_f32(in[i]), to_f32(inout[i])));
  } else {
    switch (op) {  // hoisted so each loop vectorizes
      case ReduceOp::Average:
      case ReduceOp::Sum:
        for (std::int64_t i = 0; i < n; ++i) inout[i] = static_cast<T>(in[i] + inout[i]);
        break;
      case ReduceOp::Min:
        for (std::int64_t i = 0; i < n; ++i) inout[i] = std::min(in[i], inout[i]);
        break;
      case ReduceOp::Max:
        for (std::int64_t i = 0; i < n; ++i) inout[i] = std::max(in[i], inout[i]);
        break;
      case ReduceOp::Product:
        for (std::int64_t i = 0; i < n; ++i) inout[i] = static_cast<T>(in[i] * inout[i]);
        break;
      case ReduceOp::Adasum: break;  // never reaches a reduction (Note [Adasum tree])
    }
  }
}

// inout[i] = op(in[i], inout[i]) * factor, in one pass: the last step of a reduce-scatter that
// also applies Average or a postscale (Note [Scaled allreduce]). Floating-point types only.
template <class T>
void reduce_scale_into(ReduceOp op, const T* in, T* inout, std::int64_t n, double factor) noexcept {
  if constexpr (std::is_same_v<T, float16_t>) {
    if (op == ReduceOp::Sum || op == ReduceOp::Average) {  // Note [Vectorized float16]
      add_halves(half_bits(in), half_bits(inout), n, static_cast<float>(factor));
      return;
    }
  }
  if constexpr (is_half_v<T>) {
    const float f = static_cast<float>(factor);
    for (std::int64_t i = 0; i < n; ++i)
      inout[i] = from_f32<T>(apply_op(op, to_f32(in[i]), to_f32(inout[i])) * f);
  } else if constexpr (std::is_floating_point_v<T>) {
    const T f = static_cast<T>(factor);
    if (op == ReduceOp::Sum || op == ReduceOp::Average) {  // hoisted so the loop vectorizes
      for (std::int64_t i = 0; i < n; ++i) inout[i] = (in[i] + inout[i]) * f;
    } else {
      for (std::int64_t i = 0; i < n; ++i) inout[i] = apply_op(op, in[i], inout[i]) * f;
    }
  }
}

// dst[i] = src[i] * factor (src may equal dst). Integer types are only ever copied: scaling
// integers is rejected when the op is submitted.
inline void scale_copy(DataType dtype, const void* src, void* dst, std::int64_t n, double factor) {
  if (n <= 0) return;
  if (factor == 1.0 || !is_floating_point(dtype)) {
    if (src != dst) std::memcpy(dst, src, static_cast<std::size_t>(n) * element_size(dtype));
    return;
  }
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* s = static_cast<const T*>(src);
    T* d = static_cast<T*>(dst);
    if constexpr (is_half_v<T>) {
      const float f = static_cast<float>(factor);
      for (std::int64_t i = 0; i < n; ++i) d[i] = from_f32<T>(to_f32(s[i]) * f);
    } else if constexpr (std::is_floating_point_v<T>) {
      const T f = static_cast<T>(factor);
      for (std::int64_t i = 0; i < n; ++i) d[i] = s[i] * f;
    }
  });
}

inline void scale_in_place(DataType dtype, void* data, std::int64_t n, double factor) {
  scale_copy(dtype, data, data, n, factor);
}

// Fills `n` elements with the identity of `op`, so a rank with nothing of its own (it joined)
// leaves the reduction of the others unchanged: 0 for Sum and Average, 1 for Product, the largest
// value (+inf for floats) for Min and the smallest (-inf) for Max.
inline void fill_identity(DataType dtype, ReduceOp op, void* data, std::int64_t n) {
  if (n <= 0) return;
  if (op == ReduceOp::Sum || op == ReduceOp::Average) {
    std::memset(data, 0, static_cast<std::size_t>(n) * element_size(dtype));
    return;
  }
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    T value{};
    if constexpr (is_half_v<T>) {
      const float f = op == ReduceOp::Product ? 1.0f
                      : op == ReduceOp::Min   ? std::numeric_limits<float>::infinity()
                                              : -std::numeric_limits<float>::infinity();
      value = from_f32<T>(f);
    } else if constexpr (std::is_floating_point_v<T>) {
      value = op == ReduceOp::Product ? T(1)
              : op == ReduceOp::Min   ? std::numeric_limits<T>::infinity()
                                      : -std::numeric_limits<T>::infinity();
    } else {
      value = op == ReduceOp::Product ? T(1)
              : op == ReduceOp::Min   ? std::numeric_limits<T>::max()
                                      : std::numeric_limits<T>::lowest();
    }
    std::fill_n(static_cast<T*>(data), n, value);
  });
}

}  // namespace dtrain::detail
