#pragma once
// A framework-free model for the equivalence tests: a 1-hidden-layer tanh MLP regressing a smooth
// function of 3 inputs, with hand-written gradients, and SGD with momentum over std::vectors.
// Everything is float64 and deterministic, so a distributed run and the single-process reference
// differ only by the order of floating-point sums.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace train_test {

inline constexpr int kInputs = 3;
inline constexpr int kHidden = 6;

// Parameters and gradients: w1 [kHidden, kInputs], b1 [kHidden], w2 [kHidden], b2 [1].
using Params = std::vector<std::vector<double>>;

inline Params zeros_like(const Params& p) {
  Params z;
  for (const auto& t : p) z.emplace_back(t.size(), 0.0);
  return z;
}

// Distinct, deterministic weights for each seed (a rank's seed before broadcast_parameters).
inline Params init_params(int seed) {
  Params p{std::vector<double>(kHidden * kInputs), std::vector<double>(kHidden),
           std::vector<double>(kHidden), std::vector<double>(1)};
  int k = 0;
  for (auto& t : p)
    for (auto& v : t) v = 0.5 * std::sin(1.7 * ++k + 0.9 * seed);
  return p;
}

inline double feature(std::int64_t sample, int j) { return std::sin(0.37 * sample + 1.3 * j); }
inline double target(std::int64_t sample) {
  return std::cos(0.5 * sample) + 0.3 * feature(sample, 0) * feature(sample, 1);
}

// Adds scale * d/dθ of 0.5 (f(x_i) - y_i)^2 for every sample i of `batch` to `grads`; returns the
// unscaled sum of the losses.
inline double accumulate_gradients(const Params& p, Params& grads,
                                   std::span<const std::int64_t> batch, double scale) {
  const auto &w1 = p[0], &b1 = p[1], &w2 = p[2], &b2 = p[3];
  double loss = 0;
  for (std::int64_t i : batch) {
    double x[kInputs], h[kHidden];
    for (int j = 0; j < kInputs; ++j) x[j] = feature(i, j);
    double out = b2[0];
    for (int u = 0; u < kHidden; ++u) {
      double a = b1[u];
      for (int j = 0; j < kInputs; ++j) a += w1[u * kInputs + j] * x[j];
      h[u] = std::tanh(a);
      out += w2[u] * h[u];
    }
    const double err = out - target(i);
    loss += 0.5 * err * err;
    const double d = scale * err;
    grads[3][0] += d;
    for (int u = 0; u < kHidden; ++u) {
      grads[2][u] += d * h[u];
      const double da = d * w2[u] * (1 - h[u] * h[u]);
      grads[1][u] += da;
      for (int j = 0; j < kInputs; ++j) grads[0][u * kInputs + j] += da * x[j];
    }
  }
  return loss;
}

// SGD with momentum over std::vectors; models dtrain's Optimizer concept through the member
// functions step() and gradients().
struct Sgd {
  Params params, grads, velocity;
  double lr = 0.1;
  double momentum = 0.9;

  Sgd(Params p, double learning_rate, double mom)
      : params(std::move(p)), grads(zeros_like(params)), velocity(zeros_like(params)),
        lr(learning_rate), momentum(mom) {}

  void step() {
    for (std::size_t t = 0; t < params.size(); ++t)
      for (std::size_t i = 0; i < params[t].size(); ++i) {
        velocity[t][i] = momentum * velocity[t][i] + grads[t][i];
        params[t][i] -= lr * velocity[t][i];
      }
    ++steps;
  }
  Params& gradients() { return grads; }
  void zero_grad() {
    for (auto& g : grads) std::fill(g.begin(), g.end(), 0.0);
  }
  int steps = 0;  // how often step() ran
};

}  // namespace train_test
