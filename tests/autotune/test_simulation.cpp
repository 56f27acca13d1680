// The whole tuner on a simulated job where fusion matters (simulated_job.hpp: 400 gradients,
// most of them small), with noisy step times: the configuration it keeps must beat the worst one
// it tried by a clear margin, beat the default, and come close to the best configuration of a
// dense grid over the model. Deterministic: seeded noise, seeded tuner.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>
#include <vector>

#include "dtrain/autotune/tuner.hpp"
#include "simulated_job.hpp"

using namespace dtrain::autotune;
using dtrain::autotune::test::SimulatedJob;

namespace {

struct Outcome {
  Knobs chosen;
  double chosen_throughput = 0.0;  // noiseless, bytes per second
  double worst_tried_throughput = 0.0;
  Knobs worst_tried;
  int configurations = 0;
  int steps = 0;
};

Outcome tune(const SimulatedJob& job, std::uint64_t seed, double noise_sd) {
  TunerOptions options;  // the defaults: 3 warmup samples, 10 steps each, 20 configurations
  options.seed = seed;
  Tuner tuner(SearchSpace(SearchSpaceOptions{}), options);
  Random noise(seed * 7919);
  Outcome out;
  while (!tuner.done()) {
    // Log-normal noise on each step's time.
    const double u1 = 1.0 - noise.uniform(), u2 = noise.uniform();
    const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
    const double seconds = job.step_ms(tuner.knobs()) / 1000.0 * std::exp(noise_sd * z);
    tuner.record_step({job.total_bytes(), seconds, tuner.generation()});
    ++out.steps;
  }
  out.chosen = tuner.knobs();
  out.chosen_throughput = job.bytes_per_second(out.chosen);
  out.worst_tried_throughput = INFINITY;
  for (const auto& r : tuner.history()) {
    if (r.kind != RecordKind::median) continue;
    ++out.configurations;
    const double t = job.bytes_per_second(r.knobs);
    if (t < out.worst_tried_throughput) {
      out.worst_tried_throughput = t;
      out.worst_tried = r.knobs;
    }
  }
  return out;
}

double grid_best_throughput(const SimulatedJob& job) {
  double best = 0.0;
  for (int i = 0; i <= 40; ++i) {
    for (int j = 0; j <= 40; ++j) {
      for (int categories = 0; categories < 4; ++categories) {
        Knobs k;
        k.fusion_threshold_bytes = static_cast<std::int64_t>(std::ldexp(1.0, 20 + i / 4));
        k.cycle_time_ms = 0.1 * std::pow(250.0, j / 40.0);
        k.response_cache = categories & 1;
        k.fusion_pipeline = categories & 2;
        best = std::max(best, job.bytes_per_second(k));
      }
    }
  }
  return best;
}

std::string gbps(double bytes_per_second) { return fmt::format("{:.3f} GB/s", bytes_per_second / 1e9); }

}  // namespace

TEST_CASE("simulated many-small-tensor job: the tuned configuration clearly beats the worst tried") {
  const SimulatedJob job = SimulatedJob::many_small_tensors();
  const double grid_best = grid_best_throughput(job);
  const double default_throughput = job.bytes_per_second(Knobs{});
  for (const double noise_sd : {0.05, 0.15}) {
    for (std::uint64_t seed : {1, 2, 3}) {
      const Outcome o = tune(job, seed, noise_sd);
      CAPTURE(seed);
      CAPTURE(noise_sd);
      MESSAGE(fmt::format(
          "noise {:.0f}%, seed {}: {} steps, {} configurations; chosen {} ({}), default {}, worst "
          "tried {} ({}), best of a 41x41x4 grid {}",
          100 * noise_sd, seed, o.steps, o.configurations, gbps(o.chosen_throughput),
          describe(o.chosen), gbps(default_throughput), gbps(o.worst_tried_throughput),
          describe(o.worst_tried), gbps(grid_best)));
      CHECK(o.configurations == 20);
      CHECK(o.chosen_throughput >= 1.5 * o.worst_tried_throughput);
      CHECK(o.chosen_throughput >= 1.1 * default_throughput);
      // Noisier steps leave the medians noisier, and the best median a little luckier.
      CHECK(o.chosen_throughput >= (noise_sd < 0.1 ? 0.95 : 0.92) * grid_best);
    }
  }
}
