#pragma once
// 16-bit floating-point storage types: IEEE 754 binary16 (float16_t) and bfloat16 (bfloat16_t).
// They are storage formats: arithmetic happens in float after a conversion. Conversions are
// integer bit manipulation rather than float tricks, so they round correctly whatever the FPU's
// rounding mode and flush-to-zero settings are.
#include <bit>
#include <concepts>
#include <cstdint>
#include <limits>
#include <type_traits>

namespace dtrain {

namespace detail {

// Note [Rounding by integer addition]
// For a non-negative finite value whose bits are u, dropping the low `shift` bits with
// round-to-nearest-even is (u + (half - 1) + lsb) >> shift, where half = 1 << (shift - 1) and lsb
// is the lowest kept bit: exactly half way rounds up only when the kept part is odd. A carry out
// of the mantissa increments the exponent field, which is the correct next binade, and a carry
// into the all-ones exponent yields infinity, which is the correct overflow result.
template <class U>
constexpr U round_shift_rne(U u, int shift) noexcept {
  const U half = U{1} << (shift - 1);
  return (u + (half - 1) + ((u >> shift) & 1U)) >> shift;
}

constexpr float half_to_float(std::uint16_t h) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000U) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fU;
  const std::uint32_t mant = h & 0x3ffU;
  std::uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000U | (mant << 13);  // inf, or NaN with its payload kept
  } else if (exp != 0) {
    bits = sign | ((exp + (127 - 15)) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {
    // Subnormal half: normalize so the leading one becomes float's implicit bit.
    const int lead = std::countl_zero(mant) - 22;  // zeros within the 10-bit field, 0..9
    const std::uint32_t norm = (mant << (lead + 1)) & 0x3ffU;
    bits = sign | (static_cast<std::uint32_t>(127 - 15 - lead) << 23) | (norm << 13);
  }
  return std::bit_cast<float>(bits);
}

constexpr std::uint16_t float_to_half(float f) noexcept {
  std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  const auto sign = static_cast<std::uint16_t>((u >> 16) & 0x8000U);
  u &= 0x7fffffffU;
  if (u >= 0x47800000U) {  // |f| >= 65536, inf or NaN
    if (u > 0x7f800000U) {
      // NaN: keep the top payload bits and force the quiet bit, which also keeps a NaN whose
      // payload lives only in the dropped bits from turning into infinity.
      return static_cast<std::uint16_t>(sign | 0x7e00U | ((u >> 13) & 0x3ffU));
    }
    return static_cast<std::uint16_t>(sign | 0x7c00U);
  }
  if (u >= 0x38800000U) {  // |f| >= 2^-14: a normal half (or inf after rounding up past 65504)
    u -= static_cast<std::uint32_t>(127 - 15) << 23;
    return static_cast<std::uint16_t>(sign | round_shift_rne(u, 13));
  }
  const std::uint32_t exp = u >> 23;
  if (exp < 102) return sign;  // |f| < 2^-25 rounds to zero (2^-25 itself ties to even zero)
  // Subnormal half: units of 2^-24. The float's value is mant * 2^(exp - 150).
  const std::uint32_t mant = (u & 0x7fffffU) | 0x800000U;
  return static_cast<std::uint16_t>(sign | round_shift_rne(mant, static_cast<int>(126 - exp)));
}

constexpr float bf16_to_float(std::uint16_t b) noexcept {
  return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16);
}

constexpr std::uint16_t float_to_bf16(float f) noexcept {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  if ((u & 0x7fffffffU) > 0x7f800000U) {
    return static_cast<std::uint16_t>((u >> 16) | 0x0040U);  // NaN stays NaN, made quiet
  }
  // bfloat16 is float32 with the low 16 bits dropped, so see Note [Rounding by integer addition];
  // it also holds for float subnormals, whose bits are linear in their value.
  const std::uint32_t sign = u & 0x80000000U;
  return static_cast<std::uint16_t>((sign >> 16) | round_shift_rne(u & 0x7fffffffU, 16));
}

// Rounds a double straight to a binary format with ExpBits exponent bits and MantBits stored
// mantissa bits. Going through float first would round twice and can be off by one ulp when the
// float lands exactly on a midpoint of the narrow format.
template <int ExpBits, int MantBits>
constexpr std::uint16_t double_to_narrow(double d) noexcept {
  constexpr int bias = (1 << (ExpBits - 1)) - 1;
  constexpr std::uint64_t exp_ones = (1U << ExpBits) - 1;
  constexpr int drop = 52 - MantBits;
  std::uint64_t u = std::bit_cast<std::uint64_t>(d);
  const auto sign = static_cast<std::uint16_t>((u >> 48) & 0x8000U);
  u &= 0x7fffffffffffffffULL;
  constexpr std::uint64_t overflow = static_cast<std::uint64_t>(1023 + bias + 1) << 52;
  if (u >= overflow) {  // |d| >= 2^(emax + 1), inf or NaN
    if (u > 0x7ff0000000000000ULL) {
      const std::uint64_t quiet = std::uint64_t{1} << (MantBits - 1);
      return static_cast<std::uint16_t>(sign | (exp_ones << MantBits) | quiet |
                                        ((u >> drop) & ((std::uint64_t{1} << MantBits) - 1)));
    }
    return static_cast<std::uint16_t>(sign | (exp_ones << MantBits));
  }
  const int exp = static_cast<int>(u >> 52);
  if (exp >= 1023 - bias + 1) {  // normal in the narrow format
    u -= static_cast<std::uint64_t>(1023 - bias) << 52;
    return static_cast<std::uint16_t>(sign | round_shift_rne(u, drop));
  }
  // Subnormal in the narrow format: units of 2^(1 - bias - MantBits).
  const int shift = (1023 + 52 + 1 - bias - MantBits) - exp;
  if (shift > 53) return sign;  // below half the smallest subnormal (or a double subnormal)
  const std::uint64_t mant = (u & 0xfffffffffffffULL) | (std::uint64_t{1} << 52);
  return static_cast<std::uint16_t>(sign | round_shift_rne(mant, shift));
}

// An integer as a double that rounds to every format of at most 51 significand bits exactly as
// the integer would: low bits beyond 53 are folded into a sticky bit (round to odd).
template <std::integral I>
constexpr double integer_to_double_sticky(I v) noexcept {
  using U = std::make_unsigned_t<I>;
  const bool negative = std::is_signed_v<I> && v < 0;
  std::uint64_t mag = negative ? static_cast<std::uint64_t>(U(0) - static_cast<U>(v))
                               : static_cast<std::uint64_t>(v);
  int scale = 0;
  const int width = static_cast<int>(std::bit_width(mag));
  if (width > 53) {
    scale = width - 53;
    const bool lost = (mag & ((std::uint64_t{1} << scale) - 1)) != 0;
    mag = (mag >> scale) | (lost ? 1U : 0U);
  }
  double r = static_cast<double>(mag);  // exact: at most 53 bits
  for (int i = 0; i < scale; ++i) r *= 2.0;
  return negative ? -r : r;
}

}  // namespace detail

struct float16_t {
  std::uint16_t bits = 0;

  constexpr float16_t() noexcept = default;
  constexpr explicit float16_t(float f) noexcept : bits(detail::float_to_half(f)) {}
  constexpr explicit float16_t(double d) noexcept : bits(detail::double_to_narrow<5, 10>(d)) {}
  // Integers round correctly too (a plain int would otherwise be ambiguous between the two).
  template <std::integral I>
    requires(!std::same_as<I, bool>)
  constexpr explicit float16_t(I v) noexcept
      : float16_t(detail::integer_to_double_sticky(v)) {}

  constexpr explicit operator float() const noexcept { return detail::half_to_float(bits); }

  static constexpr float16_t from_bits(std::uint16_t b) noexcept {
    float16_t h;
    h.bits = b;
    return h;
  }

  constexpr bool is_nan() const noexcept { return (bits & 0x7fffU) > 0x7c00U; }

  friend constexpr bool operator==(float16_t a, float16_t b) noexcept {
    if (a.is_nan() || b.is_nan()) return false;
    return a.bits == b.bits || ((a.bits | b.bits) & 0x7fffU) == 0;  // +0 == -0
  }
};

struct bfloat16_t {
  std::uint16_t bits = 0;

  constexpr bfloat16_t() noexcept = default;
  constexpr explicit bfloat16_t(float f) noexcept : bits(detail::float_to_bf16(f)) {}
  constexpr explicit bfloat16_t(double d) noexcept : bits(detail::double_to_narrow<8, 7>(d)) {}
  template <std::integral I>
    requires(!std::same_as<I, bool>)
  constexpr explicit bfloat16_t(I v) noexcept
      : bfloat16_t(detail::integer_to_double_sticky(v)) {}

  constexpr explicit operator float() const noexcept { return detail::bf16_to_float(bits); }

  static constexpr bfloat16_t from_bits(std::uint16_t b) noexcept {
    bfloat16_t h;
    h.bits = b;
    return h;
  }

  constexpr bool is_nan() const noexcept { return (bits & 0x7fffU) > 0x7f80U; }

  friend constexpr bool operator==(bfloat16_t a, bfloat16_t b) noexcept {
    if (a.is_nan() || b.is_nan()) return false;
    return a.bits == b.bits || ((a.bits | b.bits) & 0x7fffU) == 0;
  }
};

static_assert(sizeof(float16_t) == 2 && alignof(float16_t) == 2);
static_assert(sizeof(bfloat16_t) == 2 && alignof(bfloat16_t) == 2);
static_assert(std::is_trivially_copyable_v<float16_t> && std::is_standard_layout_v<float16_t>);
static_assert(std::is_trivially_copyable_v<bfloat16_t> && std::is_standard_layout_v<bfloat16_t>);
static_assert(std::numeric_limits<float>::is_iec559, "dtrain assumes IEEE 754 float");

}  // namespace dtrain
