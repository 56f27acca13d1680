// The numerical pieces of the autotuner against closed forms and plain references: Cholesky with
// jitter, the Matern kernel, Gaussian-process posterior and log marginal likelihood, kernel
// fitting, expected improvement, Nelder-Mead and the point sequences.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <numbers>
#include <span>
#include <vector>

#include "dtrain/autotune/cholesky.hpp"
#include "dtrain/autotune/expected_improvement.hpp"
#include "dtrain/autotune/gaussian_process.hpp"
#include "dtrain/autotune/kernel_fit.hpp"
#include "dtrain/autotune/matern_kernel.hpp"
#include "dtrain/autotune/nelder_mead.hpp"
#include "dtrain/autotune/sequences.hpp"

using namespace dtrain::autotune;

namespace {

Matrix from_rows(const std::vector<std::vector<double>>& rows) {
  Matrix m(rows.size(), rows.front().size());
  for (std::size_t i = 0; i < rows.size(); ++i) {
    for (std::size_t j = 0; j < rows[i].size(); ++j) m(i, j) = rows[i][j];
  }
  return m;
}

// Plain reference: the inverse by Gauss-Jordan elimination with partial pivoting, and the
// determinant as the product of the pivots.
struct InverseAndDeterminant {
  Matrix inverse;
  double determinant = 1.0;
};

InverseAndDeterminant gauss_jordan(Matrix a) {
  const std::size_t n = a.rows();
  Matrix inv(n, n);
  for (std::size_t i = 0; i < n; ++i) inv(i, i) = 1.0;
  double det = 1.0;
  for (std::size_t c = 0; c < n; ++c) {
    std::size_t p = c;
    for (std::size_t r = c + 1; r < n; ++r) {
      if (std::abs(a(r, c)) > std::abs(a(p, c))) p = r;
    }
    if (p != c) {
      for (std::size_t j = 0; j < n; ++j) {
        std::swap(a(p, j), a(c, j));
        std::swap(inv(p, j), inv(c, j));
      }
      det = -det;
    }
    const double pivot = a(c, c);
    det *= pivot;
    for (std::size_t j = 0; j < n; ++j) {
      a(c, j) /= pivot;
      inv(c, j) /= pivot;
    }
    for (std::size_t r = 0; r < n; ++r) {
      if (r == c) continue;
      const double f = a(r, c);
      for (std::size_t j = 0; j < n; ++j) {
        a(r, j) -= f * a(c, j);
        inv(r, j) -= f * inv(c, j);
      }
    }
  }
  return {inv, det};
}

KernelParams params_1d(double length, double signal, double noise) {
  return KernelParams{{length}, signal, noise};
}

double matern_of_distance(double r, double signal) {
  const double s5r = std::sqrt(5.0) * r;
  return signal * (1.0 + s5r + 5.0 * r * r / 3.0) * std::exp(-s5r);
}

}  // namespace

TEST_CASE("cholesky factors a known matrix exactly, without jitter") {
  // A = L L^T for a chosen L.
  const Matrix l = from_rows({{2, 0, 0}, {1, 3, 0}, {-1, 2, 4}});
  Matrix a(3, 3);
  for (std::size_t i = 0; i < 3; ++i) {
    for (std::size_t j = 0; j < 3; ++j) {
      for (std::size_t k = 0; k < 3; ++k) a(i, j) += l(i, k) * l(j, k);
    }
  }
  const auto f = cholesky(a);
  REQUIRE(f);
  CHECK(f->jitter == 0.0);
  for (std::size_t i = 0; i < 3; ++i) {
    for (std::size_t j = 0; j < 3; ++j) CHECK(f->lower(i, j) == doctest::Approx(l(i, j)).epsilon(1e-14));
  }
  // det A = (2 * 3 * 4)^2.
  CHECK(log_determinant(*f) == doctest::Approx(std::log(576.0)).epsilon(1e-14));

  const std::vector<double> b = {1.0, -2.0, 0.5};
  const std::vector<double> y = solve_lower(f->lower, b);
  for (std::size_t i = 0; i < 3; ++i) {
    double s = 0.0;
    for (std::size_t k = 0; k < 3; ++k) s += l(i, k) * y[k];
    CHECK(s == doctest::Approx(b[i]).epsilon(1e-14));
  }
  const std::vector<double> z = solve_lower_transposed(f->lower, b);
  for (std::size_t i = 0; i < 3; ++i) {
    double s = 0.0;
    for (std::size_t k = 0; k < 3; ++k) s += l(k, i) * z[k];
    CHECK(s == doctest::Approx(b[i]).epsilon(1e-14));
  }
}

TEST_CASE("cholesky adds the smallest jitter that works to a singular matrix") {
  // Positive semidefinite, rank 1: fails as is, succeeds with a tiny diagonal term.
  const Matrix a = from_rows({{1, 1}, {1, 1}});
  const auto f = cholesky(a);
  REQUIRE(f);
  CHECK(f->jitter > 0.0);
  CHECK(f->jitter <= 1e-4);
  const Matrix& l = f->lower;
  CHECK(l(0, 0) * l(0, 0) == doctest::Approx(1.0 + f->jitter));
  CHECK(l(1, 0) * l(0, 0) == doctest::Approx(1.0));
  CHECK(l(1, 0) * l(1, 0) + l(1, 1) * l(1, 1) == doctest::Approx(1.0 + f->jitter));
}

TEST_CASE("cholesky refuses an indefinite or non-finite matrix") {
  CHECK_FALSE(cholesky(from_rows({{1, 2}, {2, 1}})));
  CHECK_FALSE(cholesky(from_rows({{1, 0}, {0, -1}})));
  CHECK_FALSE(cholesky(from_rows({{1, NAN}, {NAN, 1}})));
  CHECK_FALSE(cholesky(from_rows({{INFINITY, 0}, {0, 1}})));
  CHECK_FALSE(cholesky(Matrix(2, 3)));
}

TEST_CASE("Matern 5/2 kernel matches its closed form with per-dimension length scales") {
  const KernelParams p{{0.3, 0.4}, 2.5, 0.0};
  const std::vector<double> a = {0.1, 0.2};
  CHECK(matern52(a, a, p) == doctest::Approx(2.5));
  // Offsets of one length scale in each dimension: r = sqrt(2).
  const std::vector<double> b = {0.4, 0.6};
  CHECK(matern52(a, b, p) == doctest::Approx(matern_of_distance(std::sqrt(2.0), 2.5)));
  CHECK(matern52(b, a, p) == doctest::Approx(matern52(a, b, p)));
  // A longer length scale in a dimension makes distance along it count less.
  const KernelParams longer{{0.3, 4.0}, 2.5, 0.0};
  CHECK(matern52(a, b, longer) > matern52(a, b, p));
  // r = 2 in one dimension.
  const std::vector<double> c = {0.0}, d = {0.5};
  CHECK(matern52(c, d, params_1d(0.25, 1.0, 0.0)) ==
        doctest::Approx((1.0 + 2.0 * std::sqrt(5.0) + 20.0 / 3.0) * std::exp(-2.0 * std::sqrt(5.0))));
}

TEST_CASE("standardize uses the mean and the population standard deviation") {
  const std::vector<double> y = {1.0, 3.0};
  const Standardized s = standardize(y);
  CHECK(s.mean == 2.0);
  CHECK(s.scale == 1.0);
  CHECK(s.values == std::vector<double>{-1.0, 1.0});
  const std::vector<double> z = {10.0, 14.0, 18.0};
  const Standardized t = standardize(z);
  CHECK(t.mean == doctest::Approx(14.0));
  CHECK(t.scale == doctest::Approx(std::sqrt(32.0 / 3.0)));
  // One value, or equal values: no spread to divide by.
  CHECK(standardize(std::vector<double>{7.0}).scale == 1.0);
  CHECK(standardize(std::vector<double>{7.0, 7.0}).values == std::vector<double>{0.0, 0.0});
}

TEST_CASE("Gaussian process with one observation: posterior in closed form") {
  const double s2 = 1.7, n2 = 0.3, l = 0.2;
  const GaussianProcess gp({{0.4}}, std::vector<double>{5.0}, params_1d(l, s2, n2));
  // One value standardizes to 0 about a mean of 5: the posterior mean is 5 everywhere.
  for (double x : {0.0, 0.4, 0.55, 1.0}) {
    const std::vector<double> p = {x};
    const auto pred = gp.predict(p);
    CHECK(pred.mean == doctest::Approx(5.0));
    const double k = matern_of_distance(std::abs(x - 0.4) / l, s2);
    CHECK(pred.variance == doctest::Approx(s2 - k * k / (s2 + n2)));
  }
  // log N(0 | 0, s2 + n2).
  CHECK(gp.log_marginal_likelihood() ==
        doctest::Approx(-0.5 * std::log(s2 + n2) - 0.5 * std::log(2 * std::numbers::pi)));
}

TEST_CASE("Gaussian process with two observations: posterior and likelihood by hand") {
  const double s2 = 1.3, n2 = 0.05, l = 0.35;
  const double x1 = 0.2, x2 = 0.7;
  // y = (1, 3): mean 2, population sd 1, standardized (-1, 1).
  const GaussianProcess gp({{x1}, {x2}}, std::vector<double>{1.0, 3.0}, params_1d(l, s2, n2));
  const double a = s2 + n2;
  const double b = matern_of_distance(std::abs(x1 - x2) / l, s2);
  const double det = a * a - b * b;
  // K^{-1} = [[a, -b], [-b, a]] / det.
  auto quad = [&](double u1, double u2, double v1, double v2) {
    return (u1 * (a * v1 - b * v2) + u2 * (-b * v1 + a * v2)) / det;
  };
  for (double x : {0.0, 0.2, 0.4, 0.7, 0.95}) {
    const double k1 = matern_of_distance(std::abs(x - x1) / l, s2);
    const double k2 = matern_of_distance(std::abs(x - x2) / l, s2);
    const std::vector<double> p = {x};
    const auto pred = gp.predict(p);
    CHECK(pred.mean == doctest::Approx(2.0 + quad(k1, k2, -1.0, 1.0)).epsilon(1e-12));
    CHECK(pred.variance == doctest::Approx(s2 - quad(k1, k2, k1, k2)).epsilon(1e-12));
  }
  const double expected_lml =
      -0.5 * quad(-1.0, 1.0, -1.0, 1.0) - 0.5 * std::log(det) - std::log(2 * std::numbers::pi);
  CHECK(gp.log_marginal_likelihood() == doctest::Approx(expected_lml).epsilon(1e-12));
  const std::vector<double> standardized = {-1.0, 1.0};
  CHECK(log_marginal_likelihood({{x1}, {x2}}, standardized, params_1d(l, s2, n2)) ==
        doctest::Approx(expected_lml).epsilon(1e-12));
}

TEST_CASE("Gaussian process without noise interpolates its observations") {
  const Points x = {{0.1, 0.9}, {0.5, 0.5}, {0.8, 0.2}, {0.3, 0.3}};
  const std::vector<double> y = {4.0, -1.0, 2.5, 0.0};
  const GaussianProcess gp(x, y, KernelParams{{0.4, 0.3}, 1.0, 0.0});
  for (std::size_t i = 0; i < x.size(); ++i) {
    const auto pred = gp.predict(x[i]);
    CHECK(pred.mean == doctest::Approx(y[i]).epsilon(1e-9));
    CHECK(pred.variance == doctest::Approx(0.0).epsilon(1e-9));
  }
  // Far from every observation the posterior returns to the prior: the mean of y, the signal
  // variance in y's units.
  const GaussianProcess far({{0.0, 0.0}, {0.05, 0.0}}, std::vector<double>{1.0, 3.0},
                            KernelParams{{0.01, 0.01}, 1.0, 0.0});
  const std::vector<double> p = {1.0, 1.0};
  CHECK(far.predict(p).mean == doctest::Approx(2.0));
  CHECK(far.predict(p).variance == doctest::Approx(1.0));
}

TEST_CASE("log marginal likelihood of three points matches a plain reference") {
  const Points x = {{0.0, 0.1}, {0.5, 0.9}, {0.7, 0.4}};
  const std::vector<double> y = {-1.2, 0.3, 0.9};
  const KernelParams p{{0.6, 0.25}, 0.8, 0.1};
  Matrix k(3, 3);
  for (std::size_t i = 0; i < 3; ++i) {
    for (std::size_t j = 0; j < 3; ++j) k(i, j) = matern52(x[i], x[j], p) + (i == j ? 0.1 : 0.0);
  }
  const InverseAndDeterminant ref = gauss_jordan(k);
  double fit = 0.0;
  for (std::size_t i = 0; i < 3; ++i) {
    for (std::size_t j = 0; j < 3; ++j) fit += y[i] * ref.inverse(i, j) * y[j];
  }
  const double expected =
      -0.5 * fit - 0.5 * std::log(ref.determinant) - 1.5 * std::log(2 * std::numbers::pi);
  CHECK(log_marginal_likelihood(x, y, p) == doctest::Approx(expected).epsilon(1e-12));
}

TEST_CASE("log marginal likelihood is minus infinity where the kernel matrix cannot be factored") {
  const std::vector<double> y = {0.0, 1.0};
  CHECK(log_marginal_likelihood({{0.1}, {NAN}}, y, params_1d(0.3, 1.0, 0.1)) == -INFINITY);
  CHECK(log_marginal_likelihood({{0.1}, {0.2}}, y, params_1d(0.3, -1.0, 0.0)) == -INFINITY);
}

TEST_CASE("Gaussian process rejects data it cannot model") {
  const std::vector<double> one = {1.0};
  CHECK_THROWS_AS(GaussianProcess({}, std::vector<double>{}, params_1d(0.3, 1, 0)),
                  dtrain::InvalidArgumentError);
  CHECK_THROWS_AS(GaussianProcess({{0.1}, {0.2}}, one, params_1d(0.3, 1, 0)),
                  dtrain::InvalidArgumentError);
  CHECK_THROWS_AS(GaussianProcess({{0.1, 0.2}}, one, params_1d(0.3, 1, 0)),
                  dtrain::InvalidArgumentError);
  CHECK_THROWS_AS(GaussianProcess({{NAN}}, one, params_1d(0.3, 1, 0)), dtrain::InvalidArgumentError);
  CHECK_THROWS_AS(GaussianProcess({{0.1}}, std::vector<double>{INFINITY}, params_1d(0.3, 1, 0)),
                  dtrain::InvalidArgumentError);
}

TEST_CASE("kernel fit reaches at least the best likelihood of a fine grid") {
  // Eight noisy samples of a smooth function; noise fixed so the grid is two-dimensional.
  Points x;
  std::vector<double> raw;
  Random random(7);
  for (int i = 0; i < 8; ++i) {
    const double u = (i + 0.5) / 8.0;
    x.push_back({u});
    raw.push_back(std::sin(5.0 * u) + 0.05 * (random.uniform() - 0.5));
  }
  const Standardized s = standardize(raw);
  KernelBounds bounds;
  bounds.min_noise_variance = bounds.max_noise_variance = 0.01;
  const FittedKernel fitted = fit_kernel(x, s.values, bounds, KernelFitOptions{});
  CHECK(fitted.params.noise_variance == 0.01);
  CHECK(fitted.log_marginal_likelihood ==
        doctest::Approx(log_marginal_likelihood(x, s.values, fitted.params)));

  double grid_best = -INFINITY;
  for (int i = 0; i <= 60; ++i) {
    for (int j = 0; j <= 60; ++j) {
      const double l = std::exp(std::log(bounds.min_length_scale) +
                                i / 60.0 * std::log(bounds.max_length_scale / bounds.min_length_scale));
      const double v = std::exp(std::log(bounds.min_signal_variance) +
                                j / 60.0 *
                                    std::log(bounds.max_signal_variance / bounds.min_signal_variance));
      grid_best = std::max(grid_best, log_marginal_likelihood(x, s.values, params_1d(l, v, 0.01)));
    }
  }
  CHECK(fitted.log_marginal_likelihood >= grid_best - 1e-6);
  for (double l : fitted.params.length_scales) {
    CHECK(l >= bounds.min_length_scale);
    CHECK(l <= bounds.max_length_scale);
  }
}

TEST_CASE("kernel fit gives an irrelevant input a longer length scale") {
  Points x;
  std::vector<double> y;
  Random random(11);
  for (int i = 0; i < 24; ++i) {
    const double a = random.uniform(), b = random.uniform();
    x.push_back({a, b});
    y.push_back(std::sin(6.0 * a));  // does not depend on b
  }
  const Standardized s = standardize(y);
  const FittedKernel fitted = fit_kernel(x, s.values, KernelBounds{}, KernelFitOptions{});
  CHECK(fitted.params.length_scales[1] > 3.0 * fitted.params.length_scales[0]);
}

TEST_CASE("kernel fit keeps the noise within its bound and finds more noise in noisier data") {
  Points x;
  std::vector<double> clean, noisy;
  Random random(3);
  for (int i = 0; i < 20; ++i) {
    const double u = random.uniform();
    x.push_back({u});
    clean.push_back(std::cos(4.0 * u));
    noisy.push_back(std::cos(4.0 * u) + 0.6 * (random.uniform() - 0.5));
  }
  KernelBounds bounds;
  bounds.max_noise_variance = 0.64;
  const FittedKernel a = fit_kernel(x, standardize(clean).values, bounds, KernelFitOptions{});
  const FittedKernel b = fit_kernel(x, standardize(noisy).values, bounds, KernelFitOptions{});
  CHECK(a.params.noise_variance <= 0.64);
  CHECK(b.params.noise_variance <= 0.64);
  CHECK(b.params.noise_variance > 10.0 * a.params.noise_variance);

  // A bound of 0 fixes the noise at 0.
  KernelBounds none;
  none.min_noise_variance = none.max_noise_variance = 0.0;
  CHECK(fit_kernel(x, standardize(noisy).values, none, KernelFitOptions{}).params.noise_variance == 0.0);
}

TEST_CASE("expected improvement: closed-form values and its defining properties") {
  // At mean = best + xi the improvement is sd * phi(0).
  CHECK(expected_improvement(1.1, 2.0, 1.0, 0.1) == doctest::Approx(2.0 / std::sqrt(2 * std::numbers::pi)));
  // Without uncertainty it is the plain improvement, or zero.
  CHECK(expected_improvement(0.5, 0.0, 1.0, 0.0) == 0.0);
  CHECK(expected_improvement(3.0, 0.0, 1.0, 0.5) == doctest::Approx(1.5));
  CHECK(expected_improvement(1.2, 0.0, 1.0, 0.5) == 0.0);

  // Never negative; grows with the mean and with the uncertainty; the margin only lowers it.
  for (double mean : {-40.0, -3.0, -0.5, 0.0, 0.3, 2.0}) {
    double previous = -1.0;
    for (double sd : {1e-6, 0.01, 0.1, 0.5, 1.0, 3.0, 10.0}) {
      const double ei = expected_improvement(mean, sd, 0.0, 0.01);
      CHECK(ei >= 0.0);
      CHECK(ei >= previous);
      previous = ei;
      CHECK(expected_improvement(mean + 0.1, sd, 0.0, 0.01) >= ei);
      CHECK(expected_improvement(mean, sd, 0.0, 0.2) <= ei);
    }
  }
  // Far in the lower tail it vanishes rather than going negative.
  CHECK(expected_improvement(-100.0, 1.0, 0.0, 0.0) == 0.0);

  // Against numerical integration of E[max(f - best - xi, 0)], f ~ N(mean, sd^2).
  for (const auto& [mean, sd, best, xi] :
       std::vector<std::array<double, 4>>{{0.3, 0.7, 0.5, 0.05}, {-1.0, 2.0, 0.0, 0.0}, {2.0, 0.5, 1.0, 0.1}}) {
    double integral = 0.0;
    const int n = 200000;
    const double lo = mean - 12 * sd, hi = mean + 12 * sd, h = (hi - lo) / n;
    for (int i = 0; i < n; ++i) {
      const double f = lo + (i + 0.5) * h;
      integral += std::max(f - best - xi, 0.0) * normal_pdf((f - mean) / sd) / sd * h;
    }
    CHECK(expected_improvement(mean, sd, best, xi) == doctest::Approx(integral).epsilon(1e-6));
  }
}

TEST_CASE("Nelder-Mead finds a valley's minimum and respects the box") {
  auto rosenbrock = [](std::span<const double> v) {
    return 100.0 * std::pow(v[1] - v[0] * v[0], 2) + std::pow(1.0 - v[0], 2);
  };
  const std::vector<double> lo = {-2.0, -2.0}, hi = {2.0, 2.0};
  NelderMeadOptions o;
  o.max_evaluations = 3000;
  const Minimum m = minimize_in_box(rosenbrock, {-1.5, 1.5}, lo, hi, o);
  CHECK(m.x[0] == doctest::Approx(1.0).epsilon(1e-3));
  CHECK(m.x[1] == doctest::Approx(1.0).epsilon(1e-3));
  CHECK(m.evaluations <= 3000);

  // The unconstrained minimum lies outside the box: the result is on the bound.
  auto bowl = [](std::span<const double> v) { return (v[0] - 3.0) * (v[0] - 3.0); };
  const std::vector<double> zero = {0.0}, one = {1.0};
  const Minimum b = minimize_in_box(bowl, {0.2}, zero, one);
  CHECK(b.x[0] == 1.0);
  CHECK(b.value == doctest::Approx(4.0));

  // Non-finite values count as +infinity and are never returned as the minimum.
  auto holes = [](std::span<const double> v) { return v[0] < 0.5 ? NAN : (v[0] - 0.7) * (v[0] - 0.7); };
  const Minimum h = minimize_in_box(holes, {0.9}, zero, one);
  CHECK(h.x[0] == doctest::Approx(0.7).epsilon(1e-3));
}

TEST_CASE("random numbers and the Kronecker sequence are deterministic and fill the cube") {
  Random a(42), b(42), c(43);
  for (int i = 0; i < 100; ++i) {
    const double u = a.uniform();
    CHECK(u == b.uniform());
    CHECK(u >= 0.0);
    CHECK(u < 1.0);
  }
  CHECK(Random(42).next() != c.next());

  // One dimension: the golden-ratio sequence.
  const KroneckerSequence golden(1, {0.0});
  CHECK(golden.point(1)[0] == doctest::Approx(2.0 / (1.0 + std::sqrt(5.0))));

  // 256 points of the 2-D sequence put 16 +- 4 in each cell of a 4x4 grid.
  const KroneckerSequence seq(2, {0.3, 0.6});
  int cells[4][4] = {};
  for (std::size_t n = 0; n < 256; ++n) {
    const auto p = seq.point(n);
    REQUIRE(p[0] >= 0.0);
    REQUIRE(p[0] < 1.0);
    REQUIRE(p[1] >= 0.0);
    REQUIRE(p[1] < 1.0);
    ++cells[static_cast<int>(p[0] * 4)][static_cast<int>(p[1] * 4)];
  }
  for (auto& row : cells) {
    for (int count : row) {
      CHECK(count >= 12);
      CHECK(count <= 20);
    }
  }
}
