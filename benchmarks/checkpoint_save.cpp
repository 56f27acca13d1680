// What a checkpoint save costs a training step (docs/checkpointing.md).
//
// The state is a real model's: ResNet-18 or ResNet-50 weights plus SGD momentum buffers (float32,
// 93.5 MB or 204.5 MB). A step is the communication half of a data-parallel step: one
// grouped_allreduce (Average) of every gradient, as DistributedOptimizer submits it, then the
// momentum update. With no forward/backward compute in it, the step is short and the measured
// slowdown is an upper bound for a real trainer's.
// Each round measures, interleaved:
//   step                    a step without any save
//   step + save()           the step that calls Checkpoint::save (serialization on the caller)
//   save() alone            rank 0's time inside save()
//   steps during the write  the steps that run while rank 0's writer thread is still busy
//   step + save + wait      a blocking save: what a writer on the training thread would cost
// and, per round, what one save adds to the training time against that round's median step:
//   cost, background        (step + save() - step) + sum over the steps during the write of
//                           (that step - step)
//   cost, blocking          step + save + wait - step
// A step's time is the slowest rank's, from a barrier (Note [Benchmark method]).
// Then rank 0 alone times the phases of one write of the same size, with no training running:
// CRC-32C, write(2) in 4 MiB pieces, and commit (fsync, rename, folder fsync).
//
// Usage: mpiexec -n <ranks> bench_checkpoint_save [--rounds=5] [--model=resnet18|resnet50|all]
//                                                [--dir=bench-checkpoints]
#include <algorithm>
#include <filesystem>
#include <vector>

#include <dtrain/dtrain.hpp>
#include <dtrain/core/atomic_file.hpp>
#include <dtrain/core/crc32c.hpp>

#include "bench_common.hpp"

namespace {

struct State {
  std::vector<std::vector<float>> weights, velocity, grads;
  std::int64_t bytes = 0;  // weights + velocity
};

State make_state(const std::vector<bench::Param>& params) {
  State s;
  for (const auto& p : params) {
    const auto n = static_cast<std::size_t>(p.numel());
    s.weights.emplace_back(n, 0.01f);
    s.velocity.emplace_back(n, 0.0f);
    s.grads.emplace_back(n, 0.0f);
    s.bytes += 2 * static_cast<std::int64_t>(n * sizeof(float));
  }
  return s;
}

void step(State& s, int rank, int k) {
  for (auto& g : s.grads) std::fill(g.begin(), g.end(), 1e-3f * static_cast<float>(rank + k % 7));
  dtrain::grouped_allreduce(s.grads, {.name = "bench.grads"});
  for (std::size_t t = 0; t < s.weights.size(); ++t)
    for (std::size_t i = 0; i < s.weights[t].size(); ++i) {
      s.velocity[t][i] = 0.9f * s.velocity[t][i] + s.grads[t][i];
      s.weights[t][i] -= 0.1f * s.velocity[t][i];
    }
}

}  // namespace

int main(int argc, char** argv) {
  bench::MpiProcess mpi(argc, argv);
  const bench::Args args(argc, argv);
  const int rounds = static_cast<int>(args.get_int("rounds", 5));
  const std::string which = args.get("model", "all");
  const std::filesystem::path dir = args.get("dir", "bench-checkpoints");
  dtrain::init();
  const int rank = mpi.rank();
  if (rank == 0) fmt::print("{}\ncheckpoint folder: {}\n\n", bench::machine_line(mpi.size()), dir.string());

  std::vector<std::string> models;
  if (which == "all" || which == "resnet18") models.push_back("resnet18");
  if (which == "all" || which == "resnet50") models.push_back("resnet50");
  if (rank == 0)
    fmt::print("| model | state | step | step + save() | save() alone | steps during the write "
               "| step + save + wait | cost, background | cost, blocking |\n"
               "|---|---|---|---|---|---|---|---|---|\n");
  for (const auto& name : models) {
    State s = make_state(name == "resnet50" ? bench::resnet50_params() : bench::resnet18_params());
    if (rank == 0) std::filesystem::remove_all(dir);
    mpi.barrier();
    dtrain::Checkpoint checkpoint({.directory = dir, .keep_last = 2});
    bench::Samples samples;
    std::int64_t k = 0;
    auto timed = [&](auto&& body) {
      mpi.barrier();
      const auto t0 = bench::Clock::now();
      body();
      return mpi.max_over_ranks(bench::seconds_since(t0));
    };
    auto save = [&] {
      checkpoint.save({.step = k}, {{"model", s.weights}, {"optimizer", s.velocity}});
    };
    step(s, rank, k++);  // warm-up: first-touch of every buffer
    for (int round = 0; round < rounds + 1; ++round) {  // round 0 warms the payload buffers
      const bool keep = round > 0;
      std::vector<double> plain;
      for (int i = 0; i < 5; ++i) {
        const double t = timed([&] { step(s, rank, k++); });
        plain.push_back(t);
        if (keep) samples.add("step", t);
      }
      const double reference = bench::summarize(plain).median;
      double cost = 0;
      double save_alone = 0;
      const double t_save = timed([&] {
        step(s, rank, k++);
        const auto t0 = bench::Clock::now();
        save();
        save_alone = bench::seconds_since(t0);
      });
      if (keep) samples.add("step + save()", t_save);
      cost += t_save - reference;
      if (keep && rank == 0) samples.add("save() alone", save_alone);
      for (int busy = 1; busy;) {  // until rank 0's writer is done
        const double t = timed([&] { step(s, rank, k++); });
        busy = rank == 0 && checkpoint.writing();
        MPI_Bcast(&busy, 1, MPI_INT, 0, mpi.comm());
        if (keep) samples.add("steps during the write", t);
        cost += t - reference;
      }
      if (keep) samples.add("cost, background", cost);
      const double t_blocking = timed([&] {
        step(s, rank, k++);
        save();
        checkpoint.wait();
      });
      if (keep) samples.add("step + save + wait", t_blocking);
      if (keep) samples.add("cost, blocking", t_blocking - reference);
    }
    checkpoint.wait();
    if (rank == 0) {
      auto cell = [&](const char* n) {
        const auto x = samples.get(n);
        return fmt::format("{} (min {})", bench::human_time(x.median), bench::human_time(x.min));
      };
      const auto during = samples.get("steps during the write");
      fmt::print("| {} | {:.1f} MB | {} | {} | {} | {}, {:.1f} steps per save | {} | {} | {} |\n",
                 name, static_cast<double>(s.bytes) / 1e6, cell("step"), cell("step + save()"),
                 cell("save() alone"), cell("steps during the write"),
                 static_cast<double>(during.count) / rounds, cell("step + save + wait"),
                 cell("cost, background"), cell("cost, blocking"));
    }
  }
  if (rank == 0) {
    fmt::print("\nwhere a write's time goes (rank 0 alone, median of 3; CRC-32C in hardware: {})\n\n"
               "| bytes | CRC-32C | write(2) | fsync + rename + folder fsync |\n|---|---|---|---|\n",
               dtrain::detail::crc32c_in_hardware() ? "yes" : "no");
    std::filesystem::create_directories(dir);
    for (const auto& name : models) {
      std::int64_t bytes = 0;
      for (const auto& p : name == "resnet50" ? bench::resnet50_params() : bench::resnet18_params())
        bytes += 2 * p.numel() * static_cast<std::int64_t>(sizeof(float));
      const std::vector<char> payload(static_cast<std::size_t>(bytes), 1);
      bench::Samples phases;
      for (int rep = 0; rep < 3; ++rep) {
        auto t0 = bench::Clock::now();
        const volatile std::uint32_t crc = dtrain::detail::crc32c(payload.data(), payload.size());
        (void)crc;
        phases.add("crc", bench::seconds_since(t0));
        dtrain::detail::AtomicFileWriter file(dir / "phases.bin");
        t0 = bench::Clock::now();
        for (std::size_t at = 0; at < payload.size(); at += std::size_t{4} << 20)
          file.write(payload.data() + at, std::min(std::size_t{4} << 20, payload.size() - at));
        phases.add("write", bench::seconds_since(t0));
        t0 = bench::Clock::now();
        file.commit();
        phases.add("commit", bench::seconds_since(t0));
      }
      fmt::print("| {:.1f} MB | {} | {} | {} |\n", static_cast<double>(bytes) / 1e6,
                 bench::human_time(phases.get("crc").median), bench::human_time(phases.get("write").median),
                 bench::human_time(phases.get("commit").median));
    }
    std::filesystem::remove_all(dir);
  }
  dtrain::shutdown();
  return 0;
}
