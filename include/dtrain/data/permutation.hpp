#pragma once
// Deterministic shuffling shared by the samplers and the file sharder.
//
// Note [Portable shuffling]
// Every rank computes the same global order independently and then takes its own share, so the
// order must be a pure function of (seed, epoch) that is bit-identical across processes,
// compilers and standard libraries. std::shuffle and std::uniform_int_distribution are
// implementation-defined (libstdc++ and libc++ draw different numbers from the same engine), so
// they cannot be used. std::mt19937_64 is fully specified by the standard, including its seeding
// from one integer, so it is the engine; on top of it we use our own unbiased bounded integer
// (rejection of the biased low range, "threshold = 2^64 mod n") and our own Fisher-Yates. The
// engine is spelled out here (Mt19937_64, the standard's algorithm and seeding, checked against
// std::mt19937_64 by the tests) so that the samplers' header does not pull <random> into every
// file that includes <dtrain/dtrain.hpp>.
// (seed, epoch) is hashed with splitmix64 before seeding so that neighbouring pairs such as
// (seed 1, epoch 0) and (seed 0, epoch 1) give unrelated orders (seed + epoch would not).
// Changing anything here changes every user's data order; the golden-value tests pin it.
#include <cstddef>
#include <cstdint>
#include <array>
#include <utility>
#include <vector>

namespace dtrain::detail {

// splitmix64 finalizer: a bijective mix with good avalanche, used only to derive engine seeds.
constexpr std::uint64_t splitmix64(std::uint64_t x) noexcept {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

constexpr std::uint64_t mix_seed(std::uint64_t seed, std::uint64_t epoch) noexcept {
  return splitmix64(seed ^ splitmix64(epoch));
}

// The 64-bit Mersenne Twister with the parameters and the seeding of std::mt19937_64
// ([rand.eng.mers], [rand.predef]): the same numbers from the same seed.
class Mt19937_64 {
 public:
  explicit Mt19937_64(std::uint64_t seed) noexcept {
    state_[0] = seed;
    for (std::size_t i = 1; i < n; ++i)
      state_[i] = 6364136223846793005ULL * (state_[i - 1] ^ (state_[i - 1] >> 62)) + i;
    index_ = n;
  }

  std::uint64_t operator()() noexcept {
    if (index_ >= n) twist();
    std::uint64_t x = state_[index_++];
    x ^= (x >> 29) & 0x5555555555555555ULL;
    x ^= (x << 17) & 0x71D67FFFEDA60000ULL;
    x ^= (x << 37) & 0xFFF7EEE000000000ULL;
    return x ^ (x >> 43);
  }

 private:
  static constexpr std::size_t n = 312, m = 156;
  static constexpr std::uint64_t upper = 0xFFFFFFFF80000000ULL, lower = 0x7FFFFFFFULL;

  void twist() noexcept {
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint64_t y = (state_[i] & upper) | (state_[(i + 1) % n] & lower);
      state_[i] = state_[(i + m) % n] ^ (y >> 1) ^ ((y & 1) ? 0xB5026F5AA96619E9ULL : 0);
    }
    index_ = 0;
  }

  std::array<std::uint64_t, n> state_{};
  std::size_t index_ = n;
};

inline Mt19937_64 make_engine(std::uint64_t seed, std::int64_t epoch) {
  return Mt19937_64(mix_seed(seed, static_cast<std::uint64_t>(epoch)));
}

// Uniform integer in [0, bound), bound >= 1, without modulo bias. Values below
// threshold = 2^64 mod bound are rejected so the accepted range is a multiple of bound.
inline std::uint64_t uniform_below(Mt19937_64& engine, std::uint64_t bound) {
  const std::uint64_t threshold = (0 - bound) % bound;
  for (;;) {
    const std::uint64_t x = engine();
    if (x >= threshold) return x % bound;
  }
}

// Fisher-Yates from the back: position i swaps with a uniform j in [0, i].
template <class T>
void shuffle_in_place(std::vector<T>& values, Mt19937_64& engine) {
  for (std::size_t i = values.size(); i > 1; --i) {
    const auto j = static_cast<std::size_t>(uniform_below(engine, i));
    using std::swap;
    swap(values[i - 1], values[j]);
  }
}

// 0..n-1, shuffled with the given engine.
inline std::vector<std::int64_t> random_permutation(std::int64_t n, Mt19937_64& engine) {
  std::vector<std::int64_t> order(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) order[static_cast<std::size_t>(i)] = i;
  shuffle_in_place(order, engine);
  return order;
}

inline std::vector<std::int64_t> identity_permutation(std::int64_t n) {
  std::vector<std::int64_t> order(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) order[static_cast<std::size_t>(i)] = i;
  return order;
}

}  // namespace dtrain::detail
