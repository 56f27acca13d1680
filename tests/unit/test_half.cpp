#include "dtrain/tensor/half.hpp"
#include "dtrain/tensor/half_arrays.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <ios>
#include <limits>
#include <random>
#include <vector>

using dtrain::bfloat16_t;
using dtrain::float16_t;

namespace {

// A narrow binary format described by its field widths, with values computed from the IEEE
// definition in double arithmetic. This is the reference the bit-level conversions are checked
// against; it shares no code with them.
struct NarrowFormat {
  int exp_bits;
  int mant_bits;

  int bias() const { return (1 << (exp_bits - 1)) - 1; }
  std::uint16_t inf_bits() const {
    return static_cast<std::uint16_t>(((1U << exp_bits) - 1) << mant_bits);
  }
  bool is_nan(std::uint16_t b) const { return (b & 0x7fffU) > inf_bits(); }
  std::uint16_t quiet_bit() const { return static_cast<std::uint16_t>(1U << (mant_bits - 1)); }

  // Value of a non-NaN bit pattern.
  double value(std::uint16_t b) const {
    const int e = (b & 0x7fff) >> mant_bits;
    const int m = b & ((1 << mant_bits) - 1);
    const double sign = (b & 0x8000) ? -1.0 : 1.0;
    if (e == (1 << exp_bits) - 1) return sign * std::numeric_limits<double>::infinity();
    if (e == 0) return sign * std::ldexp(m, 1 - bias() - mant_bits);
    return sign * std::ldexp((1 << mant_bits) + m, e - bias() - mant_bits);
  }

  // Non-negative finite values in bit order, plus the value the next pattern would have with an
  // unbounded exponent (2^(emax+1)) standing for infinity: rounding up past the largest finite
  // value overflows to infinity exactly when the nearest-even rule picks that virtual value.
  std::vector<double> ladder() const {
    std::vector<double> v;
    for (std::uint32_t b = 0; b < inf_bits(); ++b) v.push_back(value(static_cast<std::uint16_t>(b)));
    v.push_back(std::ldexp(1.0, bias() + 1));
    return v;
  }
};

const NarrowFormat fp16_format{5, 10};
const NarrowFormat bf16_format{8, 7};

// Nearest value with ties to even, by search over the ladder.
std::uint16_t reference_round(const std::vector<double>& ladder, double x) {
  const std::uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(x);
  const auto top = static_cast<std::uint16_t>(ladder.size() - 1);  // the infinity pattern
  if (a >= ladder.back()) return static_cast<std::uint16_t>(sign | top);
  const auto hi_it = std::upper_bound(ladder.begin(), ladder.end(), a);
  const auto hi = static_cast<std::uint16_t>(hi_it - ladder.begin());
  const auto lo = static_cast<std::uint16_t>(hi - 1);
  if (a == ladder[lo]) return static_cast<std::uint16_t>(sign | lo);
  const double mid = (ladder[lo] + ladder[hi]) / 2;  // exact: both have few significand bits
  std::uint16_t r;
  if (a < mid) {
    r = lo;
  } else if (a > mid) {
    r = hi;
  } else {
    r = (lo % 2 == 0) ? lo : hi;
  }
  return static_cast<std::uint16_t>(sign | r);
}

// Inputs around every rounding boundary: each value, each midpoint and the float and double
// neighbours of each midpoint, with both signs.
template <class F>
void for_each_boundary_input(const std::vector<double>& ladder, F&& check) {
  for (std::size_t i = 0; i + 1 < ladder.size(); ++i) {
    const double lo = ladder[i];
    const double hi = ladder[i + 1];
    const double mid = (lo + hi) / 2;
    const double quarter = lo + (hi - lo) / 4;
    const double points[] = {
        lo,
        mid,
        quarter,
        hi - (hi - lo) / 4,
        static_cast<double>(std::nextafter(static_cast<float>(mid), 0.0f)),
        static_cast<double>(std::nextafter(static_cast<float>(mid), INFINITY)),
        std::nextafter(mid, 0.0),
        std::nextafter(mid, INFINITY),
    };
    for (double p : points) {
      check(p);
      check(-p);
    }
  }
}

}  // namespace

TEST_CASE("half conversions are usable in constant expressions") {
  static_assert(float16_t(1.0f).bits == 0x3c00);
  static_assert(float16_t(-2.0).bits == 0xc000);
  static_assert(static_cast<float>(float16_t::from_bits(0x3555)) == 0x1.554p-2f);
  static_assert(bfloat16_t(1.0f).bits == 0x3f80);
  static_assert(static_cast<float>(bfloat16_t::from_bits(0xc000)) == -2.0f);
  static_assert(float16_t() == float16_t::from_bits(0));
  CHECK(sizeof(float16_t) == 2);
}

TEST_CASE("float16: every bit pattern converts to its exact float value and back") {
  for (std::uint32_t b = 0; b <= 0xffff; ++b) {
    const auto h = static_cast<std::uint16_t>(b);
    const float f = static_cast<float>(float16_t::from_bits(h));
    CHECK(std::bit_cast<std::uint32_t>(dtrain::detail::half_to_float(h)) ==
          std::bit_cast<std::uint32_t>(f));
    if (fp16_format.is_nan(h)) {
      REQUIRE(std::isnan(f));
      CHECK(std::signbit(f) == ((h & 0x8000) != 0));
      // A NaN converted back is a quiet NaN of the same sign; a quiet one keeps its payload.
      const std::uint16_t back = float16_t(f).bits;
      CHECK(fp16_format.is_nan(back));
      CHECK((back & 0x8000) == (h & 0x8000));
      CHECK((back & fp16_format.quiet_bit()) != 0);
      if (h & fp16_format.quiet_bit()) CHECK(back == h);
      CHECK(float16_t(static_cast<double>(f)).bits == back);
      continue;
    }
    const double expected = fp16_format.value(h);
    REQUIRE_MESSAGE(static_cast<double>(f) == expected, "bits 0x" << std::hex << b);
    CHECK(std::signbit(f) == ((h & 0x8000) != 0));
    REQUIRE_MESSAGE(float16_t(f).bits == h, "bits 0x" << std::hex << b);
    REQUIRE_MESSAGE(float16_t(static_cast<double>(f)).bits == h, "bits 0x" << std::hex << b);
    CHECK(dtrain::detail::float_to_half(f) == h);
  }
}

TEST_CASE("float16: rounding at every midpoint and its neighbours matches the reference") {
  const std::vector<double> ladder = fp16_format.ladder();
  REQUIRE(ladder.size() == 0x7c01);
  std::size_t checked = 0;
  for_each_boundary_input(ladder, [&](double x) {
    const std::uint16_t want = reference_round(ladder, x);
    REQUIRE_MESSAGE(float16_t(x).bits == want, "double input " << std::hexfloat << x);
    const auto xf = static_cast<float>(x);
    if (static_cast<double>(xf) == x) {
      REQUIRE_MESSAGE(float16_t(xf).bits == want, "float input " << std::hexfloat << xf);
    } else {
      REQUIRE_MESSAGE(float16_t(xf).bits == reference_round(ladder, xf),
                      "float input " << std::hexfloat << xf);
    }
    ++checked;
  });
  CHECK(checked > 400000);
}

TEST_CASE("float16: a sweep over float32 bit patterns matches the reference") {
  const std::vector<double> ladder = fp16_format.ladder();
  for (std::uint64_t u = 0; u <= 0x7f800000U; u += 4099) {
    const float f = std::bit_cast<float>(static_cast<std::uint32_t>(u));
    const std::uint16_t want = reference_round(ladder, f);
    REQUIRE_MESSAGE(float16_t(f).bits == want, "float bits 0x" << std::hex << u);
    REQUIRE(float16_t(-f).bits == (want | 0x8000));
  }
  std::mt19937_64 rng(12345);
  std::uniform_real_distribution<double> exponent(-27.0, 17.0);
  for (int i = 0; i < 200000; ++i) {
    const double d = std::exp2(exponent(rng));
    REQUIRE_MESSAGE(float16_t(d).bits == reference_round(ladder, d),
                    "double input " << std::hexfloat << d);
  }
}

TEST_CASE("float16: conversion from double rounds once, not through float") {
  // Just above the midpoint between 1 and 1 + 2^-10: float rounds it down onto the midpoint,
  // and a second rounding would then tie to the even value 1.
  const double d = std::nextafter(1.0 + 0x1p-11, 2.0);
  REQUIRE(static_cast<double>(static_cast<float>(d)) == 1.0 + 0x1p-11);
  CHECK(float16_t(static_cast<float>(d)).bits == 0x3c00);
  CHECK(float16_t(d).bits == 0x3c01);
  // Same for a subnormal result.
  const double s = std::nextafter(0x1p-25, 1.0);
  REQUIRE(static_cast<double>(static_cast<float>(s)) == 0x1p-25);
  CHECK(float16_t(static_cast<float>(s)).bits == 0x0000);
  CHECK(float16_t(s).bits == 0x0001);
}

TEST_CASE("float16: overflow thresholds") {
  CHECK(float16_t(65504.0f).bits == 0x7bff);
  CHECK(float16_t(65519.99f).bits == 0x7bff);
  CHECK(float16_t(std::nextafter(65520.0f, 0.0f)).bits == 0x7bff);
  CHECK(float16_t(65520.0f).bits == 0x7c00);
  CHECK(float16_t(-65520.0f).bits == 0xfc00);
  CHECK(float16_t(std::nextafter(65520.0, 0.0)).bits == 0x7bff);
  CHECK(float16_t(65520.0).bits == 0x7c00);
  CHECK(float16_t(65536.0f).bits == 0x7c00);
  CHECK(float16_t(1e10f).bits == 0x7c00);
  CHECK(float16_t(1e300).bits == 0x7c00);
  CHECK(float16_t(-std::numeric_limits<float>::max()).bits == 0xfc00);
  CHECK(float16_t(std::numeric_limits<float>::infinity()).bits == 0x7c00);
  CHECK(float16_t(-std::numeric_limits<double>::infinity()).bits == 0xfc00);
  CHECK(std::isinf(static_cast<float>(float16_t::from_bits(0x7c00))));
}

TEST_CASE("float16: subnormals and signed zero") {
  CHECK(float16_t(0x1p-24f).bits == 0x0001);
  CHECK(float16_t(0x1p-25f).bits == 0x0000);  // tie to even zero
  CHECK(float16_t(std::nextafter(0x1p-25f, 1.0f)).bits == 0x0001);
  CHECK(float16_t(3 * 0x1p-25f).bits == 0x0002);  // tie between 1 and 2 ulps goes to 2
  CHECK(float16_t(5 * 0x1p-25f).bits == 0x0002);  // tie between 2 and 3 ulps goes to 2
  CHECK(float16_t(0x1p-14f).bits == 0x0400);
  CHECK(float16_t(0x1p-14f - 0x1p-24f).bits == 0x03ff);
  CHECK(float16_t(0x1p-14f - 0x1p-26f).bits == 0x0400);  // rounds up into the normal range
  CHECK(float16_t(std::numeric_limits<float>::denorm_min()).bits == 0x0000);
  CHECK(float16_t(-std::numeric_limits<float>::denorm_min()).bits == 0x8000);
  CHECK(static_cast<float>(float16_t::from_bits(0x0001)) == 0x1p-24f);
  CHECK(static_cast<float>(float16_t::from_bits(0x8200)) == -0x1p-15f);
  CHECK(float16_t(0.0f).bits == 0x0000);
  CHECK(float16_t(-0.0f).bits == 0x8000);
  CHECK(float16_t(-0.0).bits == 0x8000);
  CHECK(float16_t(-1e-10f).bits == 0x8000);
  CHECK(std::signbit(static_cast<float>(float16_t::from_bits(0x8000))));
}

TEST_CASE("float16: NaN stays NaN and is quiet") {
  const float qnan = std::numeric_limits<float>::quiet_NaN();
  CHECK(float16_t(qnan).is_nan());
  CHECK(float16_t(-qnan).bits == (float16_t(qnan).bits | 0x8000));
  // Payload only in the bits that are dropped: must not turn into infinity.
  const float low_payload = std::bit_cast<float>(0x7f800001U);
  CHECK(float16_t(low_payload).is_nan());
  CHECK((float16_t(low_payload).bits & 0x0200) != 0);
  CHECK(float16_t(std::numeric_limits<double>::signaling_NaN()).is_nan());
  CHECK(float16_t(std::bit_cast<double>(0x7ff0000000000001ULL)).is_nan());
  CHECK((float16_t(std::bit_cast<double>(0x7ff0000000000001ULL)).bits & 0x0200) != 0);
  CHECK(std::isnan(static_cast<float>(float16_t::from_bits(0x7c01))));
}

TEST_CASE("float16: equality has value semantics") {
  const auto nan = float16_t::from_bits(0x7e00);
  CHECK_FALSE(nan == nan);
  CHECK(nan != nan);
  CHECK(float16_t(0.0f) == float16_t(-0.0f));
  CHECK(float16_t(1.0f) == float16_t(1.0));
  CHECK(float16_t(1.0f) != float16_t(-1.0f));
  CHECK(float16_t::from_bits(0x7c00) == float16_t(1e9f));
  CHECK(float16_t::from_bits(0x7c00) != float16_t::from_bits(0xfc00));
}

TEST_CASE("float16 and bfloat16: integers convert with a single correct rounding") {
  CHECK(float16_t(1).bits == 0x3c00);
  CHECK(float16_t(-3).bits == 0xc200);
  CHECK(float16_t(2049).bits == 0x6800);  // tie between 2048 and 2050 goes to even 2048
  CHECK(float16_t(2051).bits == 0x6802);
  CHECK(float16_t(65519).bits == 0x7bff);
  CHECK(float16_t(65520u).bits == 0x7c00);
  CHECK(bfloat16_t(std::uint8_t{255}).bits == 0x437f);
  CHECK(bfloat16_t(std::int16_t{257}).bits == 0x4380);  // tie between 256 and 258: even 256
  CHECK(bfloat16_t(259L).bits == 0x4382);               // tie between 258 and 260: even 260
  // 2^62 + 2^54 + 1 is just above a bfloat16 midpoint. A plain conversion to double lands on the
  // midpoint and a second rounding would go down to 2^62.
  const std::int64_t big = (std::int64_t{1} << 62) + (std::int64_t{1} << 54) + 1;
  REQUIRE(static_cast<double>(big) == 0x1p62 + 0x1p54);
  CHECK(bfloat16_t(static_cast<double>(big)).bits == 0x5e80);
  CHECK(bfloat16_t(big).bits == 0x5e81);
  CHECK(bfloat16_t(-big).bits == 0xde81);
  CHECK(bfloat16_t(std::numeric_limits<std::int64_t>::min()).bits == 0xdf00);
  CHECK(bfloat16_t(std::numeric_limits<std::uint64_t>::max()).bits == 0x5f80);
}

TEST_CASE("bfloat16: every bit pattern converts to its exact float value and back") {
  for (std::uint32_t b = 0; b <= 0xffff; ++b) {
    const auto h = static_cast<std::uint16_t>(b);
    const float f = static_cast<float>(bfloat16_t::from_bits(h));
    CHECK(std::bit_cast<std::uint32_t>(dtrain::detail::bf16_to_float(h)) ==
          std::bit_cast<std::uint32_t>(f));
    if (bf16_format.is_nan(h)) {
      REQUIRE(std::isnan(f));
      const std::uint16_t back = bfloat16_t(f).bits;
      CHECK(bf16_format.is_nan(back));
      CHECK((back & 0x8000) == (h & 0x8000));
      CHECK((back & bf16_format.quiet_bit()) != 0);
      if (h & bf16_format.quiet_bit()) CHECK(back == h);
      CHECK(bf16_format.is_nan(bfloat16_t(static_cast<double>(f)).bits));
      continue;
    }
    REQUIRE_MESSAGE(static_cast<double>(f) == bf16_format.value(h), "bits 0x" << std::hex << b);
    CHECK(std::signbit(f) == ((h & 0x8000) != 0));
    REQUIRE_MESSAGE(bfloat16_t(f).bits == h, "bits 0x" << std::hex << b);
    REQUIRE_MESSAGE(bfloat16_t(static_cast<double>(f)).bits == h, "bits 0x" << std::hex << b);
    CHECK(dtrain::detail::float_to_bf16(f) == h);
  }
}

TEST_CASE("bfloat16: rounding at every midpoint and its neighbours matches the reference") {
  const std::vector<double> ladder = bf16_format.ladder();
  REQUIRE(ladder.size() == 0x7f81);
  for_each_boundary_input(ladder, [&](double x) {
    const std::uint16_t want = reference_round(ladder, x);
    REQUIRE_MESSAGE(bfloat16_t(x).bits == want, "double input " << std::hexfloat << x);
    const auto xf = static_cast<float>(x);
    if (std::isinf(xf) && !std::isinf(x)) return;  // beyond float's range; covered by doubles
    REQUIRE_MESSAGE(bfloat16_t(xf).bits == reference_round(ladder, xf),
                    "float input " << std::hexfloat << xf);
  });
}

TEST_CASE("bfloat16: a sweep over float32 bit patterns matches the reference") {
  const std::vector<double> ladder = bf16_format.ladder();
  for (std::uint64_t u = 0; u <= 0x7f800000U; u += 4099) {
    const float f = std::bit_cast<float>(static_cast<std::uint32_t>(u));
    const std::uint16_t want = reference_round(ladder, f);
    REQUIRE_MESSAGE(bfloat16_t(f).bits == want, "float bits 0x" << std::hex << u);
    REQUIRE(bfloat16_t(-f).bits == (want | 0x8000));
  }
}

TEST_CASE("bfloat16: conversion from double rounds once, not through float") {
  const double mid = 1.0 + 0x1p-8;  // between 1 and 1 + 2^-7
  const double d = std::nextafter(mid, 2.0);
  REQUIRE(static_cast<double>(static_cast<float>(d)) == mid);
  CHECK(bfloat16_t(static_cast<float>(d)).bits == 0x3f80);
  CHECK(bfloat16_t(d).bits == 0x3f81);
}

TEST_CASE("bfloat16: overflow, subnormals, signed zero, NaN, equality") {
  CHECK(bfloat16_t(std::numeric_limits<float>::max()).bits == 0x7f80);  // past the midpoint
  CHECK(bfloat16_t(std::bit_cast<float>(0x7f7f7fffU)).bits == 0x7f7f);
  CHECK(bfloat16_t(std::bit_cast<float>(0x7f7f8000U)).bits == 0x7f80);  // tie to even: inf
  CHECK(bfloat16_t(1e39).bits == 0x7f80);
  CHECK(bfloat16_t(-1e39).bits == 0xff80);
  CHECK(bfloat16_t(std::bit_cast<float>(0x00018000U)).bits == 0x0002);  // subnormal tie, odd
  CHECK(bfloat16_t(std::bit_cast<float>(0x00008000U)).bits == 0x0000);  // subnormal tie, even
  CHECK(bfloat16_t(0x1p-133).bits == 0x0001);
  CHECK(bfloat16_t(0x1p-134).bits == 0x0000);
  CHECK(bfloat16_t(std::nextafter(0x1p-134, 1.0)).bits == 0x0001);
  CHECK(bfloat16_t(-0.0f).bits == 0x8000);
  CHECK(bfloat16_t(-0.0).bits == 0x8000);
  CHECK(bfloat16_t(0.0f) == bfloat16_t(-0.0f));
  const float low_payload = std::bit_cast<float>(0x7f800001U);
  CHECK(bfloat16_t(low_payload).is_nan());
  CHECK(bfloat16_t(std::numeric_limits<double>::quiet_NaN()).is_nan());
  const auto nan = bfloat16_t::from_bits(0x7fc0);
  CHECK_FALSE(nan == nan);
  CHECK(bfloat16_t(2.0f) == bfloat16_t(2.0));
  CHECK(bfloat16_t(2.0f) != bfloat16_t(-2.0f));
}

// Note [Vectorized float16]: the array functions (F16C where the CPU has it) give the scalar
// conversions' bits for every value but NaN payloads, at every length (the vector body and the
// scalar tail).
namespace {
bool same_half(std::uint16_t a, std::uint16_t b) {
  const bool a_nan = (a & 0x7c00U) == 0x7c00U && (a & 0x3ffU) != 0;
  const bool b_nan = (b & 0x7c00U) == 0x7c00U && (b & 0x3ffU) != 0;
  if (a_nan || b_nan) return a_nan && b_nan && (a & 0x200U) && (b & 0x200U);  // quiet NaNs
  return a == b;
}
}  // namespace

TEST_CASE("float16 arrays: every bit pattern widens as the scalar conversion does") {
#if DTRAIN_F16C_DISPATCH
  MESSAGE("F16C in use: " << dtrain::detail::cpu_has_f16c());
#endif
  std::vector<std::uint16_t> all(65536);
  for (std::uint32_t h = 0; h < 65536; ++h) all[h] = static_cast<std::uint16_t>(h);
  std::vector<float> wide(all.size() + 3);
  dtrain::detail::halves_to_floats(all.data(), wide.data(), 65536);
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const float want = dtrain::detail::half_to_float(static_cast<std::uint16_t>(h));
    if (std::isnan(want)) {
      CHECK(std::isnan(wide[h]));
    } else if (std::bit_cast<std::uint32_t>(wide[h]) != std::bit_cast<std::uint32_t>(want)) {
      FAIL_CHECK("half " << std::hex << h);
    }
  }
}

TEST_CASE("float16 arrays: a sweep over float32 bit patterns narrows as the scalar one does") {
  std::vector<float> src;
  for (std::uint64_t u = 0; u <= 0xffffffffULL; u += 65521)  // a prime stride: every exponent
    src.push_back(std::bit_cast<float>(static_cast<std::uint32_t>(u)));
  for (float f : {65504.0f, 65519.99f, 65520.0f, 6.0e-8f, 2.9802322e-8f, -0.0f})
    src.push_back(f);
  for (std::int64_t n : {std::int64_t{0}, std::int64_t{7}, std::int64_t{8}, std::int64_t{13},
                         static_cast<std::int64_t>(src.size())}) {
    std::vector<std::uint16_t> got(static_cast<std::size_t>(n) + 1, 0xabcdU);
    dtrain::detail::floats_to_halves(src.data(), got.data(), n);
    int wrong = 0;
    for (std::int64_t i = 0; i < n; ++i)
      wrong += !same_half(got[i], dtrain::detail::float_to_half(src[i]));
    CHECK(wrong == 0);
    CHECK(got[n] == 0xabcdU);  // nothing written past the end
  }
}

TEST_CASE("float16 arrays: sums and scaled sums round once, as the scalar reduction does") {
  std::mt19937 rng(7);
  std::uniform_int_distribution<std::uint32_t> bits(0, 0xffff);
  const std::int64_t n = 100003;
  std::vector<std::uint16_t> a(n), b(n);
  for (std::int64_t i = 0; i < n; ++i) {
    a[i] = static_cast<std::uint16_t>(bits(rng));
    b[i] = static_cast<std::uint16_t>(bits(rng));
  }
  for (float factor : {1.0f, 0.5f, 1.0f / 3.0f}) {
    std::vector<std::uint16_t> got = b;
    dtrain::detail::add_halves(a.data(), got.data(), n, factor);
    int wrong = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      const float sum = dtrain::detail::half_to_float(a[i]) + dtrain::detail::half_to_float(b[i]);
      wrong += !same_half(got[i], dtrain::detail::float_to_half(sum * factor));
    }
    CHECK(wrong == 0);
  }
}
