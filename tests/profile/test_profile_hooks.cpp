// The runtime's side of Note [Profile hooks], without MPI: what init() does with DTRAIN_PROFILE
// when the profiler is not part of the program, as in a header-only program built from narrower
// headers than <dtrain/dtrain.hpp> (here the hooks the library filled are set aside).
#include <doctest/doctest.h>

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dtrain/core/config.hpp"
#include "dtrain/core/logging.hpp"
#include "dtrain/runtime/engine/profile_hooks.hpp"
#include "dtrain/runtime/execution/topology.hpp"

TEST_CASE("without the profiler in the program, init() says that DTRAIN_PROFILE is ignored") {
  using namespace dtrain::detail;
  CHECK(static_cast<bool>(profile_hooks.open));  // this program links dtrain::dtrain: the profiler is in
  const auto open = std::exchange(profile_hooks.open, nullptr);
  std::vector<std::string> lines;
  set_log_sink([&](std::string_view line) { lines.emplace_back(line); });
  dtrain::Config config;
  const Topology topology;
  open_job_profile(config, MPI_COMM_NULL, topology);  // profiling off: nothing to say
  CHECK(lines.empty());
  config.profile_dir = "some/folder";
  open_job_profile(config, MPI_COMM_NULL, topology);
  set_log_sink(nullptr);
  profile_hooks.open = open;
  REQUIRE(lines.size() == 1);
  CHECK(lines[0].find("DTRAIN_PROFILE=some/folder is ignored: this program was built header-only "
                      "without dtrain's profiler; include <dtrain/dtrain.hpp>") !=
        std::string::npos);
}
