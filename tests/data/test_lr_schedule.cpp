#include "dtrain/train/lr_schedule.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <numbers>
#include <string>
#include <vector>

namespace {

// Goyal et al.'s ImageNet recipe on 8 workers: 0.1 per worker, 5 warmup epochs, drops by 10x
// at epochs 30, 60 and 80.
dtrain::LrScheduleOptions goyal(dtrain::Decay decay) {
  dtrain::LrScheduleOptions o;
  o.base_lr = 0.1;
  o.world_size = 8;
  o.warmup_epochs = 5;
  o.steps_per_epoch = 100;
  o.decay = decay;
  o.gamma = 0.1;
  o.step_epochs = 30;
  o.milestones = {30, 60, 80};
  o.total_epochs = 90;
  return o;
}

std::string message_of(const dtrain::LrScheduleOptions& o) {
  try {
    dtrain::LrSchedule schedule(o);
  } catch (const dtrain::InvalidArgumentError& e) {
    return e.what();
  }
  return "no exception";
}

}  // namespace

TEST_CASE("linear scaling with gradual warmup, per step") {
  const dtrain::LrSchedule s(goyal(dtrain::Decay::none));
  CHECK(s.peak_lr() == doctest::Approx(0.8));
  CHECK(s.lr_at_step(0) == doctest::Approx(0.1));          // starts at the single-worker rate
  CHECK(s.lr_at_step(1) == doctest::Approx(0.1 + 0.7 / 500));
  CHECK(s.lr_at_step(250) == doctest::Approx(0.45));       // halfway through warmup
  CHECK(s.lr_at_step(499) == doctest::Approx(0.1 + 0.7 * 499.0 / 500));
  CHECK(s.lr_at_step(500) == doctest::Approx(0.8));        // end of warmup: the scaled rate
  CHECK(s.lr_at_step(100000) == doctest::Approx(0.8));
  CHECK(s.lr_at_epoch(2.5) == doctest::Approx(s.lr_at_step(250)));
  // Strictly increasing during warmup.
  for (std::int64_t step = 1; step <= 500; ++step) {
    CHECK(s.lr_at_step(step) > s.lr_at_step(step - 1));
  }
}

TEST_CASE("no warmup and no scaling") {
  auto o = goyal(dtrain::Decay::none);
  o.warmup_epochs = 0;
  CHECK(dtrain::LrSchedule(o).lr_at_step(0) == doctest::Approx(0.8));
  o.scale_by_world_size = false;
  const dtrain::LrSchedule s(o);
  CHECK(s.peak_lr() == doctest::Approx(0.1));
  CHECK(s.lr_at_step(0) == doctest::Approx(0.1));
  CHECK(s.lr_at_epoch(50) == doctest::Approx(0.1));
  CHECK(s.options().world_size == 8);
}

TEST_CASE("step decay counts from epoch 0") {
  const dtrain::LrSchedule s(goyal(dtrain::Decay::step));
  CHECK(s.lr_at_step(0) == doctest::Approx(0.1));
  CHECK(s.lr_at_step(500) == doctest::Approx(0.8));
  CHECK(s.lr_at_step(2999) == doctest::Approx(0.8));
  CHECK(s.lr_at_step(3000) == doctest::Approx(0.08));   // epoch 30
  CHECK(s.lr_at_step(5999) == doctest::Approx(0.08));
  CHECK(s.lr_at_step(6000) == doctest::Approx(0.008));  // epoch 60
  CHECK(s.lr_at_step(8999) == doctest::Approx(0.008));  // last step of epoch 89
  CHECK(s.lr_at_epoch(90) == doctest::Approx(0.0008));
}

TEST_CASE("multi-step decay at the milestones") {
  const dtrain::LrSchedule s(goyal(dtrain::Decay::multi_step));
  CHECK(s.lr_at_step(0) == doctest::Approx(0.1));
  CHECK(s.lr_at_step(500) == doctest::Approx(0.8));
  CHECK(s.lr_at_step(2999) == doctest::Approx(0.8));
  CHECK(s.lr_at_step(3000) == doctest::Approx(0.08));
  CHECK(s.lr_at_step(6000) == doctest::Approx(0.008));
  CHECK(s.lr_at_step(7999) == doctest::Approx(0.008));
  CHECK(s.lr_at_step(8000) == doctest::Approx(0.0008));
  CHECK(s.lr_at_step(8999) == doctest::Approx(0.0008));  // last epoch
  CHECK(s.lr_at_epoch(200) == doctest::Approx(0.0008));  // no more milestones
  // A milestone exactly at the end of warmup applies there.
  auto o = goyal(dtrain::Decay::multi_step);
  o.milestones = {5};
  CHECK(dtrain::LrSchedule(o).lr_at_epoch(5) == doctest::Approx(0.08));
  CHECK(dtrain::LrSchedule(o).lr_at_epoch(4.99) < 0.8);
}

TEST_CASE("cosine decay from the end of warmup to total_epochs") {
  auto o = goyal(dtrain::Decay::cosine);
  const dtrain::LrSchedule s(o);
  CHECK(s.lr_at_step(0) == doctest::Approx(0.1));
  CHECK(s.lr_at_step(500) == doctest::Approx(0.8));        // continuous at the end of warmup
  CHECK(s.lr_at_epoch(47.5) == doctest::Approx(0.4));      // halfway from 5 to 90
  CHECK(s.lr_at_epoch(90) == doctest::Approx(0.0));
  CHECK(s.lr_at_epoch(120) == doctest::Approx(0.0));
  CHECK(s.lr_at_step(8999) == doctest::Approx(0.8 * 0.5 * (1 + std::cos(std::numbers::pi * 84.99 / 85))));
  for (std::int64_t step = 501; step <= 9000; ++step) {
    CHECK(s.lr_at_step(step) < s.lr_at_step(step - 1));
  }
  o.min_lr = 0.01;
  const dtrain::LrSchedule floor(o);
  CHECK(floor.lr_at_epoch(5) == doctest::Approx(0.8));
  CHECK(floor.lr_at_epoch(47.5) == doctest::Approx(0.01 + 0.79 / 2));
  CHECK(floor.lr_at_epoch(90) == doctest::Approx(0.01));
  CHECK(floor.lr_at_epoch(1000) == doctest::Approx(0.01));
}

TEST_CASE("every option is validated and the message names it") {
  using dtrain::Decay;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  struct Case {
    const char* name;
    dtrain::LrScheduleOptions options;
    const char* expected;
  };
  std::vector<Case> cases;
  auto add = [&](const char* name, Decay decay, auto&& edit, const char* expected) {
    auto o = goyal(decay);
    edit(o);
    cases.push_back({name, o, expected});
  };
  using O = dtrain::LrScheduleOptions;
  add("base_lr 0", Decay::none, [](O& o) { o.base_lr = 0; }, "base_lr");
  add("base_lr nan", Decay::none, [&](O& o) { o.base_lr = nan; }, "base_lr");
  add("world_size", Decay::none, [](O& o) { o.world_size = 0; }, "world_size");
  add("warmup negative", Decay::none, [](O& o) { o.warmup_epochs = -1; }, "warmup_epochs");
  add("warmup inf", Decay::none, [&](O& o) { o.warmup_epochs = inf; }, "warmup_epochs");
  add("steps_per_epoch", Decay::none, [](O& o) { o.steps_per_epoch = 0; }, "steps_per_epoch");
  add("decay", Decay::none, [](O& o) { o.decay = static_cast<Decay>(42); }, "decay");
  add("gamma", Decay::step, [](O& o) { o.gamma = 0; }, "gamma");
  add("gamma nan", Decay::step, [&](O& o) { o.gamma = nan; }, "gamma");
  add("step_epochs", Decay::step, [](O& o) { o.step_epochs = 0; }, "step_epochs");
  add("step in warmup", Decay::step, [](O& o) { o.step_epochs = 2; }, "step_epochs");
  add("milestone order", Decay::multi_step, [](O& o) { o.milestones = {30, 30}; }, "ascending");
  add("milestone value", Decay::multi_step, [](O& o) { o.milestones = {-3}; }, "milestones[0]");
  add("milestone in warmup", Decay::multi_step, [](O& o) { o.milestones = {3, 30}; }, "warmup");
  add("no milestones", Decay::multi_step, [](O& o) { o.milestones.clear(); }, "milestones");
  add("total_epochs", Decay::cosine, [](O& o) { o.total_epochs = 0; }, "total_epochs");
  add("total in warmup", Decay::cosine, [](O& o) { o.total_epochs = 5; }, "total_epochs");
  add("min_lr negative", Decay::cosine, [](O& o) { o.min_lr = -0.1; }, "min_lr");
  add("min_lr above peak", Decay::cosine, [](O& o) { o.min_lr = 1.0; }, "min_lr");
  for (const auto& c : cases) {
    CAPTURE(c.name);
    const std::string m = message_of(c.options);
    CHECK(m.find(c.expected) != std::string::npos);
  }
  // The message carries the value too.
  auto o = goyal(Decay::none);
  o.world_size = -3;
  CHECK(message_of(o).find("-3") != std::string::npos);
  // Options for a decay not in use are only range-checked: a step period inside the warmup is
  // fine when decay is none.
  o = goyal(Decay::none);
  o.step_epochs = 2;
  CHECK(message_of(o) == "no exception");
}

TEST_CASE("negative steps and epochs are rejected") {
  const dtrain::LrSchedule s(goyal(dtrain::Decay::none));
  CHECK_THROWS_AS(s.lr_at_step(-1), dtrain::InvalidArgumentError);
  CHECK_THROWS_AS(s.lr_at_epoch(-0.5), dtrain::InvalidArgumentError);
  CHECK_THROWS_AS(s.lr_at_epoch(std::numeric_limits<double>::quiet_NaN()),
                  dtrain::InvalidArgumentError);
  CHECK(dtrain::to_string(dtrain::Decay::multi_step) == "multi_step");
}
