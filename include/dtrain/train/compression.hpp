#pragma once
// Gradient compression: float32/float64 gradients travel as float16 or bfloat16 and are widened
// back after the reduction. Halves the bytes on the wire at the cost of 16-bit precision (about 3
// significant decimal digits for float16, 2 for bfloat16; bfloat16 keeps float32's range).
// compression_hook() in train/gradient_hook.hpp does it (Note [Gradient communication hooks]).
#include <cstdint>
#include <type_traits>

#include "dtrain/tensor/half_arrays.hpp"

namespace dtrain {

enum class Compression : std::uint8_t { none, fp16, bf16 };

namespace detail {

// Host loops; values round to nearest even, NaN stays NaN. float32 to and from float16 take F16C
// where the CPU has it (Note [Vectorized float16]).
template <class From>
void compress(const From* src, std::uint16_t* dst, std::int64_t n, Compression c) {
  if constexpr (std::is_same_v<From, float>) {
    if (c == Compression::fp16) return floats_to_halves(src, dst, n);
  }
  if (c == Compression::fp16)
    for (std::int64_t i = 0; i < n; ++i) dst[i] = float_to_half(static_cast<float>(src[i]));
  else
    for (std::int64_t i = 0; i < n; ++i) dst[i] = float_to_bf16(static_cast<float>(src[i]));
}
template <class To>
void decompress(const std::uint16_t* src, To* dst, std::int64_t n, Compression c) {
  if constexpr (std::is_same_v<To, float>) {
    if (c == Compression::fp16) return halves_to_floats(src, dst, n);
  }
  if (c == Compression::fp16)
    for (std::int64_t i = 0; i < n; ++i) dst[i] = static_cast<To>(half_to_float(src[i]));
  else
    for (std::int64_t i = 0; i < n; ++i) dst[i] = static_cast<To>(bf16_to_float(src[i]));
}

}  // namespace detail
}  // namespace dtrain
