// What dtrain::Profiler costs the training thread, off and on (Note [Profiler cost]).
//
//   phase scope     opening and closing one phase scope inside a step
//   step            one step scope around 5 phase scopes (the standard phases), with dtrain
//                   initialized, so a recording step also takes its two engine_stats() snapshots
//                   and queues its record for the writer thread
//   system sample   one reading of /proc (the sampler thread's work each period), in CPU time
// Each is timed in CPU time of the training thread over --iterations repetitions, per round, off
// and on interleaved; the table shows the median and minimum over --rounds rounds of the
// per-repetition time, minus an empty loop of the same shape. "On" writes to a temporary folder with the sampler at its shortest period
// (100 ms), its busiest setting.
//
// Usage: mpiexec -n 1 bench_profiler_overhead [--rounds=7] [--iterations=200000]
#include <time.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include <dtrain/dtrain.hpp>
#include <dtrain/profile/proc_stats.hpp>

#include "bench_common.hpp"

namespace {

// Keeps the compiler from removing or merging the loop bodies.
inline void clobber() { asm volatile("" ::: "memory"); }

// CPU time of the calling thread: on a shared machine, wall time would also count the time this
// thread waited for a core.
double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

double per_iteration(long n, auto&& body) {
  const double t0 = thread_cpu_seconds();
  for (long i = 0; i < n; ++i) {
    body();
    clobber();
  }
  return (thread_cpu_seconds() - t0) / static_cast<double>(n);
}

}  // namespace

int main(int argc, char** argv) {
  bench::MpiProcess mpi(argc, argv);
  const bench::Args args(argc, argv);
  const int rounds = static_cast<int>(args.get_int("rounds", 7));
  const long iterations = args.get_int("iterations", 200000);
  dtrain::init(dtrain::Config::from_env());

  const auto dir = std::filesystem::temp_directory_path() /
                   ("dtrain_bench_profiler_" + std::to_string(::getpid()));
  dtrain::ProfilerOptions on_options;
  on_options.dir = dir.string();
  on_options.sample_interval = dtrain::min_profile_interval;
  dtrain::Profiler off{dtrain::ProfilerOptions{}};
  dtrain::Profiler on(on_options);

  bench::Samples samples;
  for (int round = 0; round < rounds; ++round) {
    const double empty = per_iteration(iterations, [] {});
    for (dtrain::Profiler* p : {&off, &on}) {
      const std::string mode = p->enabled() ? "on" : "off";
      {
        auto step = p->step();
        samples.add("phase scope, " + mode, per_iteration(iterations, [&] {
                      auto s = p->phase(dtrain::Phase::forward);
                      clobber();
                    }) - empty);
      }
      samples.add("step with 5 phases, " + mode, per_iteration(iterations / 10, [&] {
                    auto step = p->step(32);
                    for (dtrain::Phase phase : dtrain::standard_phases) {
                      auto s = p->phase(phase);
                      clobber();
                    }
                  }) - empty);
    }
    const int reads = 200;
    const double cpu0 = thread_cpu_seconds();
    long read_ok = 0;
    for (int i = 0; i < reads; ++i) read_ok += dtrain::detail::read_proc_snapshot().process ? 1 : 0;
    if (read_ok != reads) fmt::print(stderr, "/proc/self/stat could not be read\n");
    samples.add("system sample (sampler thread, CPU time)", (thread_cpu_seconds() - cpu0) / reads);
  }
  const auto steps = on.steps();
  on = dtrain::Profiler{dtrain::ProfilerOptions{}};  // closes the file: the writer drains
  const auto bytes = std::filesystem::file_size(dir / "rank-0.jsonl");
  std::filesystem::remove_all(dir);

  fmt::print("# profiler cost, CPU time of the training thread, {} rounds of {} repetitions "
             "(median / min)\n",
             rounds, iterations);
  fmt::print("# {}\n", bench::machine_line(mpi.size()));
  fmt::print("| what | median | min |\n|---|---|---|\n");
  for (const auto& name : samples.names()) {
    const auto s = samples.get(name);
    if (s.median >= 1e-6)
      fmt::print("| {} | {:.1f} us | {:.1f} us |\n", name, s.median * 1e6, s.min * 1e6);
    else
      fmt::print("| {} | {:.1f} ns | {:.1f} ns |\n", name, s.median * 1e9, s.min * 1e9);
  }
  fmt::print("\n{} steps recorded into {:.1f} MB: {:.0f} bytes per step\n", steps,
             static_cast<double>(bytes) / 1e6, static_cast<double>(bytes) / static_cast<double>(steps));
  dtrain::shutdown();
  return 0;
}
