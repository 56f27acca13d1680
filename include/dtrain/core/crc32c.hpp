#pragma once
// CRC-32C (Castagnoli): the checksum of every checkpoint file.
//
// Note [Why CRC-32C]
// A checkpoint must be rejected when a crash, a full disk or a stray copy left it torn or altered.
// CRC-32C detects every burst error up to 32 bits and all but 2^-32 of random corruptions, which
// is what a torn or bit-flipped file looks like; it is not a defence against tampering. It is the
// polynomial of iSCSI, ext4 and SSE4.2's crc32 instruction, so on x86-64 it runs in hardware
// (checked once at run time); elsewhere an 8-bytes-at-a-time table version does. Both compute the
// same function; the tests pin it to the published check values.
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>
#define DTRAIN_CRC32C_HAVE_SSE42 1
#endif

namespace dtrain::detail {

inline constexpr std::uint32_t crc32c_polynomial = 0x82F63B78u;  // reflected 0x1EDC6F41

// table[0] is the classic byte table; table[k][b] is the CRC of byte b followed by k zero bytes,
// which lets the loop below fold eight bytes per round.
constexpr std::array<std::array<std::uint32_t, 256>, 8> make_crc32c_tables() {
  std::array<std::array<std::uint32_t, 256>, 8> t{};
  for (std::uint32_t b = 0; b < 256; ++b) {
    std::uint32_t c = b;
    for (int i = 0; i < 8; ++i) c = (c >> 1) ^ ((c & 1u) ? crc32c_polynomial : 0u);
    t[0][b] = c;
  }
  for (std::size_t k = 1; k < 8; ++k)
    for (std::size_t b = 0; b < 256; ++b) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xFFu];
  return t;
}

inline constexpr auto crc32c_tables = make_crc32c_tables();

// Continues `crc` (the CRC-32C of the bytes before) over n more bytes, in portable C++.
inline std::uint32_t crc32c_extend_portable(std::uint32_t crc, const void* data,
                                            std::size_t n) noexcept {
  const auto* p = static_cast<const unsigned char*>(data);
  const auto& t = crc32c_tables;
  crc = ~crc;
  if constexpr (std::endian::native == std::endian::little) {
    for (; n >= 8; n -= 8, p += 8) {
      std::uint64_t word;
      std::memcpy(&word, p, 8);
      word ^= crc;
      crc = t[7][word & 0xFF] ^ t[6][(word >> 8) & 0xFF] ^ t[5][(word >> 16) & 0xFF] ^
            t[4][(word >> 24) & 0xFF] ^ t[3][(word >> 32) & 0xFF] ^ t[2][(word >> 40) & 0xFF] ^
            t[1][(word >> 48) & 0xFF] ^ t[0][word >> 56];
    }
  }
  for (; n > 0; --n, ++p) crc = (crc >> 8) ^ t[0][(crc ^ *p) & 0xFFu];
  return ~crc;
}

#ifdef DTRAIN_CRC32C_HAVE_SSE42
__attribute__((target("sse4.2"))) inline std::uint32_t crc32c_extend_sse42(
    std::uint32_t crc, const void* data, std::size_t n) noexcept {
  const auto* p = static_cast<const unsigned char*>(data);
  std::uint64_t c = ~crc;
  for (; n >= 8; n -= 8, p += 8) {
    std::uint64_t word;
    std::memcpy(&word, p, 8);
    c = _mm_crc32_u64(c, word);
  }
  auto c32 = static_cast<std::uint32_t>(c);
  for (; n > 0; --n, ++p) c32 = _mm_crc32_u8(c32, *p);
  return ~c32;
}
#endif

// Whether crc32c_extend uses the processor's crc32 instruction.
inline bool crc32c_in_hardware() noexcept {
#ifdef DTRAIN_CRC32C_HAVE_SSE42
  static const bool supported = __builtin_cpu_supports("sse4.2");
  return supported;
#else
  return false;
#endif
}

// crc32c_extend(crc32c_extend(0, a), b) is the CRC-32C of a followed by b.
inline std::uint32_t crc32c_extend(std::uint32_t crc, const void* data, std::size_t n) noexcept {
#ifdef DTRAIN_CRC32C_HAVE_SSE42
  if (crc32c_in_hardware()) return crc32c_extend_sse42(crc, data, n);
#endif
  return crc32c_extend_portable(crc, data, n);
}

inline std::uint32_t crc32c(const void* data, std::size_t n) noexcept {
  return crc32c_extend(0, data, n);
}

}  // namespace dtrain::detail
