#pragma once
// The dense linear algebra a Gaussian process needs: a symmetric matrix, its Cholesky factor
// (with jitter when rounding makes it indefinite), and triangular solves.
//
// Note [Own linear algebra]
// The matrices are at most a few dozen rows (one row per measured configuration; 20 by default),
// and the only operations are a Cholesky factorization and triangular solves: about a hundred
// lines, tested against closed forms. Eigen would do the same with a dependency every user of the
// installed package must then find (and a find_dependency in our CMake config) for no speed that
// matters at this size, so we write it ourselves.
#include <cmath>
#include <cstddef>
#include <optional>
#include <span>
#include <vector>

namespace dtrain::autotune {

// Row-major dense matrix of doubles.
class Matrix {
 public:
  Matrix() = default;
  Matrix(std::size_t rows, std::size_t cols, double value = 0.0)
      : rows_(rows), cols_(cols), data_(rows * cols, value) {}

  std::size_t rows() const noexcept { return rows_; }
  std::size_t cols() const noexcept { return cols_; }
  double& operator()(std::size_t r, std::size_t c) noexcept { return data_[r * cols_ + c]; }
  double operator()(std::size_t r, std::size_t c) const noexcept { return data_[r * cols_ + c]; }

 private:
  std::size_t rows_ = 0;
  std::size_t cols_ = 0;
  std::vector<double> data_;
};

// The lower-triangular L with L L^T = A + jitter * I.
struct CholeskyFactor {
  Matrix lower;
  double jitter = 0.0;
};

namespace detail {

// Factorizes in place (lower triangle; the strict upper triangle is zeroed). Returns false when a
// pivot is not positive and finite, i.e. the matrix is not numerically positive definite.
inline bool cholesky_in_place(Matrix& a) {
  const std::size_t n = a.rows();
  for (std::size_t j = 0; j < n; ++j) {
    double pivot = a(j, j);
    for (std::size_t k = 0; k < j; ++k) pivot -= a(j, k) * a(j, k);
    if (!(pivot > 0.0) || !std::isfinite(pivot)) return false;
    const double ljj = std::sqrt(pivot);
    a(j, j) = ljj;
    for (std::size_t i = j + 1; i < n; ++i) {
      double s = a(i, j);
      for (std::size_t k = 0; k < j; ++k) s -= a(i, k) * a(j, k);
      a(i, j) = s / ljj;
    }
    for (std::size_t c = j + 1; c < n; ++c) a(j, c) = 0.0;
  }
  return true;
}

}  // namespace detail

// Note [Cholesky jitter]
// A kernel matrix with little noise and two nearby inputs is positive definite in exact
// arithmetic but can lose that in rounding. We first try the matrix as it is; failing that, we
// add jitter to the diagonal, starting at 1e-10 of the mean diagonal and growing tenfold up to
// 1e-4 of it (a perturbation far below the noise the tuner's scores carry). A matrix that still
// fails (non-finite entries, or truly indefinite) gives nullopt and the caller treats those
// kernel parameters as impossible.
inline std::optional<CholeskyFactor> cholesky(const Matrix& a) {
  const std::size_t n = a.rows();
  if (n != a.cols()) return std::nullopt;
  CholeskyFactor f{a, 0.0};
  if (detail::cholesky_in_place(f.lower)) return f;

  double mean_diagonal = 0.0;
  for (std::size_t i = 0; i < n; ++i) mean_diagonal += a(i, i) / static_cast<double>(n);
  if (!(mean_diagonal > 0.0) || !std::isfinite(mean_diagonal)) return std::nullopt;
  for (double jitter = 1e-10 * mean_diagonal; jitter <= 1e-4 * mean_diagonal * 1.0001;
       jitter *= 10.0) {
    f.lower = a;
    for (std::size_t i = 0; i < n; ++i) f.lower(i, i) += jitter;
    if (detail::cholesky_in_place(f.lower)) {
      f.jitter = jitter;
      return f;
    }
  }
  return std::nullopt;
}

// x with L x = b.
inline std::vector<double> solve_lower(const Matrix& lower, std::span<const double> b) {
  const std::size_t n = lower.rows();
  std::vector<double> x(b.begin(), b.end());
  for (std::size_t i = 0; i < n; ++i) {
    double s = x[i];
    for (std::size_t k = 0; k < i; ++k) s -= lower(i, k) * x[k];
    x[i] = s / lower(i, i);
  }
  return x;
}

// x with L^T x = b.
inline std::vector<double> solve_lower_transposed(const Matrix& lower, std::span<const double> b) {
  const std::size_t n = lower.rows();
  std::vector<double> x(b.begin(), b.end());
  for (std::size_t i = n; i-- > 0;) {
    double s = x[i];
    for (std::size_t k = i + 1; k < n; ++k) s -= lower(k, i) * x[k];
    x[i] = s / lower(i, i);
  }
  return x;
}

// log det(L L^T), summed from the factor's diagonal so it neither overflows nor underflows.
inline double log_determinant(const CholeskyFactor& f) {
  double s = 0.0;
  for (std::size_t i = 0; i < f.lower.rows(); ++i) s += std::log(f.lower(i, i));
  return 2.0 * s;
}

}  // namespace dtrain::autotune
