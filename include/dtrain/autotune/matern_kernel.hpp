#pragma once
// The Gaussian process's covariance: a Matern-5/2 kernel with one length scale per input
// dimension, a signal variance, and an independent observation noise.
//
// Note [Kernel choice]
// Matern-5/2 rather than the squared exponential: the throughput of a configuration is
// continuous in its knobs but not infinitely smooth (the fusion threshold crosses tensor sizes,
// a cycle starts to catch one more tensor), and the squared exponential's smoothness makes it
// overconfident between samples; Matern-5/2 is the usual choice for Bayesian optimization of
// such costs (Snoek, Larochelle and Adams, 2012). One length scale per dimension lets the fit find
// that a knob hardly matters (a long length scale) without that knob diluting the others.
// Inputs are in [0,1]^d, so length scales are in units of a knob's whole range.
#include <cmath>
#include <cstddef>
#include <span>
#include <vector>

namespace dtrain::autotune {

struct KernelParams {
  std::vector<double> length_scales;  // one per input dimension, > 0
  double signal_variance = 1.0;       // prior variance of the (standardized) function
  double noise_variance = 0.0;        // variance of independent noise on each observation
};

// r = the distance scaled per dimension; k = s2 (1 + sqrt5 r + 5 r^2 / 3) exp(-sqrt5 r).
inline double matern52(std::span<const double> a, std::span<const double> b,
                       const KernelParams& p) {
  double r2 = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double d = (a[i] - b[i]) / p.length_scales[i];
    r2 += d * d;
  }
  const double s5r = std::sqrt(5.0 * r2);
  return p.signal_variance * (1.0 + s5r + 5.0 * r2 / 3.0) * std::exp(-s5r);
}

}  // namespace dtrain::autotune
