// What profiling costs a training job (Note [Profiler cost], Note [Zero-code profiling]).
//
// First what dtrain::Profiler costs the training thread, off and on:
//   phase scope     opening and closing one phase scope inside a step
//   step            one step scope around 5 phase scopes (the standard phases), with dtrain
//                   initialized, so a recording step also takes its two engine_stats() snapshots
//                   and queues its record for the writer thread
//   system sample   one reading of /proc (the sampler thread's work each period), in CPU time
// Each is timed in CPU time of the training thread over --iterations repetitions, per round, off
// and on interleaved; the table shows the median and minimum over --rounds rounds of the
// per-repetition time, minus an empty loop of the same shape. "On" writes to a temporary folder
// with the sampler at its shortest period (100 ms), its busiest setting.
//
// Then what zero-code profiling costs a training loop: steps per second of a loop that only has
// a DistributedOptimizer (--work-us of computation, then step() on a --grad-kib gradient), with
// dtrain started without a profile, and with DTRAIN_PROFILE at the default 500 ms period and at
// the 100 ms minimum, in an order that rotates every round (--train-rounds) so that drift on a
// shared machine spreads over all three. A sample is --train-steps steps after 10 of warm-up,
// timed from a barrier to the slowest rank's end; dtrain starts and stops outside the timing.
// The ratios are per round, profiled over unprofiled. Beside them, CPU time per step, which a
// shared machine does not inflate as it does wall time: the training thread's (the hooks' cost
// is there: the step boundary, the timed waits) and its increase over the unprofiled loop of
// the same round, and the whole process's (engine, sampler and writer threads too).
//
// Usage: mpiexec -n 2 bench_profiler_overhead [--rounds=7] [--iterations=200000]
//            [--train-rounds=40] [--train-steps=100] [--grad-kib=256] [--work-us=1000]
// (--train-rounds=0: the calls' costs only.)
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include <dtrain/dtrain.hpp>
#include <dtrain/profile/proc_stats.hpp>  // the sampler's reading, timed on its own

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

// The training loop's model: one gradient, updated by plain SGD.
struct Sgd {
  std::vector<float> weights, grads;
  explicit Sgd(std::size_t n) : weights(n, 0.0f), grads(n, 0.0f) {}
  void step() {
    for (std::size_t i = 0; i < weights.size(); ++i) weights[i] -= 0.01f * grads[i];
  }
  std::vector<std::span<float>> gradients() { return {grads}; }
};

void busy_for(std::chrono::microseconds d) {
  const auto end = std::chrono::steady_clock::now() + d;
  while (std::chrono::steady_clock::now() < end) clobber();
}

struct TrainingLoop {
  long steps = 300;
  std::size_t grad_floats = 64 * 1024;
  std::chrono::microseconds work{1000};
};

struct LoopSample {
  double steps_per_second = 0;
  // CPU seconds per step, mean of ranks: the training thread's, and the whole process's (every
  // thread: training, engine, sampler, writer).
  double thread_cpu_per_step = 0;
  double process_cpu_per_step = 0;
};

// The loop with dtrain started under `config`.
LoopSample run_loop(const bench::MpiProcess& mpi, const dtrain::Config& config,
                    const TrainingLoop& loop) {
  dtrain::init(config);
  double seconds = 0, thread_cpu = 0, process_cpu = 0;
  {
    Sgd sgd(loop.grad_floats);
    dtrain::DistributedOptimizer<Sgd> optimizer(sgd);
    auto step = [&] {
      busy_for(loop.work);
      std::fill(sgd.grads.begin(), sgd.grads.end(), 1.0f);
      optimizer.step();
    };
    for (int i = 0; i < 10; ++i) step();
    mpi.barrier();
    const double process0 = bench::cpu_seconds_self(), thread0 = thread_cpu_seconds();
    const auto t0 = bench::Clock::now();
    for (long i = 0; i < loop.steps; ++i) step();
    const double own = bench::seconds_since(t0);
    thread_cpu = mpi.sum_over_ranks(thread_cpu_seconds() - thread0) / mpi.size();
    process_cpu = mpi.sum_over_ranks(bench::cpu_seconds_self() - process0) / mpi.size();
    seconds = mpi.max_over_ranks(own);
  }
  dtrain::shutdown();
  const double steps = static_cast<double>(loop.steps);
  return {steps / seconds, thread_cpu / steps, process_cpu / steps};
}

// The value below which a share `q` of the sorted values lies.
double quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  if (v.empty()) return 0;
  const double pos = q * static_cast<double>(v.size() - 1);
  const auto lo = static_cast<std::size_t>(pos);
  const std::size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (pos - static_cast<double>(lo)) * (v[hi] - v[lo]);
}

}  // namespace

int main(int argc, char** argv) {
  bench::MpiProcess mpi(argc, argv);
  const bench::Args args(argc, argv);
  const int rounds = static_cast<int>(args.get_int("rounds", 7));
  const long iterations = args.get_int("iterations", 200000);
  dtrain::Config unprofiled = dtrain::Config::from_env();
  unprofiled.profile_dir.clear();  // the Profilers below choose for themselves
  dtrain::init(unprofiled);

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
  const std::string file = on.path();
  on = dtrain::Profiler{dtrain::ProfilerOptions{}};  // closes the file: the writer drains
  const auto bytes = std::filesystem::file_size(file);
  std::filesystem::remove_all(dir);
  dtrain::shutdown();

  if (mpi.rank() == 0) {
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
               static_cast<double>(bytes) / 1e6,
               static_cast<double>(bytes) / static_cast<double>(steps));
  }

  // Zero-code profiling: the same training loop without a profile and under DTRAIN_PROFILE.
  TrainingLoop loop;
  loop.steps = args.get_int("train-steps", 100);
  loop.grad_floats = static_cast<std::size_t>(args.get_int("grad-kib", 256)) * 1024 / sizeof(float);
  loop.work = std::chrono::microseconds(args.get_int("work-us", 1000));
  const int train_rounds = static_cast<int>(args.get_int("train-rounds", 40));
  if (train_rounds <= 0) return 0;
  struct Mode {
    std::string name;
    double interval_ms;  // 0: no profile
  };
  const std::vector<Mode> modes = {{"unprofiled", 0},
                                   {"DTRAIN_PROFILE, 500 ms period (default)", 500},
                                   {"DTRAIN_PROFILE, 100 ms period", 100}};
  const auto train_dir = std::filesystem::temp_directory_path() /
                         ("dtrain_bench_zero_code_" + std::to_string(::getpid()));
  std::vector<std::vector<double>> rates(modes.size()), ratios(modes.size());
  std::vector<std::vector<double>> thread_cpus(modes.size()), process_cpus(modes.size());
  std::vector<std::vector<double>> extra_thread_cpu(modes.size());
  for (int round = 0; round < train_rounds; ++round) {
    std::vector<double> rate(modes.size()), thread_cpu(modes.size());
    for (std::size_t k = 0; k < modes.size(); ++k) {
      const std::size_t m = (k + static_cast<std::size_t>(round)) % modes.size();
      dtrain::Config config = dtrain::Config::from_env();
      config.profile_dir = modes[m].interval_ms > 0 ? train_dir.string() : std::string();
      if (modes[m].interval_ms > 0) config.profile_interval_ms = modes[m].interval_ms;
      const LoopSample sample = run_loop(mpi, config, loop);
      rate[m] = sample.steps_per_second;
      rates[m].push_back(rate[m]);
      thread_cpu[m] = sample.thread_cpu_per_step;
      thread_cpus[m].push_back(sample.thread_cpu_per_step);
      process_cpus[m].push_back(sample.process_cpu_per_step);
    }
    for (std::size_t m = 1; m < modes.size(); ++m) {
      ratios[m].push_back(rate[m] / rate[0]);
      extra_thread_cpu[m].push_back(thread_cpu[m] - thread_cpu[0]);
    }
  }
  mpi.barrier();
  if (mpi.rank() != 0) return 0;
  std::filesystem::remove_all(train_dir);
  fmt::print("\n# zero-code profiling: a training loop with a DistributedOptimizer, {} ranks, "
             "{} rounds of {} steps ({} KiB gradient, {} us of work per step)\n",
             mpi.size(), train_rounds, loop.steps, loop.grad_floats * sizeof(float) / 1024,
             loop.work.count());
  fmt::print("| dtrain started | steps/s, median (quartiles) | profiled / unprofiled steps/s, "
             "median of rounds (quartiles) | training thread's CPU per step | its increase, "
             "median of rounds | process CPU per step |\n|---|---|---|---|---|---|\n");
  for (std::size_t m = 0; m < modes.size(); ++m) {
    fmt::print("| {} | {:.1f} ({:.1f} - {:.1f}) | ", modes[m].name, quantile(rates[m], 0.5),
               quantile(rates[m], 0.25), quantile(rates[m], 0.75));
    if (m > 0)
      fmt::print("{:.3f} ({:.3f} - {:.3f})", quantile(ratios[m], 0.5), quantile(ratios[m], 0.25),
                 quantile(ratios[m], 0.75));
    fmt::print(" | {} | {} | {} |\n", bench::human_time(quantile(thread_cpus[m], 0.5)),
               m > 0 ? bench::human_time(quantile(extra_thread_cpu[m], 0.5)) : std::string(),
               bench::human_time(quantile(process_cpus[m], 0.5)));
  }
  return 0;
}
