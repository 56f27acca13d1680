#pragma once
// The arithmetic of PowerSGD (Note [PowerSGD] in train/powersgd.hpp), internal: the random Q, the
// products with a gradient seen as an n x m matrix, accumulated in double, and Gram-Schmidt.
// Matrices are row-major; P is n x r, Q is m x r.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <random>
#include <string_view>
#include <vector>

#include "dtrain/core/fnv1a.hpp"

namespace dtrain::detail {

inline std::uint64_t powersgd_mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// The standard normal draw a gradient's Q starts from (cols x rank, row-major). The generator is
// ours: std::normal_distribution's algorithm is the library's choice, mt19937_64's output is not,
// so every rank draws the same Q whatever standard library it was built with.
inline std::vector<double> powersgd_random_q(std::uint64_t seed, std::string_view name,
                                             std::int64_t step, std::int64_t cols, int rank) {
  std::uint64_t key = powersgd_mix(seed);
  key = powersgd_mix(key ^ fnv1a(name));
  key = powersgd_mix(key ^ static_cast<std::uint64_t>(step));
  std::mt19937_64 gen(key);
  std::vector<double> q(static_cast<std::size_t>(cols * rank));
  for (std::size_t i = 0; i < q.size(); i += 2) {
    const double u1 = static_cast<double>((gen() >> 11) + 1) * 0x1p-53;  // (0, 1]: log is finite
    const double u2 = static_cast<double>(gen() >> 11) * 0x1p-53;
    const double radius = std::sqrt(-2.0 * std::log(u1));
    q[i] = radius * std::cos(2 * std::numbers::pi * u2);
    if (i + 1 < q.size()) q[i + 1] = radius * std::sin(2 * std::numbers::pi * u2);
  }
  return q;
}

// Gram-Schmidt on the columns of a row-major rows x r matrix, as c10d's _orthogonalize. A zero
// column stays zero: with epsilon 0 it would otherwise become NaN and poison the gradient.
inline void orthonormalize(std::vector<double>& a, std::int64_t rows, int r, double epsilon) {
  for (int i = 0; i < r; ++i) {
    double sq = 0;
    for (std::int64_t row = 0; row < rows; ++row) sq += a[row * r + i] * a[row * r + i];
    if (sq == 0) continue;
    const double d = std::sqrt(sq) + epsilon;
    for (std::int64_t row = 0; row < rows; ++row) a[row * r + i] /= d;
    for (int j = i + 1; j < r; ++j) {
      double dot = 0;
      for (std::int64_t row = 0; row < rows; ++row) dot += a[row * r + i] * a[row * r + j];
      for (std::int64_t row = 0; row < rows; ++row) a[row * r + j] -= dot * a[row * r + i];
    }
  }
}

inline bool has_zero_column(const std::vector<double>& a, std::int64_t rows, int r) {
  for (int i = 0; i < r; ++i) {
    bool zero = true;
    for (std::int64_t row = 0; zero && row < rows; ++row) zero = a[row * r + i] == 0;
    if (zero) return true;
  }
  return false;
}

// P = M Q (n x r), accumulated in double, stored in T for the wire.
template <class T>
void multiply_m_q(const T* m_data, std::int64_t n, std::int64_t m, int r,
                  const std::vector<double>& q, T* p) {
  std::vector<double> acc(static_cast<std::size_t>(r));
  for (std::int64_t i = 0; i < n; ++i) {
    std::fill(acc.begin(), acc.end(), 0.0);
    const T* row = m_data + i * m;
    for (std::int64_t j = 0; j < m; ++j) {
      const double v = static_cast<double>(row[j]);
      for (int k = 0; k < r; ++k) acc[k] += v * q[j * r + k];
    }
    for (int k = 0; k < r; ++k) p[i * r + k] = static_cast<T>(acc[k]);
  }
}

// Q = M^T P (m x r), row by row of M so that M is read in order.
template <class T>
void multiply_mt_p(const T* m_data, std::int64_t n, std::int64_t m, int r,
                   const std::vector<double>& p, T* q) {
  std::vector<double> acc(static_cast<std::size_t>(m * r), 0.0);
  for (std::int64_t i = 0; i < n; ++i) {
    const T* row = m_data + i * m;
    for (std::int64_t j = 0; j < m; ++j) {
      const double v = static_cast<double>(row[j]);
      for (int k = 0; k < r; ++k) acc[j * r + k] += v * p[i * r + k];
    }
  }
  for (std::size_t x = 0; x < acc.size(); ++x) q[x] = static_cast<T>(acc[x]);
}

// The gradient becomes P Q^T; the error (if kept) M - P Q^T / scale, read before it is overwritten.
template <class T>
void decompress_into(T* g, std::int64_t n, std::int64_t m, int r, const std::vector<double>& p,
                     const T* q, T* error, double scale) {
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t j = 0; j < m; ++j) {
      double approx = 0;
      for (int k = 0; k < r; ++k) approx += p[i * r + k] * static_cast<double>(q[j * r + k]);
      T& x = g[i * m + j];
      if (error) error[i * m + j] = static_cast<T>(static_cast<double>(x) - approx / scale);
      x = static_cast<T>(approx);
    }
}

}  // namespace dtrain::detail
