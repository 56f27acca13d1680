#include "dtrain/core/config.hpp"
#include "dtrain/core/config_knobs.hpp"
#include "dtrain/core/horovod_knobs.hpp"

#include <doctest/doctest.h>
#include <stdlib.h>

#include <cmath>
#include <fstream>
#include <iterator>
#include <functional>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "log_capture.hpp"

using dtrain::Config;
using dtrain::InvalidArgumentError;
using dtrain::LogLevel;
using dtrain::detail::config_from_env;
using dtrain::detail::env_warnings;
using dtrain::detail::MapEnv;
using dtrain::test::LogCapture;

namespace {

// One row per setting, written out by hand rather than derived from the knob table, so the test
// states the contract independently.
struct KnobCase {
  std::string suffix;
  std::function<bool(const Config&)> is_default;
  std::string good;
  std::function<bool(const Config&)> good_applied;
  std::vector<std::string> bad;
};

const std::vector<KnobCase>& knob_cases() {
  static const std::vector<KnobCase> cases = {
      {"FUSION_THRESHOLD", [](const Config& c) { return c.fusion_threshold_bytes == 134217728; },
       "64M", [](const Config& c) { return c.fusion_threshold_bytes == 64 << 20; },
       {"abc", "-1", "1.5", "12X", "", "99999999999999999999", " 1"}},
      {"CYCLE_TIME", [](const Config& c) { return c.cycle_time_ms == 1.0; }, "0.5",
       [](const Config& c) { return c.cycle_time_ms == 0.5; },
       {"abc", "-1", "inf", "nan", "1e400", "1,5", "", "1e10"}},
      {"CACHE_CAPACITY", [](const Config& c) { return c.cache_capacity == 1024; }, "0",
       [](const Config& c) { return c.cache_capacity == 0; }, {"-5", "ten", "1.0"}},
      {"HIERARCHICAL_ALLREDUCE", [](const Config& c) { return !c.hierarchical_allreduce; }, "YES",
       [](const Config& c) { return c.hierarchical_allreduce; }, {"2", "maybe", ""}},
      {"TIMELINE", [](const Config& c) { return c.timeline_path.empty(); }, "/tmp/timeline.json",
       [](const Config& c) { return c.timeline_path == "/tmp/timeline.json"; }, {}},
      {"TIMELINE_MARK_CYCLES", [](const Config& c) { return !c.timeline_mark_cycles; }, "on",
       [](const Config& c) { return c.timeline_mark_cycles; }, {"y", "10"}},
      {"TIMELINE_MAX_BYTES", [](const Config& c) { return c.timeline_max_bytes == 1073741824; },
       "1k", [](const Config& c) { return c.timeline_max_bytes == 1024; }, {"-1", "1T"}},
      {"AUTOTUNE", [](const Config& c) { return !c.autotune; }, "True",
       [](const Config& c) { return c.autotune; }, {"tru"}},
      {"AUTOTUNE_LOG", [](const Config& c) { return c.autotune_log.empty(); }, "tune.csv",
       [](const Config& c) { return c.autotune_log == "tune.csv"; }, {}},
      {"AUTOTUNE_CACHE", [](const Config& c) { return c.autotune_cache.empty(); }, "tuned.txt",
       [](const Config& c) { return c.autotune_cache == "tuned.txt"; }, {}},
      {"AUTOTUNE_WARMUP_SAMPLES", [](const Config& c) { return c.autotune_warmup_samples == 3; },
       "0", [](const Config& c) { return c.autotune_warmup_samples == 0; },
       {"-1", "3000000000", "x"}},
      {"AUTOTUNE_STEPS_PER_SAMPLE",
       [](const Config& c) { return c.autotune_steps_per_sample == 10; }, "7",
       [](const Config& c) { return c.autotune_steps_per_sample == 7; }, {"0", "-2"}},
      {"AUTOTUNE_BAYES_OPT_MAX_SAMPLES",
       [](const Config& c) { return c.autotune_bayes_opt_max_samples == 20; }, "50",
       [](const Config& c) { return c.autotune_bayes_opt_max_samples == 50; }, {"0"}},
      {"AUTOTUNE_GAUSSIAN_PROCESS_NOISE",
       [](const Config& c) { return c.autotune_gaussian_process_noise == 0.8; }, "0.25",
       [](const Config& c) { return c.autotune_gaussian_process_noise == 0.25; },
       {"-0.1", "noisy"}},
      {"STALL_CHECK_DISABLE", [](const Config& c) { return !c.stall_check_disable; }, "1",
       [](const Config& c) { return c.stall_check_disable; }, {"disable"}},
      {"STALL_CHECK_TIME_SECONDS",
       [](const Config& c) { return c.stall_check_time_seconds == 60; }, "5.5",
       [](const Config& c) { return c.stall_check_time_seconds == 5.5; }, {"0", "-1", "soon", "0.5"}},
      {"STALL_SHUTDOWN_TIME_SECONDS",
       [](const Config& c) { return c.stall_shutdown_time_seconds == 0; }, "120",
       [](const Config& c) { return c.stall_shutdown_time_seconds == 120; },
       {"-1", "30", "never"}},
      {"LOG_LEVEL", [](const Config& c) { return c.log_level == LogLevel::warning; }, "DEBUG",
       [](const Config& c) { return c.log_level == LogLevel::debug; }, {"verbose", "", "3"}},
      {"NUM_NCCL_STREAMS", [](const Config& c) { return c.num_nccl_streams == 1; }, "4",
       [](const Config& c) { return c.num_nccl_streams == 4; }, {"0", "65", "four"}},
      {"PROFILE", [](const Config& c) { return c.profile_dir.empty(); }, "profile-out",
       [](const Config& c) { return c.profile_dir == "profile-out"; }, {}},
      {"PROFILE_INTERVAL_MS", [](const Config& c) { return c.profile_interval_ms == 500; }, "100",
       [](const Config& c) { return c.profile_interval_ms == 100; }, {"0", "-5"}},
      {"OP_TIMEOUT_SECONDS", [](const Config& c) { return c.op_timeout_seconds == 600; }, "0",
       [](const Config& c) { return c.op_timeout_seconds == 0; }, {"-3", "1e10", "forever", "0.5"}},
      {"PEER_TIMEOUT_SECONDS", [](const Config& c) { return c.peer_timeout_seconds == 60; }, "0",
       [](const Config& c) { return c.peer_timeout_seconds == 0; }, {"-1", "1.5", "never", "inf"}},
      {"MPI_CHUNK_BYTES", [](const Config& c) { return c.mpi_chunk_bytes == 16777216; }, "4K",
       [](const Config& c) { return c.mpi_chunk_bytes == 4096; }, {"4095", "2G", "0"}},
      {"MPI_PIECES_IN_FLIGHT", [](const Config& c) { return c.mpi_pieces_in_flight == 2; }, "4",
       [](const Config& c) { return c.mpi_pieces_in_flight == 4; }, {"0", "17", "two"}},
      {"WAIT_MAX_SLEEP_US", [](const Config& c) { return c.wait_max_sleep_us == 500; }, "0",
       [](const Config& c) { return c.wait_max_sleep_us == 0; }, {"-1", "100001", "nan"}},
      {"MPI_NONBLOCKING", [](const Config& c) { return !c.mpi_nonblocking; }, "1",
       [](const Config& c) { return c.mpi_nonblocking; }, {"2"}},
      {"FUSION_PIPELINE", [](const Config& c) { return c.fusion_pipeline; }, "off",
       [](const Config& c) { return !c.fusion_pipeline; }, {"2"}},
      {"HOST_ID", [](const Config& c) { return c.host_id.empty(); }, "node-a",
       [](const Config& c) { return c.host_id == "node-a"; }, {}},
      {"CPU_OPERATIONS", [](const Config& c) { return c.cpu_operations == "auto"; }, "gloo",
       [](const Config& c) { return c.cpu_operations == "gloo"; }, {"ccl", "MPI"}},
      {"GLOO_IFACE", [](const Config& c) { return c.gloo_iface.empty(); }, "eth1",
       [](const Config& c) { return c.gloo_iface == "eth1"; }, {}},
  };
  return cases;
}

std::string error_of(const MapEnv& env) {
  try {
    (void)config_from_env(env);
  } catch (const InvalidArgumentError& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& text, const std::string& fragment) {
  return text.find(fragment) != std::string::npos;
}

}  // namespace

TEST_CASE("the test table covers every setting") {
  std::set<std::string> known;
  dtrain::detail::for_each_knob([&](const auto& knob) { known.insert(std::string(knob.suffix)); });
  std::set<std::string> tested;
  for (const KnobCase& k : knob_cases()) tested.insert(k.suffix);
  CHECK(known == tested);
  CHECK(known.size() == 31);
}

TEST_CASE("an empty environment gives the documented defaults, which validate") {
  LogCapture capture;
  const Config config = config_from_env(MapEnv{});
  for (const KnobCase& k : knob_cases()) CHECK_MESSAGE(k.is_default(config), k.suffix);
  CHECK(capture.lines().empty());
  CHECK_NOTHROW(Config{}.validate());
  const Config defaults;
  for (const KnobCase& k : knob_cases()) CHECK_MESSAGE(k.is_default(defaults), k.suffix);
}

TEST_CASE("every setting: good value, HOROVOD_ alias, precedence, bad values") {
  LogCapture capture;
  for (const KnobCase& k : knob_cases()) {
    const std::string primary = "DTRAIN_" + k.suffix;
    const std::string alias = "HOROVOD_" + k.suffix;
    INFO("setting ", primary);

    const Config from_primary = config_from_env(MapEnv{{primary, k.good}});
    CHECK(k.good_applied(from_primary));
    CHECK_NOTHROW(from_primary.validate());

    const Config from_alias = config_from_env(MapEnv{{alias, k.good}});
    CHECK(k.good_applied(from_alias));

    // DTRAIN_ wins, whatever the alias holds, even a value that would be rejected.
    for (const std::string& other : k.bad.empty() ? std::vector<std::string>{"other"} : k.bad) {
      const Config both = config_from_env(MapEnv{{primary, k.good}, {alias, other}});
      CHECK(k.good_applied(both));
    }
    const Config alias_loses = config_from_env(MapEnv{{primary, k.good}, {alias, ""}});
    CHECK(k.good_applied(alias_loses));

    for (const std::string& bad : k.bad) {
      INFO("bad value \"", bad, "\"");
      const std::string message = error_of(MapEnv{{primary, bad}});
      CHECK(contains(message, primary + "=\"" + bad + "\""));
      CHECK(contains(message, "expected"));
      const std::string via_alias = error_of(MapEnv{{alias, bad}});
      CHECK(contains(via_alias, alias + "=\"" + bad + "\""));
      CHECK_FALSE(contains(via_alias, primary));
      // A good alias does not rescue a bad primary: the primary is what is read.
      CHECK(contains(error_of(MapEnv{{primary, bad}, {alias, k.good}}), primary));
    }
  }
}

TEST_CASE("error messages say what was wrong and what is accepted") {
  CHECK(error_of(MapEnv{{"DTRAIN_CYCLE_TIME", "abc"}}) ==
        "DTRAIN_CYCLE_TIME=\"abc\" is not a number: expected milliseconds as a non-negative "
        "decimal, e.g. 1 or 0.5");
  CHECK(error_of(MapEnv{{"HOROVOD_CYCLE_TIME", "-2"}}) ==
        "HOROVOD_CYCLE_TIME=\"-2\" is out of range: expected milliseconds as a non-negative "
        "decimal, e.g. 1 or 0.5");
  CHECK(error_of(MapEnv{{"DTRAIN_FUSION_THRESHOLD", "64MB"}}) ==
        "DTRAIN_FUSION_THRESHOLD=\"64MB\" is not an integer: expected bytes as a non-negative "
        "integer with an optional K, M or G suffix, e.g. 134217728 or 64M; 0 disables fusion");
  CHECK(error_of(MapEnv{{"DTRAIN_FUSION_THRESHOLD", "99999999999G"}}) ==
        "DTRAIN_FUSION_THRESHOLD=\"99999999999G\" is too large: expected bytes as a non-negative "
        "integer with an optional K, M or G suffix, e.g. 134217728 or 64M; 0 disables fusion");
  CHECK(error_of(MapEnv{{"DTRAIN_AUTOTUNE", "maybe"}}) ==
        "DTRAIN_AUTOTUNE=\"maybe\" is not a boolean: expected one of 1, 0, true, false, yes, no, "
        "on, off (any case)");
  CHECK(error_of(MapEnv{{"HOROVOD_LOG_LEVEL", "verbose"}}) ==
        "HOROVOD_LOG_LEVEL=\"verbose\" is not a log level: expected one of trace, debug, info, "
        "warning, error, fatal");
  CHECK(error_of(MapEnv{{"DTRAIN_NUM_NCCL_STREAMS", "65"}}) ==
        "DTRAIN_NUM_NCCL_STREAMS=\"65\" is too large (the limit is 64): expected an integer from "
        "1 to 64");
  CHECK(error_of(MapEnv{{"DTRAIN_OP_TIMEOUT_SECONDS", "inf"}}) ==
        "DTRAIN_OP_TIMEOUT_SECONDS=\"inf\" is not a number: expected seconds as a decimal, 0 for "
        "no deadline or at least 1, e.g. 600");
  // Absurdly short deadlines and stall checks are refused rather than failing every op or
  // flooding the log.
  CHECK(error_of(MapEnv{{"DTRAIN_OP_TIMEOUT_SECONDS", "1e-9"}}) ==
        "DTRAIN_OP_TIMEOUT_SECONDS=\"1e-9\" is out of range: expected seconds as a decimal, 0 for "
        "no deadline or at least 1, e.g. 600");
  CHECK(contains(error_of(MapEnv{{"DTRAIN_STALL_CHECK_TIME_SECONDS", "1e-6"}}),
                 "DTRAIN_STALL_CHECK_TIME_SECONDS=\"1e-6\" is out of range: expected seconds as a "
                 "decimal of at least 1"));
  // Heartbeats go out once a second: a shorter peer timeout would lose peers to one late beat.
  CHECK(error_of(MapEnv{{"DTRAIN_PEER_TIMEOUT_SECONDS", "1"}}) ==
        "DTRAIN_PEER_TIMEOUT_SECONDS=\"1\" is out of range: expected seconds as a decimal, 0 to "
        "never declare a silent peer lost, or at least 2, e.g. 60");
  CHECK(contains(error_of(MapEnv{{"DTRAIN_OP_TIMEOUT_SECONDS", "2e9"}}),
                 "is too large (the limit is 1000000000)"));
}

TEST_CASE("every bad setting is reported at once") {
  const std::string message = error_of(
      MapEnv{{"DTRAIN_CYCLE_TIME", "abc"}, {"HOROVOD_CACHE_CAPACITY", "-1"}, {"DTRAIN_AUTOTUNE", "x"}});
  CHECK(message.rfind("3 invalid dtrain settings:\n", 0) == 0);
  CHECK(contains(message, "\n  DTRAIN_CYCLE_TIME=\"abc\""));
  CHECK(contains(message, "\n  HOROVOD_CACHE_CAPACITY=\"-1\""));
  CHECK(contains(message, "\n  DTRAIN_AUTOTUNE=\"x\""));
}

TEST_CASE("size suffixes are binary") {
  CHECK(config_from_env(MapEnv{{"DTRAIN_FUSION_THRESHOLD", "2G"}}).fusion_threshold_bytes ==
        2LL << 30);
  CHECK(config_from_env(MapEnv{{"DTRAIN_FUSION_THRESHOLD", "512k"}}).fusion_threshold_bytes ==
        512LL << 10);
  CHECK(config_from_env(MapEnv{{"DTRAIN_TIMELINE_MAX_BYTES", "0"}}).timeline_max_bytes == 0);
  CHECK(config_from_env(MapEnv{{"DTRAIN_MPI_CHUNK_BYTES", "1G"}}).mpi_chunk_bytes == 1LL << 30);
  CHECK(config_from_env(MapEnv{{"HOROVOD_CACHE_CAPACITY", "1K"}}).cache_capacity == 1024);
}

TEST_CASE("stall shutdown must not come before the stall check") {
  CHECK(contains(error_of(MapEnv{{"DTRAIN_STALL_SHUTDOWN_TIME_SECONDS", "30"}}),
                 "DTRAIN_STALL_SHUTDOWN_TIME_SECONDS=\"30\" is shorter than the default stall "
                 "check time (60 seconds)"));
  CHECK(contains(error_of(MapEnv{{"DTRAIN_STALL_SHUTDOWN_TIME_SECONDS", "30"},
                                 {"HOROVOD_STALL_CHECK_TIME_SECONDS", "45"}}),
                 "DTRAIN_STALL_SHUTDOWN_TIME_SECONDS=\"30\" is shorter than "
                 "HOROVOD_STALL_CHECK_TIME_SECONDS=\"45\""));
  const Config ok = config_from_env(
      MapEnv{{"DTRAIN_STALL_SHUTDOWN_TIME_SECONDS", "30"}, {"DTRAIN_STALL_CHECK_TIME_SECONDS", "30"}});
  CHECK(ok.stall_shutdown_time_seconds == 30);
  CHECK(config_from_env(MapEnv{{"DTRAIN_STALL_CHECK_TIME_SECONDS", "600"}})
            .stall_shutdown_time_seconds == 0);  // 0 = never, whatever the check time
}

TEST_CASE("validate() names the field that was set in code") {
  const auto problem = [](const std::function<void(Config&)>& change) {
    Config c;
    change(c);
    try {
      c.validate();
    } catch (const InvalidArgumentError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK(problem([](Config& c) { c.cycle_time_ms = -1; }) ==
        "Config::cycle_time_ms = -1 is out of range: expected milliseconds as a non-negative "
        "decimal, e.g. 1 or 0.5");
  CHECK(contains(problem([](Config& c) { c.cycle_time_ms = std::nan(""); }),
                 "Config::cycle_time_ms = nan is not a finite number"));
  CHECK(contains(problem([](Config& c) {
                   c.op_timeout_seconds = std::numeric_limits<double>::infinity();
                 }),
                 "Config::op_timeout_seconds = inf is not a finite number"));
  CHECK(contains(problem([](Config& c) { c.fusion_threshold_bytes = -1; }),
                 "Config::fusion_threshold_bytes = -1 is out of range"));
  CHECK(contains(problem([](Config& c) { c.cache_capacity = -7; }),
                 "Config::cache_capacity = -7"));
  CHECK(contains(problem([](Config& c) { c.timeline_max_bytes = -1; }),
                 "Config::timeline_max_bytes = -1"));
  CHECK(contains(problem([](Config& c) { c.autotune_warmup_samples = -1; }),
                 "Config::autotune_warmup_samples = -1"));
  CHECK(contains(problem([](Config& c) { c.autotune_steps_per_sample = 0; }),
                 "Config::autotune_steps_per_sample = 0"));
  CHECK(contains(problem([](Config& c) { c.autotune_bayes_opt_max_samples = 0; }),
                 "Config::autotune_bayes_opt_max_samples = 0"));
  CHECK(contains(problem([](Config& c) { c.autotune_gaussian_process_noise = -0.5; }),
                 "Config::autotune_gaussian_process_noise = -0.5"));
  CHECK(contains(problem([](Config& c) { c.stall_check_time_seconds = 0; }),
                 "Config::stall_check_time_seconds = 0 is out of range: expected seconds as a "
                 "decimal of at least 1"));
  CHECK(contains(problem([](Config& c) { c.op_timeout_seconds = 0.5; }),
                 "Config::op_timeout_seconds = 0.5 is out of range"));
  CHECK(contains(problem([](Config& c) { c.stall_shutdown_time_seconds = -1; }),
                 "Config::stall_shutdown_time_seconds = -1"));
  CHECK(contains(problem([](Config& c) { c.stall_shutdown_time_seconds = 10; }),
                 "Config::stall_shutdown_time_seconds = 10 is shorter than "
                 "Config::stall_check_time_seconds = 60"));
  CHECK(contains(problem([](Config& c) { c.num_nccl_streams = 0; }),
                 "Config::num_nccl_streams = 0 is out of range: expected an integer from 1 to 64"));
  CHECK(contains(problem([](Config& c) { c.num_nccl_streams = 65; }),
                 "Config::num_nccl_streams = 65 is too large"));
  CHECK(contains(problem([](Config& c) { c.profile_interval_ms = 0; }),
                 "Config::profile_interval_ms = 0"));
  CHECK(contains(problem([](Config& c) { c.op_timeout_seconds = -1; }),
                 "Config::op_timeout_seconds = -1"));
  CHECK(contains(problem([](Config& c) { c.mpi_chunk_bytes = 100; }),
                 "Config::mpi_chunk_bytes = 100 is out of range: expected bytes from 4096"));
  CHECK(contains(problem([](Config& c) { c.log_level = static_cast<LogLevel>(42); }),
                 "Config::log_level = LogLevel(42) is not a log level"));
  const std::string two = problem([](Config& c) {
    c.cycle_time_ms = -1;
    c.num_nccl_streams = 0;
  });
  CHECK(two.rfind("2 invalid dtrain settings:", 0) == 0);

  CHECK(problem([](Config& c) {
          c.cycle_time_ms = 0;
          c.fusion_threshold_bytes = 0;
          c.stall_shutdown_time_seconds = 60;
          c.op_timeout_seconds = 0;
          c.mpi_chunk_bytes = 4096;
          c.num_nccl_streams = 64;
          c.log_level = LogLevel::fatal;
        }) == "");
}

TEST_CASE("a misspelled DTRAIN_ variable gets a warning suggesting the real name") {
  LogCapture capture(LogLevel::warning);
  (void)config_from_env(MapEnv{{"DTRAIN_FUSION_TRESHOLD", "1"}});
  CHECK(capture.count({"] warning: DTRAIN_FUSION_TRESHOLD is not a dtrain setting and is "
                       "ignored; did you mean DTRAIN_FUSION_THRESHOLD?"}) == 1);

  (void)config_from_env(MapEnv{{"DTRAIN_CYCEL_TIME", "1"}, {"DTRAIN_cache_capacity", "5"}});
  CHECK(capture.count({"DTRAIN_CYCEL_TIME", "did you mean DTRAIN_CYCLE_TIME?"}) == 1);
  CHECK(capture.count({"DTRAIN_cache_capacity", "did you mean DTRAIN_CACHE_CAPACITY?"}) == 1);

  (void)config_from_env(MapEnv{{"DTRAIN_QQQQQQQQQQQQ", "1"}});
  CHECK(capture.count({"DTRAIN_QQQQQQQQQQQQ is not a dtrain setting"}) == 1);
  CHECK(capture.count({"DTRAIN_QQQQQQQQQQQQ", "did you mean"}) == 0);
}

TEST_CASE("no warning for settings in either spelling, other dtrain variables or dtrainrun's") {
  LogCapture capture(LogLevel::warning);
  MapEnv env;
  for (const KnobCase& k : knob_cases()) {
    env.set("DTRAIN_" + k.suffix, k.good);
    env.set("HOROVOD_" + k.suffix, k.good);  // the same value: nothing to report
  }
  env.set("DTRAIN_HOSTS", "a,b");
  env.set("DTRAIN_CURRENT_HOST", "a");
  env.set("DTRAIN_ELASTIC", "1");  // dtrainrun's elastic mode (docs/elastic.md)
  env.set("DTRAIN_ELASTIC_NOTIFY", "127.0.0.1:5000");
  env.set("DTRAIN_ELASTIC_GENERATION", "2");
  // dtrainrun's messages to its ranks (tools/dtrain_launcher), not settings.
  env.set("DTRAINRUN_RESTART_COUNT", "0");
  env.set("DTRAINRUN_ATTEMPT", "1");
  env.set("DTRAINRUN_JOB_ID", "20250106-093012-4711-9f3c01ab");
  env.set("OTHER_DTRAIN_CYCLE_TIME", "5");
  env.set("OTHER_HOROVOD_GPU_OPERATIONS", "NCCL");
  (void)config_from_env(env);
  CHECK(capture.lines().empty());
}

TEST_CASE("a Horovod knob that dtrain does not map is named with what dtrain does instead") {
  LogCapture capture(LogLevel::warning);
  const Config c = config_from_env(MapEnv{{"HOROVOD_GPU_OPERATIONS", "NCCL"},
                                          {"HOROVOD_CCL_CACHE", "1"},
                                          {"HOROVOD_CONTROLLER", "gloo"},
                                          {"HOROVOD_MPI_THREADS_DISABLE", "1"},
                                          {"HOROVOD_ENABLE_XLA_OPS", "1"}});
  CHECK(c.fusion_threshold_bytes == Config{}.fusion_threshold_bytes);
  CHECK(capture.count({"] warning: HOROVOD_GPU_OPERATIONS is a Horovod setting that dtrain does "
                       "not use and is ignored: ",
                       "NCCL", "docs/device.md"}) == 1);
  CHECK(capture.count({"HOROVOD_CCL_CACHE is a Horovod setting that dtrain does not use",
                       "oneCCL"}) == 1);
  CHECK(capture.count({"HOROVOD_CONTROLLER is a Horovod setting that dtrain does not use",
                       "MPI is dtrain's only controller"}) == 1);
  CHECK(capture.count({"HOROVOD_MPI_THREADS_DISABLE is a Horovod setting that dtrain does not "
                       "use", "MPI_THREAD_MULTIPLE"}) == 1);
  CHECK(capture.count({"HOROVOD_ENABLE_XLA_OPS is a Horovod setting that dtrain does not use",
                       "XLA"}) == 1);
  CHECK(capture.lines().size() == 5);
}

TEST_CASE("DTRAIN_CPU_OPERATIONS takes auto, mpi or gloo, also under Horovod's name") {
  CHECK(config_from_env(MapEnv{}).cpu_operations == "auto");
  CHECK(config_from_env(MapEnv{{"DTRAIN_CPU_OPERATIONS", "mpi"}}).cpu_operations == "mpi");
  CHECK(config_from_env(MapEnv{{"HOROVOD_CPU_OPERATIONS", "gloo"}}).cpu_operations == "gloo");
  CHECK(config_from_env(MapEnv{{"DTRAIN_GLOO_IFACE", "eth1"}}).gloo_iface == "eth1");
  CHECK_THROWS_WITH_AS(config_from_env(MapEnv{{"DTRAIN_CPU_OPERATIONS", "ccl"}}),
                       doctest::Contains("DTRAIN_CPU_OPERATIONS=\"ccl\" is not one of the "
                                         "choices: expected auto, mpi or gloo"),
                       InvalidArgumentError);
  Config c;
  c.cpu_operations = "GLOO";
  CHECK_THROWS_WITH_AS(c.validate(),
                       doctest::Contains("Config::cpu_operations = \"GLOO\" is not one of the "
                                         "choices: expected auto, mpi or gloo"),
                       InvalidArgumentError);
}

TEST_CASE("every entry of the table of Horovod's unmapped knobs is warned about, once") {
  using dtrain::detail::horovod_unmapped_knobs;
  std::set<std::string> aliases;
  for (const KnobCase& k : knob_cases()) aliases.insert("HOROVOD_" + k.suffix);
  std::string previous;
  for (const auto& knob : horovod_unmapped_knobs) {
    const std::string name(knob.name);
    CAPTURE(name);
    CHECK(name.rfind("HOROVOD_", 0) == 0);
    CHECK(previous < name);  // sorted, so no name appears twice
    CHECK(aliases.count(name) == 0);  // a Horovod spelling dtrain reads is never "ignored"
    CHECK(!knob.instead.empty());
    CHECK(knob.instead.back() != '.');
    previous = name;
    // The warnings themselves: log_once would hide those other cases have printed.
    CHECK(env_warnings(MapEnv{{name, "1"}}) ==
          std::vector<std::string>{name + " is a Horovod setting that dtrain does not use and is "
                                          "ignored: " + std::string(knob.instead)});
  }
}

TEST_CASE("a misspelt HOROVOD_ variable gets a warning naming the nearest known name") {
  LogCapture capture(LogLevel::warning);
  (void)config_from_env(MapEnv{{"HOROVOD_FUSION_TRESHOLD", "64M"}});
  CHECK(capture.count({"] warning: HOROVOD_FUSION_TRESHOLD is not a dtrain setting and is "
                       "ignored; did you mean HOROVOD_FUSION_THRESHOLD?"}) == 1);

  // The nearest name may be one of Horovod's knobs that dtrain ignores: say so.
  (void)config_from_env(MapEnv{{"HOROVOD_GPU_OPERATION", "NCCL"}});
  CHECK(capture.count({"HOROVOD_GPU_OPERATION is not a dtrain setting and is ignored; did you "
                       "mean HOROVOD_GPU_OPERATIONS? dtrain would ignore that Horovod setting "
                       "too: "}) == 1);

  (void)config_from_env(MapEnv{{"HOROVOD_QQQQQQQQQQQQ", "1"}});
  CHECK(capture.count({"HOROVOD_QQQQQQQQQQQQ is not a dtrain setting and is ignored",
                       "docs/horovod.md"}) == 1);
  CHECK(capture.count({"HOROVOD_QQQQQQQQQQQQ", "did you mean"}) == 0);

  // A Horovod spelling of a dtrain-only setting is read like any other.
  LogCapture quiet(LogLevel::warning);
  CHECK(config_from_env(MapEnv{{"HOROVOD_OP_TIMEOUT_SECONDS", "30"}}).op_timeout_seconds == 30);
  CHECK(quiet.lines().empty());
}

TEST_CASE("docs/horovod.md lists every Horovod knob that dtrain ignores") {
  std::ifstream in(DTRAIN_TEST_DOCS_DIR "/horovod.md");
  REQUIRE_MESSAGE(in.good(), "cannot read " DTRAIN_TEST_DOCS_DIR "/horovod.md");
  const std::string doc((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (const auto& knob : dtrain::detail::horovod_unmapped_knobs) {
    CAPTURE(knob.name);
    CHECK(doc.find("`" + std::string(knob.name) + "`") != std::string::npos);
  }
}

TEST_CASE("each distinct warning appears once per process") {
  LogCapture capture(LogLevel::warning);
  const MapEnv env{{"DTRAIN_STALL_CHECK_TIME_SECOND", "1"}, {"HOROVOD_THREAD_AFFINITY", "0,1"}};
  (void)config_from_env(env);
  (void)config_from_env(env);
  CHECK(capture.count({"DTRAIN_STALL_CHECK_TIME_SECOND is not a dtrain setting"}) == 1);
  CHECK(capture.count({"HOROVOD_THREAD_AFFINITY is a Horovod setting"}) == 1);
}

TEST_CASE("DTRAIN_LOG_LEVEL in the same environment silences the warnings") {
  LogCapture capture(LogLevel::warning);
  (void)config_from_env(MapEnv{{"DTRAIN_LOG_LEVEL", "error"}, {"DTRAIN_TIMELINE_MARK_CYCLE", "1"}});
  CHECK(capture.lines().empty());
}

TEST_CASE("a HOROVOD_ value overridden by a different DTRAIN_ value is warned about") {
  LogCapture capture(LogLevel::warning);
  const Config c = config_from_env(
      MapEnv{{"DTRAIN_CYCLE_TIME", "2.25"}, {"HOROVOD_CYCLE_TIME", "3.75"}});
  CHECK(c.cycle_time_ms == 2.25);
  CHECK(capture.count({"DTRAIN_CYCLE_TIME=\"2.25\"", "HOROVOD_CYCLE_TIME=\"3.75\"",
                       "using DTRAIN_CYCLE_TIME"}) == 1);
  // Same values: nothing to warn about.
  (void)config_from_env(MapEnv{{"DTRAIN_CACHE_CAPACITY", "77"}, {"HOROVOD_CACHE_CAPACITY", "77"}});
  CHECK(capture.count({"CACHE_CAPACITY"}) == 0);
  CHECK(capture.lines().size() == 1);
}

TEST_CASE("Config::from_env reads the real process environment") {
  REQUIRE(::setenv("DTRAIN_CYCLE_TIME", "2.5", 1) == 0);
  REQUIRE(::setenv("HOROVOD_FUSION_THRESHOLD", "32M", 1) == 0);
  Config c;
  CHECK_NOTHROW(c = Config::from_env());
  CHECK(c.cycle_time_ms == 2.5);
  CHECK(c.fusion_threshold_bytes == 32 << 20);
  REQUIRE(::setenv("DTRAIN_CYCLE_TIME", "fast", 1) == 0);
  CHECK_THROWS_WITH_AS(Config::from_env(),
                       "DTRAIN_CYCLE_TIME=\"fast\" is not a number: expected milliseconds as a "
                       "non-negative decimal, e.g. 1 or 0.5",
                       InvalidArgumentError);
  ::unsetenv("DTRAIN_CYCLE_TIME");
  ::unsetenv("HOROVOD_FUSION_THRESHOLD");
}
