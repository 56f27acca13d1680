// MetricAverager (sample-weighted global means, name agreement) and ThroughputMeter (samples summed
// over ranks), against closed forms over the world.
#include <cmath>
#include <cstdint>
#include <string>

#include "dtrain/dtrain.hpp"
#include "train/train_test_util.hpp"

namespace {
using namespace train_test;
}  // namespace

TEST_CASE("MetricAverager returns the sample-weighted mean over every rank") {
  dtrain::init();
  const int n = world_size();
  const int me = world_rank();
  dtrain::MetricAverager metrics;
  // Rank r adds two batches: loss r + 1 over r + 1 samples and loss 10 r over 2 samples;
  // accuracy 0.5 per batch with weight 1 (the default count).
  metrics.add("loss", me + 1.0, me + 1.0);
  metrics.add("loss", 10.0 * me, 2.0);
  metrics.add("accuracy", 0.5);
  metrics.add("accuracy", me % 2 ? 1.0 : 0.0);
  double weighted = 0, samples = 0, acc = 0;
  for (int r = 0; r < n; ++r) {
    weighted += (r + 1.0) * (r + 1.0) + 10.0 * r * 2.0;
    samples += r + 1.0 + 2.0;
    acc += 0.5 + (r % 2 ? 1.0 : 0.0);
  }
  const auto avg = metrics.average();
  CHECK(avg.size() == 2);
  CHECK(avg.at("loss") == doctest::Approx(weighted / samples).epsilon(1e-12));
  CHECK(avg.at("accuracy") == doctest::Approx(acc / (2.0 * n)).epsilon(1e-12));

  // average() resets the sums: the next round sees only what was added since.
  metrics.add("loss", 2.0 * me, 1.0);
  const auto next = metrics.average();
  CHECK(next.size() == 1);
  CHECK(next.at("loss") == doctest::Approx(n - 1.0).epsilon(1e-12));  // mean of 2r over r < n
}

TEST_CASE("MetricAverager: a metric with no samples anywhere averages to 0, not NaN") {
  dtrain::init();
  dtrain::MetricAverager metrics;
  metrics.add("skipped", 5.0, 0.0);
  const auto avg = metrics.average();
  CHECK(avg.at("skipped") == 0.0);
}

TEST_CASE("MetricAverager: different metric names across ranks are MismatchError on every rank") {
  dtrain::init();
  const int n = world_size();
  if (n < 2) return;  // nothing can differ in a world of one
  dtrain::MetricAverager metrics;
  metrics.add("loss", 1.0);
  if (world_rank() == n - 1) metrics.add("extra", 1.0);
  CHECK_THROWS_WITH_AS(metrics.average(), doctest::Contains("different metric names"),
                       dtrain::MismatchError);
  // Same count, different name.
  dtrain::MetricAverager renamed;
  renamed.add(world_rank() == 0 ? "loss" : "los", 1.0);
  CHECK_THROWS_AS(renamed.average(), dtrain::MismatchError);
  // The world is still usable.
  dtrain::MetricAverager ok;
  ok.add("loss", 3.0);
  CHECK(ok.average().at("loss") == doctest::Approx(3.0));
}

TEST_CASE("ThroughputMeter sums samples over ranks") {
  dtrain::init();
  const int n = world_size();
  const int me = world_rank();
  dtrain::ThroughputMeter meter;
  meter.add_samples(1000);  // before start_epoch: discarded by it
  meter.start_epoch();
  meter.add_samples(32);
  meter.add_samples(me + 1);
  const auto stats = meter.end_epoch();
  CHECK(stats.global_samples == 32 * n + n * (n + 1) / 2);
  CHECK(stats.seconds >= 0.0);
  if (stats.seconds > 0)
    CHECK(stats.samples_per_second == doctest::Approx(stats.global_samples / stats.seconds));
  // The slowest rank's time is the epoch time: every rank reports the same value.
  CHECK(same_on_all_ranks(&stats.seconds, sizeof stats.seconds));

  meter.start_epoch();
  const auto empty = meter.end_epoch();
  CHECK(empty.global_samples == 0);
  CHECK(empty.samples_per_second == 0.0);
}
