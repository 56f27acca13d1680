// Autotune before/after: a ResNet gradient sync (the "dtrain fused" step of bench_grad_sync,
// Average) run with the configuration the autotuner chose, the default configuration, and the
// worst configuration the tuner tried, side by side in one run.
//
// 1. Tuning: dtrain::init with DTRAIN_AUTOTUNE on (log to a temporary CSV) and as many steps as
//    the tuner needs to settle (it writes a `choice` row); the schedule comes from the
//    environment like any job's (DTRAIN_AUTOTUNE_STEPS_PER_SAMPLE, ..._BAYES_OPT_MAX_SAMPLES).
// 2. From the log (rank 0, broadcast): default = configuration 0 (the tuner starts from the
//    default), tuned = the choice, worst = the configuration with the lowest median score.
// 3. Measuring: rounds x {default, tuned, worst}, each initializing dtrain with that
//    configuration (autotune off), two discarded steps, then --steps timed steps; a sample is
//    the median step of one round (Note [Benchmark method] in bench_common.hpp).
//
// Usage: mpiexec -n <ranks> bench_autotune_grad_sync [--model=resnet18|resnet50] [--rounds=5]
//                                                     [--steps=10] [--max-tuning-steps=4000]
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <dtrain/autotune/knobs.hpp>
#include <dtrain/autotune/saved_result.hpp>
#include <dtrain/dtrain.hpp>

#include "bench_common.hpp"

namespace {

using dtrain::autotune::Knob;
using dtrain::autotune::Knobs;

struct Gradients {
  std::vector<bench::Param> params;
  std::vector<std::vector<float>> grads;  // backward order
};

Gradients make_gradients(const std::string& model) {
  Gradients g;
  g.params = model == "resnet50" ? bench::resnet50_params() : bench::resnet18_params();
  for (const auto& p : g.params) g.grads.emplace_back(static_cast<std::size_t>(p.numel()), 1.0f);
  return g;
}

// One training step's sync: every gradient submitted in backward order, then all waited.
void sync(Gradients& g) {
  std::vector<dtrain::Handle> handles;
  handles.reserve(g.grads.size());
  for (std::size_t i = 0; i < g.grads.size(); ++i)
    handles.push_back(dtrain::allreduce_async(g.grads[i], {.name = g.params[i].name}));
  for (auto& h : handles) h.wait();
}

struct LogRow {
  std::string kind;
  int configuration = -1;
  Knobs knobs;
  double score = 0;
};

// The tuning log's rows (docs/autotune.md, "The log"), its columns found by the header's names.
std::vector<LogRow> read_log(const std::string& path) {
  auto split = [](const std::string& line) {
    std::vector<std::string> f;
    std::stringstream ss(line);
    for (std::string cell; std::getline(ss, cell, ',');) f.push_back(cell);
    if (!line.empty() && line.back() == ',') f.emplace_back();
    return f;
  };
  std::ifstream in(path);
  std::vector<LogRow> rows;
  std::string line;
  if (!std::getline(in, line)) return rows;
  const std::vector<std::string> header = split(line);
  auto column = [&](std::string_view name) {
    return static_cast<std::size_t>(std::find(header.begin(), header.end(), name) - header.begin());
  };
  while (std::getline(in, line)) {
    const std::vector<std::string> f = split(line);
    if (f.size() != header.size()) continue;
    LogRow r;
    r.kind = f[column("kind")];
    r.configuration = f[column("configuration")].empty() ? -1 : std::stoi(f[column("configuration")]);
    bool ok = true;
    for (Knob knob : dtrain::autotune::all_knobs) {
      const std::size_t at = column(dtrain::autotune::to_string(knob));
      ok = at < f.size() && dtrain::autotune::detail::parse_knob_value(f[at], knob, r.knobs) && ok;
    }
    if (!ok) continue;
    r.score = std::stod(f[column("score_bytes_per_second")]);
    rows.push_back(r);
  }
  return rows;
}

bool has_choice(const std::string& path) {
  for (const auto& r : read_log(path))
    if (r.kind == "choice") return true;
  return false;
}

void broadcast(Knobs& k, MPI_Comm comm) {
  MPI_Bcast(&k, sizeof(Knobs), MPI_BYTE, 0, comm);  // same binary on every rank
}

}  // namespace

int main(int argc, char** argv) {
  bench::MpiProcess mpi(argc, argv);
  const bench::Args args(argc, argv);
  const std::string model = args.get("model", "resnet18");
  const int rounds = static_cast<int>(args.get_int("rounds", 5));
  const int steps = static_cast<int>(args.get_int("steps", 10));
  const long max_tuning_steps = args.get_int("max-tuning-steps", 4000);
  if (model != "resnet18" && model != "resnet50") {
    if (mpi.rank() == 0) std::fprintf(stderr, "--model must be resnet18 or resnet50\n");
    return 2;
  }
  Gradients g = make_gradients(model);

  long pid = static_cast<long>(::getpid());
  MPI_Bcast(&pid, 1, MPI_LONG, 0, mpi.comm());
  const std::string log_path =
      (std::filesystem::temp_directory_path() / ("dtrain_bench_autotune_" + std::to_string(pid) +
                                                 ".csv")).string();

  // 1. Tuning.
  dtrain::Config tuning = dtrain::Config::from_env();
  const dtrain::Config base = tuning;
  tuning.autotune = true;
  tuning.autotune_log = log_path;
  tuning.autotune_cache.clear();
  dtrain::init(tuning);
  long tuning_steps = 0;
  const auto tuning_start = bench::Clock::now();
  for (int done = 0; !done;) {
    for (int i = 0; i < 10; ++i) sync(g);
    tuning_steps += 10;
    done = mpi.rank() == 0 && has_choice(log_path);
    MPI_Bcast(&done, 1, MPI_INT, 0, mpi.comm());
    if (!done && tuning_steps >= max_tuning_steps) {
      if (mpi.rank() == 0)
        std::fprintf(stderr, "the tuner did not settle within %ld steps (--max-tuning-steps)\n",
                     max_tuning_steps);
      dtrain::shutdown();
      return 1;
    }
  }
  const double tuning_seconds = bench::seconds_since(tuning_start);
  dtrain::shutdown();

  // 2. The three configurations.
  Knobs def, tuned, worst;
  int configurations = 0;
  if (mpi.rank() == 0) {
    const auto rows = read_log(log_path);
    double worst_score = INFINITY;
    for (const auto& r : rows) {
      if (r.kind == "median") {
        configurations = std::max(configurations, r.configuration + 1);
        if (r.configuration == 0) def = r.knobs;
        if (r.score < worst_score) worst_score = r.score, worst = r.knobs;
      }
      if (r.kind == "choice") tuned = r.knobs;
    }
    std::filesystem::remove(log_path);
  }
  broadcast(def, mpi.comm());
  broadcast(tuned, mpi.comm());
  broadcast(worst, mpi.comm());

  // 3. Measuring, interleaved round by round.
  const struct {
    const char* name;
    Knobs knobs;
  } runs[] = {{"default", def}, {"tuned", tuned}, {"worst tried", worst}};
  bench::Samples samples;
  bool wrong = false;
  for (int round = 0; round < rounds; ++round) {
    for (const auto& run : runs) {
      dtrain::Config c = dtrain::autotune::apply_knobs(base, run.knobs);
      c.autotune = false;
      dtrain::init(c);
      std::vector<double> times;
      for (int s = 0; s < steps + 2; ++s) {
        for (auto& v : g.grads) std::fill(v.begin(), v.end(), 1.0f);
        mpi.barrier();
        const auto t0 = bench::Clock::now();
        sync(g);
        const double t = mpi.max_over_ranks(bench::seconds_since(t0));
        if (s >= 2) times.push_back(t);
        wrong |= g.grads.front().front() != 1.0f || g.grads.back().back() != 1.0f;  // Average of 1s
      }
      dtrain::shutdown();
      samples.add(run.name, bench::summarize(times).median);
    }
  }

  if (mpi.rank() == 0) {
    std::printf("%s\n", bench::machine_line(mpi.size()).c_str());
    std::printf("%s gradient sync (Average), %d ranks: tuning took %ld steps (%.1f s), %d "
                "configurations; then %d rounds x %d timed steps per configuration\n\n",
                model.c_str(), mpi.size(), tuning_steps, tuning_seconds, configurations, rounds,
                steps);
    std::printf("| configuration | knobs | median step | min step | vs default |\n");
    std::printf("|---|---|---|---|---|\n");
    const double base_median = samples.get("default").median;
    for (const auto& run : runs) {
      const auto s = samples.get(run.name);
      std::printf("| %s | %s | %.2f ms | %.2f ms | %.2f |\n", run.name,
                  dtrain::autotune::describe(run.knobs).c_str(), s.median * 1e3, s.min * 1e3,
                  s.median / base_median);
    }
  }
  if (wrong) {
    std::fprintf(stderr, "rank %d: a sync gave a wrong result\n", mpi.rank());
    return 1;
  }
  return 0;
}
