#pragma once
// Bayesian optimization over the unit cube: told the value of each point it measured, it proposes
// the next point to measure, by fitting a Gaussian process to all observations and maximizing
// expected improvement. It knows nothing of knobs or throughput (search_space.hpp and tuner.hpp
// do); it maximizes whatever it is given.
//
// Note [Gaussian process noise]
// Observations carry measurement noise: the same configuration measured twice scores
// differently. The Gaussian process models it as independent noise of variance sigma_n^2 on each
// observation, with sigma_n fitted together with the other kernel parameters. Outputs are
// standardized (Note [Standardized outputs]), and DTRAIN_AUTOTUNE_GAUSSIAN_PROCESS_NOISE = g is
// the largest noise standard deviation the fit may choose, in units of the observations'
// standard deviation: sigma_n in [0.001, g]. The default 0.8 (Horovod's number, where it is a
// fixed noise level in raw score units) lets the fit attribute up to 64% of the observed variance
// to noise, but never all of it: a Gaussian process that explains every difference as noise is
// flat, and its expected improvement then only explores. g = 0 fixes sigma_n at 0: the model
// interpolates the observations exactly (plus Cholesky jitter), right only for noiseless scores.
// A larger g suits noisier machines (shared nodes, busy networks).
//
// Note [Categorical knobs]
// Binary dimensions take only the values 0 and 1. Proposals come from maximizing expected
// improvement separately for every combination of the binary values (2^b, b <= 3 in practice),
// over the continuous dimensions only, so the model is never asked about, and never proposes, a
// point between two categories (Garrido-Merchan and Hernandez-Lobato, 2020). In the kernel each
// binary dimension has its own length scale: a long one says the category hardly matters, a short
// one that the two categories behave as unrelated functions.
//
// Note [Incumbent]
// "Improvement" is measured against the best posterior mean at an observed point rather than the
// best raw observation (Brochu, Cora and de Freitas, 2010, section 2.4): with noisy scores the
// best raw observation is biased upwards by its own noise, and chasing it would spend samples
// re-measuring a lucky configuration.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "dtrain/autotune/expected_improvement.hpp"
#include "dtrain/autotune/gaussian_process.hpp"
#include "dtrain/autotune/kernel_fit.hpp"
#include "dtrain/autotune/nelder_mead.hpp"
#include "dtrain/autotune/search_space.hpp"
#include "dtrain/autotune/sequences.hpp"
#include "dtrain/core/error.hpp"

namespace dtrain::autotune {

struct BayesianOptimizerOptions {
  double gaussian_process_noise = 0.8;  // Note [Gaussian process noise]
  double exploration_margin = 0.01;     // xi, in standard deviations of the observations
  // Observations before the model is used; until then proposals come from a low-discrepancy
  // design. 0 means dimension + 1, at least 2.
  int initial_points = 0;
  int candidates = 512;          // per combination of binary values
  int refined_candidates = 4;    // the best candidates polished by Nelder-Mead
  int max_category_combinations = 64;
  KernelBounds kernel_bounds;    // max_noise_variance is set from gaussian_process_noise
  KernelFitOptions kernel_fit;
  std::uint64_t seed = 0;
};

class BayesianOptimizer {
 public:
  explicit BayesianOptimizer(std::vector<DimensionKind> kinds, BayesianOptimizerOptions options = {})
      : kinds_(std::move(kinds)), options_(std::move(options)), random_(options_.seed) {
    if (!(options_.gaussian_process_noise >= 0.0) ||
        !std::isfinite(options_.gaussian_process_noise)) {
      throw InvalidArgumentError(fmt::format(
          "dtrain: autotune: Gaussian process noise {} is not a non-negative number",
          options_.gaussian_process_noise));
    }
    const double g = options_.gaussian_process_noise;
    options_.kernel_bounds.max_noise_variance = g * g;
    options_.kernel_bounds.min_noise_variance =
        std::min(options_.kernel_bounds.min_noise_variance, g * g);
    if (options_.initial_points <= 0) {
      options_.initial_points = std::max<int>(2, static_cast<int>(kinds_.size()) + 1);
    }
    for (std::size_t i = 0; i < kinds_.size(); ++i) {
      (kinds_[i] == DimensionKind::binary ? binary_ : continuous_).push_back(i);
    }
    design_ = KroneckerSequence(kinds_.size(), random_.uniform_point(kinds_.size()));
  }

  std::size_t dimension() const noexcept { return kinds_.size(); }
  std::size_t observation_count() const noexcept { return y_.size(); }
  const Points& inputs() const noexcept { return x_; }
  const std::vector<double>& outputs() const noexcept { return y_; }
  // The model behind the last proposal that used one.
  const std::optional<GaussianProcess>& model() const noexcept { return model_; }
  const BayesianOptimizerOptions& options() const noexcept { return options_; }

  void observe(std::vector<double> x, double y) {
    if (x.size() != kinds_.size()) {
      throw InvalidArgumentError(fmt::format(
          "dtrain: autotune: observed a point with {} coordinates in a {}-dimensional space",
          x.size(), kinds_.size()));
    }
    for (double v : x) {
      if (!(v >= 0.0 && v <= 1.0)) {
        throw InvalidArgumentError(
            fmt::format("dtrain: autotune: observed point coordinate {} is outside [0, 1]", v));
      }
    }
    if (!std::isfinite(y)) {
      throw InvalidArgumentError(fmt::format("dtrain: autotune: observed value {} is not finite", y));
    }
    x_.push_back(std::move(x));
    y_.push_back(y);
  }

  std::vector<double> propose() {
    if (kinds_.empty()) return {};
    if (y_.size() < static_cast<std::size_t>(options_.initial_points)) return design_point();

    const Standardized s = standardize(y_);
    KernelFitOptions fit = options_.kernel_fit;
    fit.seed = options_.kernel_fit.seed ^ (options_.seed + 0x51ed270b27f6c2a1ULL * y_.size());
    const KernelParams* warm = model_ ? &model_->params() : nullptr;
    FittedKernel fitted = fit_kernel(x_, s.values, options_.kernel_bounds, fit, warm);
    model_.emplace(x_, y_, std::move(fitted.params));
    return maximize_expected_improvement(*model_);
  }

 private:
  std::vector<double> design_point() {
    std::vector<double> p = design_.point(design_index_++);
    for (std::size_t i : binary_) p[i] = p[i] >= 0.5 ? 1.0 : 0.0;
    return p;
  }

  std::vector<std::vector<double>> category_combinations() {
    std::vector<std::vector<double>> combos;
    const std::size_t b = binary_.size();
    const std::size_t cap = static_cast<std::size_t>(std::max(1, options_.max_category_combinations));
    if (b < 63 && (std::uint64_t{1} << b) <= cap) {
      for (std::uint64_t m = 0; m < (std::uint64_t{1} << b); ++m) {
        std::vector<double> c(b);
        for (std::size_t j = 0; j < b; ++j) c[j] = ((m >> j) & 1) ? 1.0 : 0.0;
        combos.push_back(std::move(c));
      }
    } else {
      for (std::size_t n = 0; n < cap; ++n) {
        std::vector<double> c(b);
        for (double& v : c) v = random_.uniform() < 0.5 ? 0.0 : 1.0;
        combos.push_back(std::move(c));
      }
    }
    return combos;
  }

  std::vector<double> maximize_expected_improvement(const GaussianProcess& gp) {
    double incumbent = -std::numeric_limits<double>::infinity();
    for (const auto& x : x_) incumbent = std::max(incumbent, gp.predict(x).mean);
    const double xi = options_.exploration_margin * gp.output_scale();

    struct Candidate {
      std::vector<double> x;
      double ei = 0.0;
      double sd = 0.0;
    };
    auto score = [&](std::vector<double> x) {
      const auto p = gp.predict(x);
      const double sd = std::sqrt(p.variance);
      return Candidate{std::move(x), expected_improvement(p.mean, sd, incumbent, xi), sd};
    };

    const std::size_t c = continuous_.size();
    const KroneckerSequence candidates(c, random_.uniform_point(c));
    const std::size_t per_combo = c == 0 ? 1 : static_cast<std::size_t>(std::max(1, options_.candidates));
    const std::size_t keep = static_cast<std::size_t>(std::max(1, options_.refined_candidates));
    std::vector<Candidate> top;  // best by expected improvement, descending
    Candidate widest;            // the most uncertain point, for Note [Vanishing improvement]
    widest.sd = -1.0;
    for (const auto& combo : category_combinations()) {
      for (std::size_t n = 0; n < per_combo; ++n) {
        std::vector<double> x(kinds_.size());
        for (std::size_t j = 0; j < binary_.size(); ++j) x[binary_[j]] = combo[j];
        if (c > 0) {
          const std::vector<double> u = candidates.point(n);
          for (std::size_t j = 0; j < c; ++j) x[continuous_[j]] = u[j];
        }
        Candidate cand = score(std::move(x));
        if (cand.sd > widest.sd) widest = cand;
        if (top.size() < keep || cand.ei > top.back().ei) {
          top.push_back(std::move(cand));
          std::sort(top.begin(), top.end(),
                    [](const Candidate& a, const Candidate& b) { return a.ei > b.ei; });
          if (top.size() > keep) top.pop_back();
        }
      }
    }

    // Polish the best candidates over their continuous coordinates, categories held.
    Candidate best = top.front();
    if (c > 0) {
      const std::vector<double> lower(c, 0.0), upper(c, 1.0);
      NelderMeadOptions nm;
      nm.max_evaluations = 40 * static_cast<int>(c + 1);
      nm.initial_step = 0.05;
      for (const Candidate& start : top) {
        std::vector<double> x = start.x;
        std::vector<double> u(c);
        for (std::size_t j = 0; j < c; ++j) u[j] = x[continuous_[j]];
        auto negative_ei = [&](std::span<const double> v) {
          for (std::size_t j = 0; j < c; ++j) x[continuous_[j]] = v[j];
          const auto p = gp.predict(x);
          return -expected_improvement(p.mean, std::sqrt(p.variance), incumbent, xi);
        };
        const Minimum m = minimize_in_box(negative_ei, std::move(u), lower, upper, nm);
        if (-m.value > best.ei) {
          for (std::size_t j = 0; j < c; ++j) x[continuous_[j]] = m.x[j];
          best = score(x);
        }
      }
    }
    // Note [Vanishing improvement]
    // Far below the incumbent, expected improvement underflows to exactly 0 everywhere; the
    // argmax is then arbitrary. The most uncertain candidate is the useful choice in that case.
    if (!(best.ei > 0.0)) return widest.x;
    return best.x;
  }

  std::vector<DimensionKind> kinds_;
  BayesianOptimizerOptions options_;
  Random random_;
  std::vector<std::size_t> continuous_, binary_;
  KroneckerSequence design_{0, {}};
  std::size_t design_index_ = 0;
  Points x_;
  std::vector<double> y_;
  std::optional<GaussianProcess> model_;
};

}  // namespace dtrain::autotune
