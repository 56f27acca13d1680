// The profiler's pure parts: phase accounting on synthetic times, the JSON Lines records, the
// /proc parsers on fixed text, rates between two readings, options and their errors, and NVML
// when it is absent. Nothing here starts MPI.
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <string>

#include "dtrain/runtime/engine_stats.hpp"
#include "dtrain/profile/nvml.hpp"
#include "dtrain/profile/options.hpp"
#include "dtrain/profile/phase_times.hpp"
#include "dtrain/profile/proc_stats.hpp"
#include "dtrain/profile/records.hpp"
#include "dtrain/profile/system_sampler.hpp"

namespace {

using namespace std::chrono_literals;
using dtrain::Phase;
using dtrain::detail::PhaseTimes;
using nlohmann::json;

PhaseTimes::Clock::time_point at(std::chrono::milliseconds ms) {
  return PhaseTimes::Clock::time_point(ms);
}

std::chrono::nanoseconds phase_time(const PhaseTimes::Step& s, std::string_view name) {
  for (const auto& [n, d] : s.phases)
    if (n == name) return d;
  return std::chrono::nanoseconds(-1);  // did not run
}

json parse_line(const std::string& line) {
  REQUIRE(!line.empty());
  CHECK(line.back() == '\n');
  CHECK(line.find('\n') == line.size() - 1);  // exactly one line
  json j = json::parse(line.substr(0, line.size() - 1));
  REQUIRE(j.is_object());
  return j;
}

}  // namespace

TEST_CASE("phases are charged their exclusive time and add up to the step") {
  PhaseTimes t;
  const std::size_t data = PhaseTimes::slot_of(Phase::data);
  const std::size_t backward = PhaseTimes::slot_of(Phase::backward);
  const std::size_t augment = t.slot_of("augment");
  const std::size_t hook = t.slot_of("hook");
  t.begin_step(at(0ms));
  t.enter(data, at(1ms));      // data 1..11, with augment 3..7 inside it
  t.enter(augment, at(3ms));
  t.exit(at(7ms));
  t.exit(at(11ms));
  t.enter(backward, at(12ms));  // backward 12..30, with hook 20..25 inside it
  t.enter(hook, at(20ms));
  t.exit(at(25ms));
  t.exit(at(30ms));
  const PhaseTimes::Step s = t.end_step(at(32ms));
  CHECK(s.total == 32ms);
  CHECK(phase_time(s, "data") == 6ms);
  CHECK(phase_time(s, "augment") == 4ms);
  CHECK(phase_time(s, "backward") == 13ms);
  CHECK(phase_time(s, "hook") == 5ms);
  CHECK(phase_time(s, "forward") == -1ns);  // did not run: not reported
  CHECK(s.other == 4ms);                    // 0..1, 11..12, 30..32
  std::chrono::nanoseconds sum = s.other;
  for (const auto& [name, d] : s.phases) sum += d;
  CHECK(sum == s.total);
  CHECK(!t.in_step());
}

TEST_CASE("a user phase named like a standard one is that phase; a phase may take no time") {
  PhaseTimes t;
  CHECK(t.slot_of("data") == PhaseTimes::slot_of(Phase::data));
  CHECK(t.slot_of("communication_wait") == PhaseTimes::slot_of(Phase::communication_wait));
  t.begin_step(at(0ms));
  t.enter(PhaseTimes::slot_of(Phase::optimizer), at(5ms));
  t.exit(at(5ms));
  const auto s = t.end_step(at(10ms));
  REQUIRE(s.phases.size() == 1);
  CHECK(s.phases[0].first == "optimizer");
  CHECK(s.phases[0].second == 0ms);
  CHECK(s.other == 10ms);
}

TEST_CASE("a phase open across the end of a step is split between the steps") {
  PhaseTimes t;
  const std::size_t comm = PhaseTimes::slot_of(Phase::communication_wait);
  const std::size_t inner = t.slot_of("inner");
  t.begin_step(at(0ms));
  t.enter(comm, at(2ms));
  t.enter(inner, at(6ms));
  const auto first = t.end_step(at(10ms));  // comm 2..6 exclusive, inner 6..10
  CHECK(phase_time(first, "communication_wait") == 4ms);
  CHECK(phase_time(first, "inner") == 4ms);
  CHECK(first.other == 2ms);
  t.begin_step(at(10ms));
  t.exit(at(13ms));  // inner ends
  t.exit(at(15ms));  // comm ends
  const auto second = t.end_step(at(20ms));
  CHECK(phase_time(second, "inner") == 3ms);
  CHECK(phase_time(second, "communication_wait") == 2ms);
  CHECK(second.other == 5ms);
}

TEST_CASE("JSON lines escape what JSON requires and write no NaN") {
  dtrain::detail::JsonObject line;
  line.field("s", std::string_view("quote\" back\\ nl\n tab\t bell\x07 é"));
  line.field("nan", std::nan("")).field("inf", HUGE_VAL).field("n", -3).field("b", true);
  line.field("x", 0.25);
  const json j = json::parse(line.closed());
  CHECK(j.at("s") == "quote\" back\\ nl\n tab\t bell\x07 é");
  CHECK(j.at("nan").is_null());
  CHECK(j.at("inf").is_null());
  CHECK(j.at("n") == -3);
  CHECK(j.at("b") == true);
  CHECK(j.at("x") == 0.25);
}

TEST_CASE("step records carry the phases, other, samples and the engine's increase") {
  dtrain::detail::StepRecord r;
  r.step = 41;
  r.t = 12.3456789;
  r.duration = 25ms;
  r.other = 500us;
  r.phases = {{"data", 2ms}, {"forward", 10ms}, {"my \"phase\"", 12500us}};
  r.samples = 64;
  dtrain::EngineStats later, earlier;
  later.collectives = 10;
  earlier.collectives = 7;
  later.bytes_reduced = 4096;
  earlier.bytes_reduced = 1024;
  later.cache_hits = 2;  // below `earlier`: the engine restarted, so it counts from zero
  earlier.cache_hits = 5;
  r.engine = dtrain::detail::engine_stats_delta(later, earlier);
  const json j = parse_line(dtrain::detail::to_json_line(dtrain::detail::ProfileRecord(r)));
  CHECK(j.at("type") == "step");
  CHECK(j.at("step") == 41);
  CHECK(j.at("t").get<double>() == doctest::Approx(12.345679).epsilon(1e-12));
  CHECK(j.at("duration_ms") == 25);
  CHECK(j.at("other_ms") == 0.5);
  CHECK(j.at("samples") == 64);
  REQUIRE(j.contains("phases_ms"));
  const json* phases = &j.at("phases_ms");
  CHECK(phases->at("data") == 2);
  CHECK(phases->at("forward") == 10);
  CHECK(phases->at("my \"phase\"") == 12.5);
  REQUIRE(j.contains("engine"));
  const json* engine = &j.at("engine");
  CHECK(engine->at("collectives") == 3);
  CHECK(engine->at("bytes_reduced") == 3072);
  CHECK(engine->at("cache_hits") == 2);
  CHECK(!engine->contains("fused_collectives"));  // did not move: left out
}

TEST_CASE("the header names the run, the rank, the GPU or why there is none, and the counters") {
  dtrain::detail::HeaderRecord h;
  h.run_id = "abc-12";
  h.rank = 3;
  h.size = 4;
  h.host = "node\"7";
  h.gpu_available = false;
  h.gpu_reason = "NVML not loaded";
  const json j = parse_line(dtrain::detail::to_json_line(h));
  CHECK(j.at("type") == "header");
  CHECK(j.at("format") == "dtrain-profile");
  CHECK(j.at("version") == dtrain::detail::profile_format_version);
  CHECK(j.at("run_id") == "abc-12");
  CHECK(j.at("rank") == 3);
  CHECK(j.at("size") == 4);
  CHECK(j.at("host") == "node\"7");
  REQUIRE(j.contains("gpu"));
  const json* gpu = &j.at("gpu");
  CHECK(gpu->at("available") == false);
  CHECK(gpu->at("reason") == "NVML not loaded");
  REQUIRE(j.contains("engine_counters"));
  const json* counters = &j.at("engine_counters");
  REQUIRE(counters->is_array());
  std::size_t n = 0;
  dtrain::detail::for_each_engine_counter([&](std::string_view name, dtrain::detail::Counter, auto) {
    REQUIRE(n < counters->size());
    CHECK(counters->at(n++) == name);
  });
  CHECK(n == counters->size());
}

TEST_CASE("samples leave out what could not be read") {
  dtrain::detail::SampleRecord s;
  s.t = 1.5;
  s.process_cpu_pct = 150.123456;
  s.rss_bytes = 1u << 30;
  const json j = parse_line(dtrain::detail::to_json_line(s));
  CHECK(j.at("type") == "sample");
  CHECK(j.at("process_cpu_pct") == 150.12);
  CHECK(j.at("rss_bytes") == 1073741824.0);
  CHECK(!j.contains("system_cpu_pct"));
  CHECK(!j.contains("gpu"));
  s.gpu = dtrain::detail::GpuReading{87.5, 40, 1000, 4000};
  const json g = parse_line(dtrain::detail::to_json_line(s));
  REQUIRE(g.contains("gpu"));
  CHECK(g.at("gpu").at("utilization_pct") == 87.5);
  CHECK(g.at("gpu").at("memory_total_bytes") == 4000);
}

TEST_CASE("/proc parsers read the fields proc(5) documents") {
  using namespace dtrain::detail;
  // A command name with a space and a parenthesis; utime 1500, stime 250, 7 threads.
  const auto stat = parse_process_stat(
      "4242 (my (odd) prog) R 1 4242 4242 0 -1 4194304 1000 0 0 0 1500 250 0 0 20 0 7 0 "
      "123456 1000000 2000 18446744073709551615");
  REQUIRE(stat);
  CHECK(stat->user_ticks == 1500);
  CHECK(stat->system_ticks == 250);
  CHECK(stat->threads == 7);
  CHECK(!parse_process_stat("garbage"));

  const auto cpu = parse_system_stat(
      "cpu  100 10 50 800 20 5 5 10 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\nctxt 99\nprocs_running 3\n");
  REQUIRE(cpu);
  CHECK(cpu->busy_ticks == 100 + 10 + 50 + 5 + 5 + 10);
  CHECK(cpu->total_ticks == cpu->busy_ticks + 800 + 20);
  CHECK(cpu->procs_running == 3);

  const auto status = parse_process_status(
      "Name:\tprog\nVmRSS:\t  2048 kB\nThreads:\t5\nvoluntary_ctxt_switches:\t10\n"
      "nonvoluntary_ctxt_switches:\t4\n");
  REQUIRE(status);
  CHECK(status->rss_bytes == 2048 * 1024);
  CHECK(status->voluntary_switches == 10);
  CHECK(status->involuntary_switches == 4);

  const auto net = parse_net_dev(
      "Inter-|   Receive                                                |  Transmit\n"
      " face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets\n"
      "    lo: 5000 10 0 0 0 0 0 0 5000 10 0 0 0 0 0 0\n"
      "  eth0: 1000 5 0 0 0 0 0 0 300 3 0 0 0 0 0 0\n"
      "  ib0: 20000 5 0 0 0 0 0 0 7000 3 0 0 0 0 0 0\n");
  REQUIRE(net);
  CHECK(net->read == 21000);   // loopback left out
  CHECK(net->write == 7300);

  const auto io = parse_process_io("rchar: 1\nwchar: 2\nread_bytes: 4096\nwrite_bytes: 8192\n");
  REQUIRE(io);
  CHECK(io->read == 4096);
  CHECK(io->write == 8192);

  const auto disk = parse_diskstats(
      "   8       0 sda 100 0 2000 50 40 0 800 30 0 60 80\n"
      "   8       1 sda1 90 0 1800 40 30 0 600 20 0 50 60\n"
      "   7       0 loop0 5 0 10 1 0 0 0 0 0 1 1\n",
      [](const std::string& name) { return name == "sda"; });
  REQUIRE(disk);
  CHECK(disk->read == 2000 * 512);
  CHECK(disk->write == 800 * 512);
}

TEST_CASE("the real /proc of this process reads") {
  const auto s = dtrain::detail::read_proc_snapshot();
  REQUIRE(s.process);
  CHECK(s.process->threads >= 1);
  REQUIRE(s.status);
  CHECK(s.status->rss_bytes > 0);
  REQUIRE(s.system);
  CHECK(s.system->total_ticks > 0);
}

TEST_CASE("a sample is the rates between two readings") {
  using namespace dtrain::detail;
  ProcSnapshot a, b;
  a.process = ProcessStat{100, 50, 4};
  b.process = ProcessStat{250, 100, 5};  // 200 ticks in 2 s at 100 ticks/s: one core busy
  a.system = SystemCpu{1000, 4000, 1};
  b.system = SystemCpu{1300, 4400, 6};   // 300 of 400 ticks busy
  a.status = ProcessStatus{1 << 20, 0, 10};
  b.status = ProcessStatus{2 << 20, 0, 50};
  a.network = ByteCounters{1000, 500};
  b.network = ByteCounters{5000, 300};  // tx went backwards (interface reset): no rate
  a.disk = ByteCounters{0, 0};
  b.disk = ByteCounters{1 << 20, 2 << 20};
  const SampleRecord s = make_sample(a, b, 2.0, 100);
  CHECK(*s.process_cpu_pct == doctest::Approx(100));
  CHECK(*s.threads == 5);
  CHECK(*s.system_cpu_pct == doctest::Approx(75));
  CHECK(*s.procs_running == 6);
  CHECK(*s.rss_bytes == (2u << 20));
  CHECK(*s.involuntary_switches_per_s == doctest::Approx(20));
  CHECK(*s.net_rx_bytes_per_s == doctest::Approx(2000));
  CHECK(!s.net_tx_bytes_per_s);
  CHECK(*s.disk_read_bytes_per_s == doctest::Approx(512 * 1024));
  CHECK(*s.disk_write_bytes_per_s == doctest::Approx(1024 * 1024));
  CHECK(!s.process_read_bytes_per_s);  // not read at all
}

TEST_CASE("the sampling interval must be 100 ms to 60 s, with errors that name the setting") {
  dtrain::ProfilerOptions o;
  o.dir = "somewhere";
  o.sample_interval = std::chrono::milliseconds(99);
  CHECK_THROWS_WITH_AS(o.validate(),
                       doctest::Contains("ProfilerOptions::sample_interval (milliseconds) = 99 "
                                         "is out of range"),
                       dtrain::InvalidArgumentError);
  o.sample_interval = std::chrono::milliseconds(60001);
  CHECK_THROWS_AS(o.validate(), dtrain::InvalidArgumentError);
  o.sample_interval = std::chrono::milliseconds(100);
  CHECK_NOTHROW(o.validate());
  o.sample_interval = std::chrono::milliseconds(60000);
  CHECK_NOTHROW(o.validate());
  o.gpu_index = -2;
  CHECK_THROWS_WITH_AS(o.validate(), doctest::Contains("gpu_index = -2"),
                       dtrain::InvalidArgumentError);

  dtrain::Config c;
  c.profile_dir = "prof";
  c.profile_interval_ms = 250.4;
  const auto from = dtrain::profiler_options_from(c);
  CHECK(from.dir == "prof");
  CHECK(from.sample_interval == std::chrono::milliseconds(250));
  c.profile_interval_ms = 5;
  CHECK_THROWS_WITH_AS(dtrain::profiler_options_from(c),
                       doctest::Contains("dtrain: DTRAIN_PROFILE_INTERVAL_MS"),
                       dtrain::InvalidArgumentError);
}

TEST_CASE("without the NVML library the GPU is unavailable, with the reason, not an error") {
  const auto nvml = dtrain::detail::Nvml::open("libnvidia-ml-does-not-exist.so.1", -1, 0);
  CHECK(!nvml.available());
  CHECK(nvml.reason().find("libnvidia-ml-does-not-exist.so.1") != std::string::npos);
  CHECK(!nvml.read());
  // A library that exists but is not NVML.
  const auto not_nvml = dtrain::detail::Nvml::open("libc.so.6", -1, 0);
  CHECK(!not_nvml.available());
  CHECK(not_nvml.reason().find("lacks nvmlInit_v2") != std::string::npos);
}
