// The tuner's state machine, driven step by step without an engine: warmup discarded, medians
// of samples, configuration generations, the stop after the budget with the best kept, and fixed
// knobs left alone. Also which knobs count as set by the user, and how knobs map onto Config.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

#include "dtrain/autotune/knobs.hpp"
#include "dtrain/autotune/tuner.hpp"
#include "dtrain/core/env.hpp"

using namespace dtrain::autotune;

namespace {

constexpr std::int64_t MiB = std::int64_t{1} << 20;
constexpr std::int64_t step_bytes = 100 * MiB;

TunerOptions small_options() {
  TunerOptions o;
  o.autotune_warmup_samples = 0;
  o.autotune_steps_per_sample = 1;
  o.samples_per_configuration = 1;
  o.autotune_bayes_opt_max_samples = 6;
  o.settle_steps = 0;
  return o;
}

// Seconds per step for a configuration: fastest at a 64 MiB threshold and a 2 ms cycle, a little
// faster with the pipeline and the cache on.
double step_seconds(const Knobs& k) {
  const double t = std::log2(static_cast<double>(k.fusion_threshold_bytes) / (64.0 * MiB));
  const double c = std::log2(k.cycle_time_ms / 2.0);
  return 0.1 * (1.0 + 0.05 * t * t + 0.05 * c * c) * (k.fusion_pipeline ? 1.0 : 1.1) *
         (k.response_cache ? 1.0 : 1.05);
}

// Feeds steps timed by `seconds` until the tuner is done; returns the number of steps fed.
int run_to_end(Tuner& tuner, const std::function<double(const Knobs&)>& seconds,
               int max_steps = 100000) {
  int steps = 0;
  while (!tuner.done() && steps < max_steps) {
    tuner.record_step({step_bytes, seconds(tuner.knobs()), tuner.generation()});
    ++steps;
  }
  return steps;
}

std::vector<TuningRecord> rows_of(const Tuner& t, RecordKind kind) {
  std::vector<TuningRecord> out;
  for (const auto& r : t.history()) {
    if (r.kind == kind) out.push_back(r);
  }
  return out;
}

}  // namespace

TEST_CASE("warmup samples run the base configuration and are discarded") {
  TunerOptions o = small_options();
  o.autotune_warmup_samples = 2;
  o.autotune_steps_per_sample = 3;
  o.samples_per_configuration = 1;
  Tuner tuner(SearchSpace(SearchSpaceOptions{}), o);
  // Warmup steps are 100x slower than the rest; none of that may reach a score.
  for (int i = 0; i < 6; ++i) {
    CHECK(tuner.knobs() == Knobs{});
    CHECK_FALSE(tuner.record_step({step_bytes, 10.0, 0}));
  }
  CHECK(rows_of(tuner, RecordKind::warmup).size() == 2);
  CHECK(rows_of(tuner, RecordKind::sample).empty());
  for (int i = 0; i < 3; ++i) tuner.record_step({step_bytes, 0.1, 0});
  const auto& h = tuner.history();
  REQUIRE(h.size() == 4);
  CHECK(h[0].kind == RecordKind::warmup);
  CHECK(h[0].steps == 3);
  CHECK(h[0].seconds == doctest::Approx(30.0));
  CHECK(h[0].configuration == -1);
  CHECK(h[2].kind == RecordKind::sample);
  CHECK(h[2].configuration == 0);
  CHECK(h[2].knobs == Knobs{});  // the first configuration measured is the base one
  CHECK(h[3].kind == RecordKind::median);
  CHECK(h[3].score_bytes_per_second == doctest::Approx(step_bytes / 0.1));
}

TEST_CASE("a configuration's score is the median of its samples") {
  TunerOptions o = small_options();
  o.samples_per_configuration = 5;
  o.autotune_steps_per_sample = 2;
  Tuner tuner(SearchSpace(SearchSpaceOptions{}), o);
  // Sample seconds 1, 5, 2, 100, 3 (two steps each): the median sample took 3 s.
  for (double s : {1.0, 5.0, 2.0, 100.0, 3.0}) {
    tuner.record_step({step_bytes, s / 2, 0});
    tuner.record_step({step_bytes, s / 2, 0});
  }
  const auto medians = rows_of(tuner, RecordKind::median);
  REQUIRE(medians.size() == 1);
  CHECK(medians[0].score_bytes_per_second == doctest::Approx(2.0 * step_bytes / 3.0));

  // Over a whole run, every median row is the median of its configuration's sample rows.
  run_to_end(tuner, step_seconds);
  for (const auto& m : rows_of(tuner, RecordKind::median)) {
    std::vector<double> scores;
    for (const auto& s : rows_of(tuner, RecordKind::sample)) {
      if (s.configuration == m.configuration) {
        CHECK(s.knobs == m.knobs);
        CHECK(s.steps == 2);
        scores.push_back(s.score_bytes_per_second);
      }
    }
    REQUIRE(scores.size() == 5);
    std::sort(scores.begin(), scores.end());
    CHECK(m.score_bytes_per_second == scores[2]);
  }
}

TEST_CASE("tuning stops after the budget and keeps the best configuration") {
  TunerOptions o = small_options();
  o.autotune_bayes_opt_max_samples = 8;
  o.samples_per_configuration = 3;
  Tuner tuner(SearchSpace(SearchSpaceOptions{}), o);
  run_to_end(tuner, step_seconds);
  REQUIRE(tuner.done());
  CHECK(tuner.configurations_measured() == 8);
  const auto medians = rows_of(tuner, RecordKind::median);
  REQUIRE(medians.size() == 8);
  const auto best = std::max_element(medians.begin(), medians.end(), [](const auto& a, const auto& b) {
    return a.score_bytes_per_second < b.score_bytes_per_second;
  });
  REQUIRE(tuner.best());
  CHECK(tuner.best()->knobs == best->knobs);
  CHECK(tuner.best()->score_bytes_per_second == best->score_bytes_per_second);
  CHECK(tuner.best()->configuration == best->configuration);
  CHECK(tuner.knobs() == best->knobs);  // what the engine applies from now on

  const TuningRecord& choice = tuner.history().back();
  CHECK(choice.kind == RecordKind::choice);
  CHECK(choice.knobs == best->knobs);
  CHECK(choice.configuration == best->configuration);
  CHECK(choice.generation == tuner.generation());
  CHECK(rows_of(tuner, RecordKind::choice).size() == 1);

  // Afterwards steps change nothing.
  const auto history = tuner.history().size();
  const auto generation = tuner.generation();
  for (int i = 0; i < 50; ++i) {
    CHECK_FALSE(tuner.record_step({step_bytes, 1e-3, tuner.generation()}));
  }
  CHECK(tuner.history().size() == history);
  CHECK(tuner.generation() == generation);
  CHECK(tuner.knobs() == best->knobs);
}

TEST_CASE("generations: one per change, stale steps ignored, settle steps discarded") {
  TunerOptions o = small_options();
  o.autotune_steps_per_sample = 2;
  o.settle_steps = 2;
  o.autotune_bayes_opt_max_samples = 5;
  Tuner tuner(SearchSpace(SearchSpaceOptions{}), o);
  std::uint64_t generation = tuner.generation();
  CHECK(generation == 0);
  Knobs previous = tuner.knobs();
  int changes = 0;
  int since_change = 1000;
  while (!tuner.done()) {
    // A step that began under the previous generation, very slow: must not count.
    if (generation > 0) CHECK_FALSE(tuner.record_step({step_bytes, 50.0, generation - 1}));
    // The first settle_steps steps of a new configuration are slow too: discarded.
    const double seconds = since_change < 2 ? 50.0 : 0.1;
    const bool changed = tuner.record_step({step_bytes, seconds, generation});
    ++since_change;
    if (changed) {
      ++changes;
      CHECK(tuner.generation() == generation + 1);
      CHECK(tuner.knobs() != previous);
      generation = tuner.generation();
      previous = tuner.knobs();
      since_change = 0;
    } else {
      CHECK(tuner.generation() == generation);
    }
  }
  CHECK(static_cast<std::uint64_t>(changes) == tuner.generation());
  for (const auto& s : rows_of(tuner, RecordKind::sample)) {
    CHECK(s.steps == 2);
    CHECK(s.seconds == doctest::Approx(0.2));  // no slow step got in
  }
  for (const auto& r : tuner.history()) {
    if (r.kind == RecordKind::sample || r.kind == RecordKind::median) {
      CHECK(r.knobs == rows_of(tuner, RecordKind::median)[static_cast<std::size_t>(r.configuration)].knobs);
    }
  }
}

TEST_CASE("knobs the user fixed are never changed") {
  SearchSpaceOptions space;
  space.base.cycle_time_ms = 3.7;
  space.base.response_cache = false;
  space.base.hierarchical_allreduce = true;  // single host: not tuned either
  space.fixed = {Knob::cycle_time, Knob::response_cache};
  TunerOptions o = small_options();
  o.autotune_bayes_opt_max_samples = 10;
  Tuner tuner{SearchSpace(space), o};
  run_to_end(tuner, step_seconds);
  REQUIRE(tuner.done());
  bool threshold_varied = false;
  for (const auto& r : tuner.history()) {
    CHECK(r.knobs.cycle_time_ms == 3.7);
    CHECK_FALSE(r.knobs.response_cache);
    CHECK(r.knobs.hierarchical_allreduce);
    threshold_varied = threshold_varied || r.knobs.fusion_threshold_bytes != Knobs{}.fusion_threshold_bytes;
  }
  CHECK(threshold_varied);

  // On several hosts hierarchical allreduce is tuned too.
  SearchSpaceOptions multi;
  multi.multi_host = true;
  TunerOptions m = small_options();
  m.autotune_bayes_opt_max_samples = 10;
  Tuner both{SearchSpace(multi), m};
  run_to_end(both, step_seconds);
  bool on = false, off = false;
  for (const auto& r : both.history()) (r.knobs.hierarchical_allreduce ? on : off) = true;
  CHECK((on && off));
}

TEST_CASE("a job with nothing to tune keeps its configuration") {
  SearchSpaceOptions space;
  space.base.fusion_threshold_bytes = 8 * MiB;
  space.fixed = {Knob::fusion_threshold, Knob::cycle_time, Knob::response_cache, Knob::fusion_pipeline,
                 Knob::pieces_in_flight};
  Tuner tuner{SearchSpace(space), TunerOptions{}};
  CHECK(tuner.done());
  CHECK(tuner.generation() == 0);
  CHECK(tuner.knobs() == space.base);
  CHECK_FALSE(tuner.record_step({step_bytes, 0.1, 0}));
  CHECK(tuner.history().empty());
  CHECK_FALSE(tuner.best());
}

TEST_CASE("a budget of one measures the base configuration and keeps it") {
  TunerOptions o = small_options();
  o.autotune_bayes_opt_max_samples = 1;
  Tuner tuner(SearchSpace(SearchSpaceOptions{}), o);
  CHECK_FALSE(tuner.record_step({step_bytes, 0.1, 0}));
  CHECK(tuner.done());
  CHECK(tuner.generation() == 0);
  CHECK(tuner.knobs() == Knobs{});
  CHECK(tuner.history().back().kind == RecordKind::choice);
}

TEST_CASE("steps that reduce nothing still give a finite model") {
  TunerOptions o = small_options();
  Tuner tuner(SearchSpace(SearchSpaceOptions{}), o);
  int steps = 0;
  while (!tuner.done() && steps++ < 100) tuner.record_step({0, 0.1, tuner.generation()});
  CHECK(tuner.done());
  CHECK(tuner.best()->score_bytes_per_second == 0.0);
}

TEST_CASE("the same reports give the same decisions") {
  TunerOptions o = small_options();
  o.autotune_bayes_opt_max_samples = 10;
  o.seed = 17;
  Tuner a(SearchSpace(SearchSpaceOptions{}), o), b(SearchSpace(SearchSpaceOptions{}), o);
  run_to_end(a, step_seconds);
  run_to_end(b, step_seconds);
  REQUIRE(a.history().size() == b.history().size());
  for (std::size_t i = 0; i < a.history().size(); ++i) CHECK(a.history()[i].knobs == b.history()[i].knobs);
}

TEST_CASE("the tuner finds a clearly better configuration than the default on a smooth model") {
  Tuner tuner(SearchSpace(SearchSpaceOptions{}), TunerOptions{});
  const int steps = run_to_end(tuner, step_seconds);
  // 3 warmup samples, then 20 configurations x (1 settle step + 5 samples x 10 steps), less the
  // settle step of the first one.
  CHECK(steps <= 3 * 10 + 20 * 51);
  REQUIRE(tuner.done());
  CHECK(step_seconds(tuner.knobs()) < 0.97 * step_seconds(Knobs{}));
  CHECK(step_seconds(tuner.knobs()) < 1.03 * 0.1);  // the model's optimum is 0.1 s
}

TEST_CASE("impossible reports and options are rejected") {
  Tuner tuner(SearchSpace(SearchSpaceOptions{}), TunerOptions{});
  CHECK_THROWS_AS(tuner.record_step({-1, 0.1, 0}), dtrain::InvalidArgumentError);
  CHECK_THROWS_AS(tuner.record_step({1, 0.0, 0}), dtrain::InvalidArgumentError);
  CHECK_THROWS_AS(tuner.record_step({1, -1.0, 0}), dtrain::InvalidArgumentError);
  CHECK_THROWS_AS(tuner.record_step({1, NAN, 0}), dtrain::InvalidArgumentError);
  CHECK_THROWS_AS(tuner.record_step({1, INFINITY, 0}), dtrain::InvalidArgumentError);
  for (auto change : std::vector<std::function<void(TunerOptions&)>>{
           [](TunerOptions& o) { o.autotune_warmup_samples = -1; },
           [](TunerOptions& o) { o.autotune_steps_per_sample = 0; },
           [](TunerOptions& o) { o.samples_per_configuration = 0; },
           [](TunerOptions& o) { o.autotune_bayes_opt_max_samples = 0; },
           [](TunerOptions& o) { o.settle_steps = -1; },
           [](TunerOptions& o) { o.autotune_gaussian_process_noise = -0.5; }}) {
    TunerOptions o;
    change(o);
    CHECK_THROWS_AS(Tuner(SearchSpace(SearchSpaceOptions{}), o), dtrain::InvalidArgumentError);
  }
}

TEST_CASE("tuner options come from the DTRAIN_AUTOTUNE_* settings") {
  dtrain::Config c;
  c.autotune_warmup_samples = 1;
  c.autotune_steps_per_sample = 7;
  c.autotune_bayes_opt_max_samples = 12;
  c.autotune_gaussian_process_noise = 0.25;
  const TunerOptions o = tuner_options(c);
  CHECK(o.autotune_warmup_samples == 1);
  CHECK(o.autotune_steps_per_sample == 7);
  CHECK(o.autotune_bayes_opt_max_samples == 12);
  CHECK(o.autotune_gaussian_process_noise == 0.25);
  const TunerOptions d = tuner_options(dtrain::Config{});
  CHECK(d.autotune_warmup_samples == 3);
  CHECK(d.autotune_steps_per_sample == 10);
  CHECK(d.autotune_bayes_opt_max_samples == 20);
  CHECK(d.autotune_gaussian_process_noise == 0.8);
}

TEST_CASE("a knob is the user's when its variable is set or its field is not the default") {
  using dtrain::detail::MapEnv;
  const dtrain::Config defaults;
  CHECK(knobs_set_by_user(defaults, MapEnv{}).empty());
  CHECK(knobs_set_by_user(defaults, MapEnv{{"DTRAIN_CYCLE_TIME", "1"}}) == KnobSet{Knob::cycle_time});
  CHECK(knobs_set_by_user(defaults, MapEnv{{"HOROVOD_FUSION_THRESHOLD", "134217728"}}) ==
        KnobSet{Knob::fusion_threshold});
  CHECK(knobs_set_by_user(defaults, MapEnv{{"DTRAIN_CACHE_CAPACITY", "1024"},
                                           {"DTRAIN_FUSION_PIPELINE", "1"},
                                           {"DTRAIN_HIERARCHICAL_ALLREDUCE", "0"}}) ==
        KnobSet{Knob::response_cache, Knob::fusion_pipeline, Knob::hierarchical_allreduce});
  CHECK(knobs_set_by_user(defaults, MapEnv{{"HOROVOD_MPI_PIECES_IN_FLIGHT", "2"}}) ==
        KnobSet{Knob::pieces_in_flight});
  CHECK(knobs_set_by_user(defaults, MapEnv{{"DTRAIN_AUTOTUNE", "1"}}).empty());

  dtrain::Config c;
  c.fusion_threshold_bytes = 8 * MiB;
  c.cache_capacity = 512;  // still on, but a choice
  CHECK(knobs_set_by_user(c, MapEnv{}) == KnobSet{Knob::fusion_threshold, Knob::response_cache});
  dtrain::Config p;
  p.fusion_pipeline = false;
  p.hierarchical_allreduce = true;
  p.cycle_time_ms = 0.5;
  p.mpi_pieces_in_flight = 4;
  CHECK(knobs_set_by_user(p, MapEnv{}) ==
        KnobSet{Knob::fusion_pipeline, Knob::hierarchical_allreduce, Knob::cycle_time,
                Knob::pieces_in_flight});
}

TEST_CASE("knobs map onto Config and back") {
  dtrain::Config base;
  base.cache_capacity = 300;
  const Knobs k{64 * MiB, 2.5, true, false, false, 5};
  const dtrain::Config applied = apply_knobs(base, k);
  CHECK(applied.mpi_pieces_in_flight == 5);
  CHECK(applied.fusion_threshold_bytes == 64 * MiB);
  CHECK(applied.cycle_time_ms == 2.5);
  CHECK(applied.hierarchical_allreduce);
  CHECK(applied.cache_capacity == 0);
  CHECK_FALSE(applied.fusion_pipeline);
  CHECK(knobs_from_config(applied) == k);
  // Cache on keeps the configured capacity, or takes the default where it was 0.
  CHECK(apply_knobs(base, Knobs{}).cache_capacity == 300);
  dtrain::Config off;
  off.cache_capacity = 0;
  CHECK(apply_knobs(off, Knobs{}).cache_capacity == dtrain::Config{}.cache_capacity);
  CHECK(knobs_from_config(dtrain::Config{}) == Knobs{});
  CHECK(describe(k) ==
        "fusion threshold 64 MiB, cycle time 2.5 ms, hierarchical allreduce on, response cache "
        "off, fusion pipeline off, 5 pieces in flight");
}
