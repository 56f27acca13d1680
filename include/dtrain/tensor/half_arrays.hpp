#pragma once
// float16 arrays converted and summed eight values at a time where the CPU has F16C.
//
// Note [Vectorized float16]
// The scalar conversions of tensor/half.hpp are exact but cost a branchy function per element: a
// 44 MB gradient set narrowed to float16, reduced and widened again spent more time converting than
// a 1 Gbit/s link spent carrying the halved bytes (docs/scaling.md, "Gradient hooks on a slow
// link"). x86-64 CPUs since 2012 convert eight values per instruction (F16C: vcvtph2ps, vcvtps2ph),
// rounding to nearest even as the scalar code does, so every finite value, infinity and signed
// zero converts to the same bits either way; a NaN stays a quiet NaN with its top payload bits.
// dtrain is not compiled for F16C (a binary must run on any x86-64), so these functions carry
// the target on their own and are chosen at run time; elsewhere the scalar loops run.
#include <cstdint>

#include "dtrain/tensor/half.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define DTRAIN_F16C_DISPATCH 1
#else
#define DTRAIN_F16C_DISPATCH 0
#endif

namespace dtrain::detail {

#if DTRAIN_F16C_DISPATCH
inline bool cpu_has_f16c() noexcept {
  static const bool yes = __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
  return yes;
}

__attribute__((target("avx,f16c"))) inline __m256 load_halves(const std::uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
__attribute__((target("avx,f16c"))) inline void store_halves(std::uint16_t* p, __m256 v) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                   _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

__attribute__((target("avx,f16c"))) inline void halves_to_floats_f16c(const std::uint16_t* src,
                                                                       float* dst,
                                                                       std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load_halves(src + i));
  for (; i < n; ++i) dst[i] = half_to_float(src[i]);
}
__attribute__((target("avx,f16c"))) inline void floats_to_halves_f16c(const float* src,
                                                                       std::uint16_t* dst,
                                                                       std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) store_halves(dst + i, _mm256_loadu_ps(src + i));
  for (; i < n; ++i) dst[i] = float_to_half(src[i]);
}
__attribute__((target("avx,f16c"))) inline void add_halves_f16c(const std::uint16_t* in,
                                                                 std::uint16_t* inout,
                                                                 std::int64_t n, float factor) {
  std::int64_t i = 0;
  const __m256 f = _mm256_set1_ps(factor);
  for (; i + 8 <= n; i += 8)
    store_halves(inout + i,
                 _mm256_mul_ps(_mm256_add_ps(load_halves(in + i), load_halves(inout + i)), f));
  for (; i < n; ++i)
    inout[i] = float_to_half((half_to_float(in[i]) + half_to_float(inout[i])) * factor);
}
#endif

inline void halves_to_floats(const std::uint16_t* src, float* dst, std::int64_t n) noexcept {
#if DTRAIN_F16C_DISPATCH
  if (cpu_has_f16c()) return halves_to_floats_f16c(src, dst, n);
#endif
  for (std::int64_t i = 0; i < n; ++i) dst[i] = half_to_float(src[i]);
}

inline void floats_to_halves(const float* src, std::uint16_t* dst, std::int64_t n) noexcept {
#if DTRAIN_F16C_DISPATCH
  if (cpu_has_f16c()) return floats_to_halves_f16c(src, dst, n);
#endif
  for (std::int64_t i = 0; i < n; ++i) dst[i] = float_to_half(src[i]);
}

// inout[i] = (in[i] + inout[i]) * factor, the sum and the product in float32 and rounded once
// to float16, as the scalar reduction does.
inline void add_halves(const std::uint16_t* in, std::uint16_t* inout, std::int64_t n,
                       float factor = 1.0f) noexcept {
#if DTRAIN_F16C_DISPATCH
  if (cpu_has_f16c()) return add_halves_f16c(in, inout, n, factor);
#endif
  for (std::int64_t i = 0; i < n; ++i)
    inout[i] = float_to_half((half_to_float(in[i]) + half_to_float(inout[i])) * factor);
}

}  // namespace dtrain::detail
