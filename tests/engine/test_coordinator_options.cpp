// The coordinator's options from a Config: every setting the coordinator reads is taken from it.
#include <doctest/doctest.h>

#include "dtrain/core/config.hpp"
#include "dtrain/runtime/negotiation/coordinator_options.hpp"

using namespace dtrain;
using namespace dtrain::detail;

TEST_SUITE("coordinator options") {

TEST_CASE("CoordinatorOptions::from takes every coordinator setting from the Config") {
  Config config;  // every field the coordinator reads differs from its default
  config.fusion_threshold_bytes = 4096;
  config.cycle_time_ms = 2.5;
  config.cache_capacity = 7;
  config.stall_check_disable = true;
  config.stall_check_time_seconds = 11;
  config.stall_shutdown_time_seconds = 22;
  config.op_timeout_seconds = 33;
  const CoordinatorOptions o = CoordinatorOptions::from(config, 5);
  CHECK(o.size == 5);
  CHECK(o.fusion_threshold_bytes == 4096);
  CHECK(o.cycle_time_ms == 2.5);
  CHECK(o.cache_capacity == 7);
  CHECK(o.stall_check_disable);
  CHECK(o.stall_check_time_seconds == 11);
  CHECK(o.stall_shutdown_time_seconds == 22);
  CHECK(o.op_timeout_seconds == 33);
}

}  // TEST_SUITE
