#pragma once
// FNV-1a, 64 bits: the one hash dtrain uses to turn a name into a number ranks compare or a key
// files carry (a tensor set, a job). Not a checksum: files are checked with CRC-32C (crc32c.hpp).
#include <cstdint>
#include <string_view>

namespace dtrain::detail {

inline constexpr std::uint64_t fnv1a_offset_basis = 0xcbf29ce484222325ULL;

// Continues from `h`, so pieces can be hashed one after another.
constexpr std::uint64_t fnv1a(std::string_view bytes, std::uint64_t h = fnv1a_offset_basis) {
  for (const char c : bytes) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ULL;
  }
  return h;
}

}  // namespace dtrain::detail
