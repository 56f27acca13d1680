// Memory behaviour in steady state: a training-like loop that reduces ResNet-50's 161 gradients
// every step. After warm-up, count minor page faults per step (getrusage ru_minflt: every fault on
// freshly mapped memory), heap growth (mallinfo2: bytes obtained from the system, and bytes in
// use) and dtrain's own buffer (re)allocations, across --steps steps.
//
//   dtrain fused            default Config, allreduce_async per tensor in backward order, wait all
//   raw concat              one MPI_Allreduce of a preallocated 102 MB buffer: MPICH allocates a
//                           message-sized scratch per call, so each call maps and faults fresh pages
//   raw concat chunked      the same buffer in DTRAIN_MPI_CHUNK_BYTES calls
//
// Usage: mpiexec -n 2 bench_steady_state_alloc [--warmup=5] [--steps=20]
#include <malloc.h>

#include <algorithm>
#include <vector>

#include <dtrain/dtrain.hpp>

#include "bench_common.hpp"

namespace {

struct Footprint {
  long minflt = 0;
  double system_bytes = 0;  // arena + mmapped blocks
  double used_bytes = 0;    // allocated and not freed
  std::uint64_t dtrain_allocations = 0;
};

Footprint footprint() {
  const struct mallinfo2 mi = mallinfo2();
  Footprint f;
  f.minflt = bench::minor_faults_self();
  f.system_bytes = static_cast<double>(mi.arena + mi.hblkhd);
  f.used_bytes = static_cast<double>(mi.uordblks + mi.hblkhd);
  f.dtrain_allocations = dtrain::engine_stats().buffer_allocations;
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  bench::MpiProcess mpi(argc, argv);
  const bench::Args args(argc, argv);
  const int warmup = static_cast<int>(args.get_int("warmup", 5));
  const int steps = static_cast<int>(args.get_int("steps", 20));

  dtrain::init(dtrain::Config::from_env());
  const std::int64_t chunk = dtrain::config().mpi_chunk_bytes / 4;
  const auto params = bench::resnet50_params();
  std::vector<std::vector<float>> grads;
  std::int64_t total = 0;
  for (const auto& p : params) {
    grads.emplace_back(static_cast<std::size_t>(p.numel()), 1.0f);
    total += p.numel();
  }
  std::vector<float> concat(static_cast<std::size_t>(total), 0.0f);
  std::vector<dtrain::Handle> handles;
  handles.reserve(grads.size());

  auto dtrain_step = [&] {
    handles.clear();
    for (std::size_t i = 0; i < grads.size(); ++i)
      handles.push_back(dtrain::allreduce_async(grads[i], {.name = params[i].name}));
    for (auto& h : handles) h.wait();
  };
  auto pack = [&] {
    float* p = concat.data();
    for (auto& g : grads) p = std::copy(g.begin(), g.end(), p);
  };
  auto unpack = [&] {
    const float* p = concat.data();
    for (auto& g : grads) {
      std::copy(p, p + g.size(), g.begin());
      p += g.size();
    }
  };
  auto raw_step = [&] {
    pack();
    MPI_Allreduce(MPI_IN_PLACE, concat.data(), static_cast<int>(total), MPI_FLOAT, MPI_SUM, mpi.comm());
    unpack();
  };
  auto raw_chunked_step = [&] {
    pack();
    for (std::int64_t off = 0; off < total; off += chunk)
      MPI_Allreduce(MPI_IN_PLACE, concat.data() + off, static_cast<int>(std::min(chunk, total - off)),
                    MPI_FLOAT, MPI_SUM, mpi.comm());
    unpack();
  };

  struct Row {
    std::string name;
    double faults_per_step, system_growth, used_growth, dtrain_allocs, seconds_per_step;
  };
  std::vector<Row> rows;
  auto measure = [&](const std::string& name, auto&& step) {
    for (int i = 0; i < warmup; ++i) step();
    mpi.barrier();
    const Footprint a = footprint();
    const auto t0 = bench::Clock::now();
    for (int i = 0; i < steps; ++i) step();
    const double secs = bench::seconds_since(t0) / steps;
    const Footprint b = footprint();
    // Worst rank for every figure.
    rows.push_back({name, mpi.max_over_ranks(static_cast<double>(b.minflt - a.minflt) / steps),
                    mpi.max_over_ranks(b.system_bytes - a.system_bytes),
                    mpi.max_over_ranks(b.used_bytes - a.used_bytes),
                    mpi.max_over_ranks(static_cast<double>(b.dtrain_allocations - a.dtrain_allocations)),
                    mpi.max_over_ranks(secs)});
  };
  measure("dtrain fused (default)", dtrain_step);
  measure("raw concat (one MPI_Allreduce)", raw_step);
  measure("raw concat chunked", raw_chunked_step);

  if (mpi.rank() == 0) {
    fmt::print("# steady state: ResNet-50 gradients (161 tensors, {:.1f} MB), {} warm-up steps, "
               "{} measured steps (worst rank)\n",
               static_cast<double>(total) * 4 / 1e6, warmup, steps);
    fmt::print("# {}\n", bench::machine_line(mpi.size()));
    fmt::print("| loop | minor faults / step | heap from system, growth (bytes) | heap in use, "
               "growth (bytes) | dtrain buffer allocations | time / step |\n|---|---|---|---|---|---|\n");
    for (const auto& r : rows)
      fmt::print("| {} | {:.1f} | {:.0f} | {:.0f} | {:.0f} | {} |\n", r.name, r.faults_per_step,
                 r.system_growth, r.used_growth, r.dtrain_allocs, bench::human_time(r.seconds_per_step));
  }
  dtrain::shutdown();
  return 0;
}
