// CRC-32C against the published check values (RFC 3720 appendix B.4 and the "123456789" check
// value of the CRC catalogue), and the hardware and table versions against each other on every
// length and alignment the 8-byte loops treat differently.
#include "dtrain/core/crc32c.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string_view>
#include <vector>

using dtrain::detail::crc32c;
using dtrain::detail::crc32c_extend;
using dtrain::detail::crc32c_extend_portable;

TEST_CASE("crc32c: published check values") {
  const std::string_view digits = "123456789";
  CHECK(crc32c(digits.data(), digits.size()) == 0xE3069283u);
  CHECK(crc32c_extend_portable(0, digits.data(), digits.size()) == 0xE3069283u);

  unsigned char bytes[32];
  std::memset(bytes, 0, sizeof bytes);
  CHECK(crc32c(bytes, 32) == 0x8A9136AAu);
  std::memset(bytes, 0xFF, sizeof bytes);
  CHECK(crc32c(bytes, 32) == 0x62A8AB43u);
  for (int i = 0; i < 32; ++i) bytes[i] = static_cast<unsigned char>(i);
  CHECK(crc32c(bytes, 32) == 0x46DD794Eu);
  for (int i = 0; i < 32; ++i) bytes[i] = static_cast<unsigned char>(31 - i);
  CHECK(crc32c(bytes, 32) == 0x113FDB5Cu);
  CHECK(crc32c(bytes, 0) == 0u);
}

TEST_CASE("crc32c: every length and offset, in pieces, equals the one-shot table version") {
  std::mt19937_64 gen(7);
  std::vector<unsigned char> data(300);
  for (auto& b : data) b = static_cast<unsigned char>(gen());
  for (std::size_t offset = 0; offset < 9; ++offset) {
    for (std::size_t n = 0; n + offset <= data.size(); n += 1 + n / 16) {
      CAPTURE(offset);
      CAPTURE(n);
      const unsigned char* p = data.data() + offset;
      const std::uint32_t reference = crc32c_extend_portable(0, p, n);
      CHECK(crc32c(p, n) == reference);
      const std::size_t cut = n / 3;
      CHECK(crc32c_extend(crc32c(p, cut), p + cut, n - cut) == reference);
    }
  }
}

TEST_CASE("crc32c: any single flipped bit changes it") {
  std::vector<unsigned char> data(64, 0x5A);
  const std::uint32_t clean = crc32c(data.data(), data.size());
  for (std::size_t bit = 0; bit < data.size() * 8; ++bit) {
    data[bit / 8] ^= static_cast<unsigned char>(1u << (bit % 8));
    CHECK(crc32c(data.data(), data.size()) != clean);
    data[bit / 8] ^= static_cast<unsigned char>(1u << (bit % 8));
  }
}
