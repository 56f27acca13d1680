#pragma once
// Where the optimizer's points come from: a seeded pseudo-random generator whose output is the
// same on every platform, and a low-discrepancy sequence that covers [0,1]^d evenly with few
// points (the initial design and the acquisition function's candidates).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace dtrain::autotune {

// SplitMix64 (Steele, Lea and Flood, 2014). Written out rather than std::uniform_real_distribution,
// whose output the standard leaves to each library: the same seed gives the same tuning run (and
// the same test outcome) with every compiler.
class Random {
 public:
  explicit Random(std::uint64_t seed) : state_(seed) {}

  std::uint64_t next() noexcept {
    std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }

  // Uniform on [0, 1), 53 random bits.
  double uniform() noexcept { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

  std::vector<double> uniform_point(std::size_t dimension) {
    std::vector<double> p(dimension);
    for (double& v : p) v = uniform();
    return p;
  }

 private:
  std::uint64_t state_;
};

// Note [Kronecker sequence]
// The R_d sequence (Roberts, 2018): point n is frac(offset + n * alpha) with alpha_j = phi^-(j+1)
// and phi the positive root of x^(d+1) = x + 1 (the golden ratio for d = 1). Its points fill
// [0,1]^d with low discrepancy in any dimension and any prefix length, which is all a search
// design needs; a random offset (drawn from the seed) makes each run's points different while
// keeping that evenness.
class KroneckerSequence {
 public:
  KroneckerSequence(std::size_t dimension, std::vector<double> offset)
      : alpha_(dimension), offset_(std::move(offset)) {
    offset_.resize(dimension, 0.5);
    double phi = 2.0;  // Newton's method on x^(d+1) - x - 1 from above converges monotonically
    const double d1 = static_cast<double>(dimension) + 1.0;
    for (int i = 0; i < 60; ++i) {
      phi -= (std::pow(phi, d1) - phi - 1.0) / (d1 * std::pow(phi, d1 - 1.0) - 1.0);
    }
    for (std::size_t j = 0; j < dimension; ++j) {
      alpha_[j] = std::fmod(std::pow(1.0 / phi, static_cast<double>(j + 1)), 1.0);
    }
  }

  std::vector<double> point(std::size_t n) const {
    std::vector<double> p(alpha_.size());
    for (std::size_t j = 0; j < p.size(); ++j) {
      const double v = offset_[j] + static_cast<double>(n) * alpha_[j];
      p[j] = v - std::floor(v);
    }
    return p;
  }

  std::size_t dimension() const noexcept { return alpha_.size(); }

 private:
  std::vector<double> alpha_;
  std::vector<double> offset_;
};

}  // namespace dtrain::autotune
