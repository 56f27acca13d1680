// DTRAIN_PROFILE and DTRAIN_PROFILE_INTERVAL_MS, read through dtrain's Config by init() and the
// default Profiler. ctest runs this binary twice: with a valid environment (test case "on") and
// with an interval out of range (test case "bad_interval").
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
  dtrain::init();  // opens the job's profile (Note [Zero-code profiling])
  std::filesystem::path file;
  {
    dtrain::Profiler profiler;
    CHECK(profiler.enabled());
    CHECK(profiler.attached());
    file = profiler.path();  // the job's file, in the run's folder (Note [Profile layout])
    CHECK(file.filename() == "rank-" + std::to_string(dtrain::rank()) + ".jsonl");
    CHECK(file.parent_path().parent_path() == std::filesystem::path(dir));
    auto step = profiler.step();
  }
  dtrain::shutdown();
  std::ifstream in(file);
  std::string first, line, last;
  std::getline(in, first);
  while (std::getline(in, line))
    if (line.find_first_not_of(' ') != std::string::npos) last = line;
  const auto header = nlohmann::json::parse(first);
  CHECK(header.at("sample_interval_ms") == 200);
  CHECK(header.at("run_id") == file.parent_path().filename().string());
  CHECK(nlohmann::json::parse(last).at("type") == "end");  // closed by shutdown()
}

TEST_CASE("bad_interval") {
  // Checked at init() even with profiling off, on every rank.
  CHECK_THROWS_WITH_AS(dtrain::init(),
                       doctest::Contains("dtrain: DTRAIN_PROFILE_INTERVAL_MS (Config::"
                                         "profile_interval_ms) = 20 is out of range"),
                       dtrain::InvalidArgumentError);
  CHECK(!dtrain::is_initialized());
}
