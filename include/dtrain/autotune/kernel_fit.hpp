#pragma once
// Choosing the kernel's parameters: the length scales, signal variance and noise variance that
// maximize the log marginal likelihood of the observations (type-II maximum likelihood), searched
// in log space within bounds from several starting points.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <utility>
#include <vector>

#include "dtrain/autotune/gaussian_process.hpp"
#include "dtrain/autotune/matern_kernel.hpp"
#include "dtrain/autotune/nelder_mead.hpp"
#include "dtrain/autotune/sequences.hpp"

namespace dtrain::autotune {

// Note [Kernel parameter bounds]
// Inputs are in [0,1]^d and outputs standardized (Note [Standardized outputs]), so the bounds are
// in those units. A length scale below 0.05 of a knob's range would let a few dozen samples be
// explained as unrelated spikes (and expected improvement would then explore everywhere); above
// 10 the knob is effectively irrelevant, which the fit may conclude. The signal variance stays
// within a factor 20 of the observations' variance. The noise variance's upper bound comes from
// DTRAIN_AUTOTUNE_GAUSSIAN_PROCESS_NOISE (Note [Gaussian process noise] in bayesian_optimizer.hpp);
// where the two noise bounds meet, the noise is fixed at that value rather than fitted.
struct KernelBounds {
  double min_length_scale = 0.05;
  double max_length_scale = 10.0;
  double min_signal_variance = 0.05;
  double max_signal_variance = 20.0;
  double min_noise_variance = 1e-6;
  double max_noise_variance = 0.64;
};

struct KernelFitOptions {
  int random_starts = 3;            // besides the default start and the warm start
  int evaluations_per_start = 300;  // Nelder-Mead budget for each start
  std::uint64_t seed = 0;
};

struct FittedKernel {
  KernelParams params;
  double log_marginal_likelihood = -std::numeric_limits<double>::infinity();
};

namespace detail {

// theta = (log length scales..., log signal variance[, log noise variance]).
struct KernelParameterization {
  std::size_t dimension = 0;
  bool fit_noise = true;
  double fixed_noise_variance = 0.0;
  std::vector<double> lower, upper;

  KernelParameterization(std::size_t d, const KernelBounds& b) : dimension(d) {
    fit_noise = b.max_noise_variance > b.min_noise_variance;
    fixed_noise_variance = std::max(0.0, b.max_noise_variance);
    for (std::size_t i = 0; i < d; ++i) {
      lower.push_back(std::log(b.min_length_scale));
      upper.push_back(std::log(b.max_length_scale));
    }
    lower.push_back(std::log(b.min_signal_variance));
    upper.push_back(std::log(b.max_signal_variance));
    if (fit_noise) {
      lower.push_back(std::log(b.min_noise_variance));
      upper.push_back(std::log(b.max_noise_variance));
    }
  }

  std::size_t size() const { return lower.size(); }

  KernelParams params(std::span<const double> theta) const {
    KernelParams p;
    for (std::size_t i = 0; i < dimension; ++i) p.length_scales.push_back(std::exp(theta[i]));
    p.signal_variance = std::exp(theta[dimension]);
    p.noise_variance = fit_noise ? std::exp(theta[dimension + 1]) : fixed_noise_variance;
    return p;
  }

  std::vector<double> theta(const KernelParams& p) const {
    std::vector<double> t;
    for (double l : p.length_scales) t.push_back(std::log(l));
    t.push_back(std::log(p.signal_variance));
    if (fit_noise) t.push_back(std::log(std::max(p.noise_variance, 1e-300)));
    for (std::size_t i = 0; i < t.size(); ++i) t[i] = std::clamp(t[i], lower[i], upper[i]);
    return t;
  }
};

}  // namespace detail

// `y` standardized. `warm_start`, when given, is tried as one more starting point (the previous
// proposal's fit: the data changed by one observation, so its optimum is usually close).
inline FittedKernel fit_kernel(const Points& x, std::span<const double> y,
                               const KernelBounds& bounds, const KernelFitOptions& options,
                               const KernelParams* warm_start = nullptr) {
  const std::size_t d = x.empty() ? 0 : x.front().size();
  const detail::KernelParameterization space(d, bounds);

  std::vector<std::vector<double>> starts;
  KernelParams usual;
  usual.length_scales.assign(d, 0.3);
  usual.signal_variance = 1.0;
  usual.noise_variance = 0.1 * bounds.max_noise_variance;
  starts.push_back(space.theta(usual));
  if (warm_start && warm_start->length_scales.size() == d) starts.push_back(space.theta(*warm_start));
  Random random(options.seed);
  for (int s = 0; s < options.random_starts; ++s) {
    std::vector<double> t(space.size());
    for (std::size_t i = 0; i < t.size(); ++i) {
      t[i] = space.lower[i] + random.uniform() * (space.upper[i] - space.lower[i]);
    }
    starts.push_back(std::move(t));
  }

  auto negative_lml = [&](std::span<const double> theta) {
    return -log_marginal_likelihood(x, y, space.params(theta));
  };
  NelderMeadOptions nm;
  nm.max_evaluations = options.evaluations_per_start;
  nm.initial_step = 0.15;

  FittedKernel best;
  best.params = space.params(starts.front());
  for (auto& start : starts) {
    const Minimum m = minimize_in_box(negative_lml, std::move(start), space.lower, space.upper, nm);
    if (-m.value > best.log_marginal_likelihood) {
      best.log_marginal_likelihood = -m.value;
      best.params = space.params(m.x);
    }
  }
  return best;
}

}  // namespace dtrain::autotune
