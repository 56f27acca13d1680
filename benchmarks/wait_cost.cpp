// What waiting for a link-bound allreduce costs the rank that waits (Note [Waiting for data
// collectives] in include/dtrain/comm/request_wait.hpp). Meant for ranks on separate hosts joined
// by a slow link, each rank pinned to one core (benchmarks/cluster/run_experiments.py --experiment
// wait); on one host it measures shared-memory transfers, which wait hot.
//
// For each way of waiting, one allreduce of --mb MiB (float32, Sum), interleaved over --rounds:
//   transfer   the allreduce alone: its wall time
//   cores      the same while the main thread sleeps: CPU seconds of all of the process's threads
//              over the wall seconds of the transfer (1.0 = a whole core)
//   slowdown   a fixed compute loop (--compute-ms when alone) run on the main thread while the
//              allreduce is in flight, against the same loop alone right before
// Ways: dtrain (allreduce_async, DTRAIN_MPI_NONBLOCKING=1; the engine's waiting as configured),
// the same never sleeping (DTRAIN_WAIT_MAX_SLEEP_US=0: the engine polls as MPI's blocking calls
// do), dtrain with DTRAIN_MPI_NONBLOCKING=0 (MPI's blocking allreduce on the engine thread), and
// raw MPI_Allreduce on a helper thread, and where dtrain is built with Gloo, dtrain over Gloo
// (DTRAIN_CPU_OPERATIONS=gloo; Note [Gloo on the host path] in include/dtrain/comm/gloo_group.hpp).
//
// Usage: dtrainrun -H a:1,b:1 bench_wait_cost [--mb=64] [--rounds=3] [--compute-ms=800]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include <dtrain/dtrain.hpp>

#include "bench_common.hpp"

namespace {

volatile double sink = 0;

// A compute loop of `iterations`: arithmetic on a small array that stays in cache, so it measures
// the core it gets, not memory bandwidth.
double compute(std::int64_t iterations) {
  double a[64];
  for (int i = 0; i < 64; ++i) a[i] = 1.0 + i * 1e-3;
  for (std::int64_t it = 0; it < iterations; ++it)
    for (int i = 0; i < 64; ++i) a[i] = a[i] * 0.999999 + 1e-6;
  double s = 0;
  for (double x : a) s += x;
  sink = s;
  return s;
}

struct Row {
  std::vector<double> transfer_s, cores, slowdown;
};

}  // namespace

int main(int argc, char** argv) {
  bench::MpiProcess mpi(argc, argv);
  const bench::Args args(argc, argv);
  const std::int64_t mb = args.get_int("mb", 64);
  const int rounds = static_cast<int>(args.get_int("rounds", 3));
  const double compute_ms = args.get_double("compute-ms", 800);
  const std::size_t n = static_cast<std::size_t>(mb) << 18;  // float32 elements

  // Calibrate the compute loop to about compute_ms alone, the same on every rank (rank 0's).
  std::int64_t iterations = 1000;
  while (true) {
    const auto t0 = bench::Clock::now();
    compute(iterations);
    const double s = bench::seconds_since(t0);
    if (s * 1000 > compute_ms / 4) {
      iterations = static_cast<std::int64_t>(iterations * compute_ms / (s * 1000));
      break;
    }
    iterations *= 2;
  }
  MPI_Bcast(&iterations, 1, MPI_INT64_T, 0, mpi.comm());

  std::vector<float> data(n, 1.0f);
  auto reset = [&] { std::fill(data.begin(), data.end(), 1.0f); };
  auto check = [&](const char* what) {
    if (data[0] != static_cast<float>(mpi.size()) || data[n - 1] != static_cast<float>(mpi.size()))
      fmt::print(stderr, "rank {}: {}: wrong result {}\n", mpi.rank(), what, data[0]);
  };

  // One way of waiting: `start` begins the allreduce, `finish` waits for it.
  struct Way {
    std::string name;
    dtrain::Config config;  // for the dtrain ways
    bool raw = false;
  };
  std::vector<Way> ways;
  {
    Way d{"dtrain", dtrain::Config::from_env()};  // nonblocking, waiting as configured
    d.config.mpi_nonblocking = true;
    Way hot{"dtrain, never sleeping", d.config};
    hot.config.wait_max_sleep_us = 0;
    Way blocking{"dtrain, MPI's blocking allreduce", dtrain::Config::from_env()};
    blocking.config.mpi_nonblocking = false;
    Way raw{"raw MPI_Allreduce (helper thread)", {}, true};
    ways = {d, hot, blocking, raw};
#if DTRAIN_WITH_GLOO
    Way gloo{"dtrain over Gloo", dtrain::Config::from_env()};  // DTRAIN_CPU_OPERATIONS=gloo
    gloo.config.cpu_operations = "gloo";
    ways.push_back(gloo);
#endif
  }
  std::vector<Row> rows(ways.size());

  auto measure = [&](Way& way, Row& row, int round) {
    if (!way.raw) dtrain::init(way.config);
    std::thread helper;
    std::atomic<bool> done{false};
    dtrain::Handle h;
    auto start = [&] {
      reset();
      done = false;
      if (way.raw) {
        helper = std::thread([&] {
          MPI_Allreduce(MPI_IN_PLACE, data.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM,
                        mpi.comm());
          done = true;
        });
      } else {
        h = dtrain::allreduce_async(data, {.op = dtrain::ReduceOp::Sum,
                                           .name = fmt::format("wait.{}", round)});
      }
    };
    auto finish = [&] {
      if (way.raw) helper.join();
      else h.wait();
      check(way.name.c_str());
    };
    // Warm: memory touched, the engine and MPI's connections up.
    start();
    finish();
    // The transfer with a sleeping main thread.
    mpi.barrier();
    const double cpu0 = bench::cpu_seconds_self();
    const auto t0 = bench::Clock::now();
    start();
    if (way.raw) {
      while (!done) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    } else {
      while (!h.poll()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    const double wall = bench::seconds_since(t0);
    const double cores = (bench::cpu_seconds_self() - cpu0) / wall;
    finish();
    // Compute alone, then compute while the allreduce is in flight.
    mpi.barrier();
    auto c0 = bench::Clock::now();
    compute(iterations);
    const double alone = bench::seconds_since(c0);
    mpi.barrier();
    start();
    c0 = bench::Clock::now();
    compute(iterations);
    const double beside = bench::seconds_since(c0);
    finish();
    if (!way.raw) dtrain::shutdown();
    row.transfer_s.push_back(wall);
    row.cores.push_back(cores);
    row.slowdown.push_back(beside / alone);
  };

  for (int round = 0; round < rounds; ++round)
    for (std::size_t w = 0; w < ways.size(); ++w) {
      const std::size_t k = (w + static_cast<std::size_t>(round)) % ways.size();  // interleaved
      measure(ways[k], rows[k], round);
    }

  // Medians per rank, then gathered: the worst rank is what a job feels.
  std::vector<double> mine;
  for (auto& r : rows) {
    mine.push_back(bench::summarize(r.transfer_s).median);
    mine.push_back(bench::summarize(r.cores).median);
    mine.push_back(bench::summarize(r.slowdown).median);
  }
  std::vector<double> all(mine.size() * static_cast<std::size_t>(mpi.size()));
  MPI_Gather(mine.data(), static_cast<int>(mine.size()), MPI_DOUBLE, all.data(),
             static_cast<int>(mine.size()), MPI_DOUBLE, 0, mpi.comm());
  if (mpi.rank() == 0) {
    fmt::print("# wait cost: one {} MiB float32 allreduce, main thread sleeping or computing; "
               "medians of {} interleaved rounds\n", mb, rounds);
    fmt::print("# {}\n", bench::machine_line(mpi.size()));
    fmt::print("| way | rank | transfer s | cores while waiting | compute slowdown |\n"
               "|---|---|---|---|---|\n");
    for (std::size_t w = 0; w < ways.size(); ++w)
      for (int r = 0; r < mpi.size(); ++r) {
        const double* v = &all[static_cast<std::size_t>(r) * mine.size() + w * 3];
        fmt::print("| {} | {} | {:.3f} | {:.2f} | {:.2f}x |\n", ways[w].name, r, v[0], v[1], v[2]);
      }
    // One line per way for scripts: the worst rank.
    for (std::size_t w = 0; w < ways.size(); ++w) {
      double t = 0, c = 0, s = 0;
      for (int r = 0; r < mpi.size(); ++r) {
        const double* v = &all[static_cast<std::size_t>(r) * mine.size() + w * 3];
        t = std::max(t, v[0]);
        c = std::max(c, v[1]);
        s = std::max(s, v[2]);
      }
      fmt::print("RESULT way=\"{}\" transfer_s={:.4f} cores={:.3f} slowdown={:.3f}\n",
                 ways[w].name, t, c, s);
    }
  }
  return 0;
}
