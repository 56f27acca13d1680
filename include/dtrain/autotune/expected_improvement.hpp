#pragma once
// Expected improvement (Mockus, 1978; Jones, Schonlau and Welch, 1998), the acquisition function:
// how much a point's value is expected to exceed the best so far plus a margin, under the
// Gaussian process's posterior. Larger is better (the tuner maximizes throughput).
#include <algorithm>
#include <cmath>
#include <numbers>

namespace dtrain::autotune {

inline double normal_pdf(double z) noexcept {
  return std::exp(-0.5 * z * z) / std::sqrt(2.0 * std::numbers::pi);
}

// erfc keeps full relative precision in the lower tail, where 1 - erf would round to 0.
inline double normal_cdf(double z) noexcept {
  return 0.5 * std::erfc(-z / std::numbers::sqrt2);
}

// E[max(f - best - xi, 0)] for f ~ N(mean, sd^2):
//   (mean - best - xi) Phi(z) + sd phi(z),  z = (mean - best - xi) / sd,
// and max(mean - best - xi, 0) when sd is 0. Written as sd (z Phi(z) + phi(z)), which is never
// negative in exact arithmetic; the clamp removes rounding's last bit far in the lower tail.
// `xi` >= 0 is the exploration margin: an improvement smaller than it counts for nothing, which
// keeps the search from polishing the incumbent by amounts below the measurement noise.
inline double expected_improvement(double mean, double sd, double best, double xi) noexcept {
  const double improvement = mean - best - xi;
  if (!(sd > 0.0)) return std::max(improvement, 0.0);
  const double z = improvement / sd;
  return std::max(0.0, sd * (z * normal_cdf(z) + normal_pdf(z)));
}

}  // namespace dtrain::autotune
