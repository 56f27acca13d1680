#pragma once
// Gaussian-process regression with fixed kernel parameters: the posterior mean and variance at a
// point, and the log marginal likelihood of the data (what hyperparameter fitting maximizes).
//
// Note [Standardized outputs]
// Observations are standardized before the fit: their mean becomes the prior mean and their
// (population) standard deviation the unit, so kernel parameters and their bounds mean the same
// whatever the scores' units. With one observation, or all equal, the unit is 1. Predictions are
// returned in the caller's units; the log marginal likelihood is that of the standardized values
// (it differs from the raw one by a constant, n log(scale), that no kernel parameter changes).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <numbers>
#include <span>
#include <utility>
#include <vector>

#include "dtrain/autotune/cholesky.hpp"
#include "dtrain/autotune/matern_kernel.hpp"
#include "dtrain/core/error.hpp"

namespace dtrain::autotune {

using Points = std::vector<std::vector<double>>;

struct Standardized {
  std::vector<double> values;
  double mean = 0.0;
  double scale = 1.0;
};

inline Standardized standardize(std::span<const double> y) {
  Standardized s;
  if (y.empty()) return s;
  for (double v : y) s.mean += v;
  s.mean /= static_cast<double>(y.size());
  double var = 0.0;
  for (double v : y) var += (v - s.mean) * (v - s.mean);
  var /= static_cast<double>(y.size());
  const double sd = std::sqrt(var);
  // Relative to the values' size, so equal values that differ by rounding count as equal.
  s.scale = sd > 1e-12 * std::max(1.0, std::abs(s.mean)) ? sd : 1.0;
  s.values.reserve(y.size());
  for (double v : y) s.values.push_back((v - s.mean) / s.scale);
  return s;
}

namespace detail {

inline Matrix kernel_matrix(const Points& x, const KernelParams& p) {
  const std::size_t n = x.size();
  Matrix k(n, n);
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t j = 0; j <= i; ++j) {
      const double v = matern52(x[i], x[j], p);
      k(i, j) = v;
      k(j, i) = v;
    }
    k(i, i) += p.noise_variance;
  }
  return k;
}

// K^{-1} y through the factor: two triangular solves, never an explicit inverse.
inline std::vector<double> solve_with(const CholeskyFactor& f, std::span<const double> y) {
  return solve_lower_transposed(f.lower, solve_lower(f.lower, y));
}

inline double log_marginal_likelihood(const CholeskyFactor& f, std::span<const double> y,
                                      std::span<const double> alpha) {
  double fit = 0.0;
  for (std::size_t i = 0; i < y.size(); ++i) fit += y[i] * alpha[i];
  const double n = static_cast<double>(y.size());
  return -0.5 * fit - 0.5 * log_determinant(f) - 0.5 * n * std::log(2.0 * std::numbers::pi);
}

}  // namespace detail

// log p(y | x, params) for already standardized y; -infinity where the kernel matrix cannot be
// factorized (the parameters are then simply a bad choice for the fit).
inline double log_marginal_likelihood(const Points& x, std::span<const double> y,
                                      const KernelParams& params) {
  const auto f = cholesky(detail::kernel_matrix(x, params));
  if (!f) return -std::numeric_limits<double>::infinity();
  const std::vector<double> alpha = detail::solve_with(*f, y);
  const double l = detail::log_marginal_likelihood(*f, y, alpha);
  return std::isfinite(l) ? l : -std::numeric_limits<double>::infinity();
}

class GaussianProcess {
 public:
  struct Prediction {
    double mean = 0.0;
    double variance = 0.0;  // of the function value, without observation noise
  };

  // Throws InvalidArgumentError for empty, ragged or non-finite data and for kernel parameters
  // that cannot describe it (the kernel matrix cannot be factorized even with jitter).
  GaussianProcess(Points x, std::span<const double> y, KernelParams params)
      : x_(std::move(x)), params_(std::move(params)) {
    if (x_.empty() || x_.size() != y.size()) {
      throw InvalidArgumentError(fmt::format(
          "dtrain: autotune: a Gaussian process needs one observation per input point, got {} "
          "points and {} observations",
          x_.size(), y.size()));
    }
    const std::size_t d = x_.front().size();
    if (params_.length_scales.size() != d) {
      throw InvalidArgumentError(
          fmt::format("dtrain: autotune: {} length scales for {}-dimensional inputs",
                      params_.length_scales.size(), d));
    }
    for (const auto& p : x_) {
      if (p.size() != d) {
        throw InvalidArgumentError(fmt::format(
            "dtrain: autotune: input points of different dimensions ({} and {})", d, p.size()));
      }
      for (double v : p) {
        if (!std::isfinite(v)) {
          throw InvalidArgumentError("dtrain: autotune: an input point is not finite");
        }
      }
    }
    for (double v : y) {
      if (!std::isfinite(v)) {
        throw InvalidArgumentError("dtrain: autotune: an observation is not finite");
      }
    }
    outputs_ = standardize(y);
    auto f = cholesky(detail::kernel_matrix(x_, params_));
    if (!f) {
      throw InvalidArgumentError(
          "dtrain: autotune: the kernel matrix is not positive definite for these kernel "
          "parameters");
    }
    factor_ = std::move(*f);
    alpha_ = detail::solve_with(factor_, outputs_.values);
  }

  Prediction predict(std::span<const double> x) const {
    const std::size_t n = x_.size();
    std::vector<double> k_star(n);
    for (std::size_t i = 0; i < n; ++i) k_star[i] = matern52(x, x_[i], params_);
    double mean = 0.0;
    for (std::size_t i = 0; i < n; ++i) mean += k_star[i] * alpha_[i];
    const std::vector<double> v = solve_lower(factor_.lower, k_star);
    double explained = 0.0;
    for (double e : v) explained += e * e;
    const double variance = std::max(0.0, params_.signal_variance - explained);
    return {outputs_.mean + outputs_.scale * mean, variance * outputs_.scale * outputs_.scale};
  }

  double log_marginal_likelihood() const {
    return detail::log_marginal_likelihood(factor_, outputs_.values, alpha_);
  }

  const KernelParams& params() const noexcept { return params_; }
  const Points& inputs() const noexcept { return x_; }
  double output_mean() const noexcept { return outputs_.mean; }
  double output_scale() const noexcept { return outputs_.scale; }
  double jitter() const noexcept { return factor_.jitter; }

 private:
  Points x_;
  KernelParams params_;
  Standardized outputs_;
  CholeskyFactor factor_;
  std::vector<double> alpha_;  // K^{-1} y, standardized
};

}  // namespace dtrain::autotune
