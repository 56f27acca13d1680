#pragma once
// Derivative-free local minimization in a box: Nelder-Mead with every trial point clamped to the
// bounds. Used to fit kernel hyperparameters (in log space) and to polish the best candidates of
// the acquisition function.
//
// Note [Why Nelder-Mead]
// Both objectives are cheap (a few thousand flops), low-dimensional (at most seven
// hyperparameters, at most two continuous knobs) and evaluated a few hundred times per proposal.
// Nelder-Mead needs no gradients, so the log marginal likelihood and expected improvement are
// used exactly as defined, with no hand-derived derivative that could silently be wrong; it is
// robust to the flat regions both functions have, and multi-start covers its lack of global
// guarantees. Clamping to the box keeps every evaluated point valid; a simplex pressed against a
// bound collapses onto that face, which is where the optimum then lies anyway.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <numeric>
#include <span>
#include <utility>
#include <vector>

namespace dtrain::autotune {

struct NelderMeadOptions {
  int max_evaluations = 200;
  double initial_step = 0.2;  // first simplex edge, as a fraction of each coordinate's range
  double value_tolerance = 1e-9;
  double step_tolerance = 1e-7;  // as a fraction of each coordinate's range
};

struct Minimum {
  std::vector<double> x;
  double value = std::numeric_limits<double>::infinity();
  int evaluations = 0;
};

template <class Objective>
Minimum minimize_in_box(Objective&& objective, std::vector<double> start,
                        std::span<const double> lower, std::span<const double> upper,
                        const NelderMeadOptions& options = {}) {
  const std::size_t n = start.size();
  Minimum best;
  auto clamp = [&](std::vector<double>& x) {
    for (std::size_t i = 0; i < n; ++i) x[i] = std::clamp(x[i], lower[i], upper[i]);
  };
  auto evaluate = [&](const std::vector<double>& x) {
    ++best.evaluations;
    const double v = objective(std::span<const double>(x));
    return std::isfinite(v) ? v : std::numeric_limits<double>::infinity();
  };
  clamp(start);
  if (n == 0) {
    best.value = evaluate(start);
    best.x = std::move(start);
    return best;
  }

  std::vector<std::vector<double>> simplex(n + 1, start);
  for (std::size_t i = 0; i < n; ++i) {
    const double step = options.initial_step * (upper[i] - lower[i]);
    simplex[i + 1][i] += start[i] + step <= upper[i] ? step : -step;
    clamp(simplex[i + 1]);
  }
  std::vector<double> values(n + 1);
  for (std::size_t i = 0; i <= n; ++i) values[i] = evaluate(simplex[i]);

  constexpr double reflection = 1.0, expansion = 2.0, contraction = 0.5, shrinkage = 0.5;
  std::vector<std::size_t> order(n + 1);
  std::vector<double> centroid(n), trial(n), second(n);
  auto along = [&](double t, const std::vector<double>& to, std::vector<double>& out) {
    for (std::size_t i = 0; i < n; ++i) out[i] = centroid[i] + t * (to[i] - centroid[i]);
    clamp(out);
  };

  while (best.evaluations < options.max_evaluations) {
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::sort(order.begin(), order.end(),
              [&](std::size_t a, std::size_t b) { return values[a] < values[b]; });
    const std::size_t lo = order.front(), hi = order.back(), next_hi = order[n - 1];

    double spread = 0.0;
    for (std::size_t v = 0; v <= n; ++v) {
      for (std::size_t i = 0; i < n; ++i) {
        const double range = upper[i] - lower[i];
        if (range > 0) spread = std::max(spread, std::abs(simplex[v][i] - simplex[lo][i]) / range);
      }
    }
    const bool flat = values[hi] - values[lo] <=
                      options.value_tolerance * (1.0 + std::abs(values[lo]));
    if ((flat && spread <= options.step_tolerance) ||
        (std::isinf(values[lo]) && spread <= options.step_tolerance)) {
      break;
    }

    std::fill(centroid.begin(), centroid.end(), 0.0);
    for (std::size_t v = 0; v <= n; ++v) {
      if (v == hi) continue;
      for (std::size_t i = 0; i < n; ++i) centroid[i] += simplex[v][i] / static_cast<double>(n);
    }

    along(-reflection, simplex[hi], trial);
    const double f_reflected = evaluate(trial);
    if (f_reflected < values[lo]) {
      along(-reflection * expansion, simplex[hi], second);
      const double f_expanded = evaluate(second);
      if (f_expanded < f_reflected) {
        simplex[hi] = second;
        values[hi] = f_expanded;
      } else {
        simplex[hi] = trial;
        values[hi] = f_reflected;
      }
      continue;
    }
    if (f_reflected < values[next_hi]) {
      simplex[hi] = trial;
      values[hi] = f_reflected;
      continue;
    }
    // Contract towards the better of the worst point and its reflection.
    const bool outside = f_reflected < values[hi];
    if (outside) {
      along(-reflection * contraction, simplex[hi], second);
    } else {
      along(contraction, simplex[hi], second);
    }
    const double f_contracted = evaluate(second);
    if (f_contracted < (outside ? f_reflected : values[hi])) {
      simplex[hi] = second;
      values[hi] = f_contracted;
      continue;
    }
    for (std::size_t v = 0; v <= n; ++v) {
      if (v == lo) continue;
      for (std::size_t i = 0; i < n; ++i) {
        simplex[v][i] = simplex[lo][i] + shrinkage * (simplex[v][i] - simplex[lo][i]);
      }
      values[v] = evaluate(simplex[v]);
    }
  }

  const std::size_t lo = static_cast<std::size_t>(
      std::min_element(values.begin(), values.end()) - values.begin());
  best.x = simplex[lo];
  best.value = values[lo];
  return best;
}

}  // namespace dtrain::autotune
