// The default Profiler reads DTRAIN_PROFILE and DTRAIN_PROFILE_INTERVAL_MS through dtrain's
// Config. ctest runs this binary twice: with a valid environment (test case "on") and with an
// interval out of range (test case "bad_interval").
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "dtrain/dtrain.hpp"

TEST_CASE("on") {
  const char* dir = std::getenv("DTRAIN_PROFILE");
  REQUIRE(dir);
  dtrain::init();
  {
    dtrain::Profiler profiler;
    CHECK(profiler.enabled());
    CHECK(profiler.path() ==
          (std::filesystem::path(dir) / ("rank-" + std::to_string(dtrain::rank()) + ".jsonl"))
              .string());
    auto step = profiler.step();
  }
  std::ifstream in((std::filesystem::path(dir) / ("rank-" + std::to_string(dtrain::rank()) +
                                                  ".jsonl")));
  std::string first;
  std::getline(in, first);
  const auto header = nlohmann::json::parse(first);
  CHECK(header.at("sample_interval_ms") == 200);
  dtrain::shutdown();
}

TEST_CASE("bad_interval") {
  dtrain::init();
  CHECK_THROWS_WITH_AS(dtrain::Profiler{},
                       doctest::Contains("dtrain: DTRAIN_PROFILE_INTERVAL_MS (Config::"
                                         "profile_interval_ms) = 20 is out of range"),
                       dtrain::InvalidArgumentError);
  dtrain::shutdown();
}
