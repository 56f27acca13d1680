// Allgather fusion: 100 small allgathers (dim 0 differing per rank and per tensor) through dtrain
// with fusion on (the default threshold: one MPI_Allgatherv per burst, Note [Fused allgather] in
// runtime/execution/host_backend.hpp) and off (DTRAIN_FUSION_THRESHOLD=0: one per tensor), in the
// same run.
//
//   async     100 allgather_async calls, then every handle waited: what a model's sparse
//             gradients or per-layer statistics look like; fusion comes from the coordinator's
//             batching of a burst (Note [Batching])
//   grouped   one grouped_allgather of the 100 tensors: negotiated as a unit, fused
//             deterministically
// For scale, raw MPI in the same run: 100 MPI_Allgatherv calls, one per tensor (what any engine
// that does not fuse pays at least), and one MPI_Allgatherv of the 100 tensors packed by hand.
//
// The fusion setting is agreed at init(), so each round initializes dtrain with fusion on, takes
// its samples, shuts down, and does the same with fusion off (MPI stays up: the benchmark
// initialized it). Rounds alternate which setting goes first (Note [Benchmark method] in
// bench_common.hpp). A sample is the slowest rank's time for the 100 tensors, from a barrier.
//
// Usage: mpiexec -n <ranks> bench_allgather_fusion [--rounds=6] [--samples=20] [--tensors=100]
//                                                   [--cols=16]
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include <dtrain/dtrain.hpp>

#include "bench_common.hpp"

namespace {

// Tensor t of rank r: 8 + (r + t) % 5 rows of kCols floats (16: 0.5 to 0.75 KiB).
std::int64_t rows_of(int r, int t) { return 8 + (r + t) % 5; }
std::int64_t kCols = 16;

struct Tensors {
  std::vector<std::vector<float>> data;
  std::vector<dtrain::TensorView> views;
};

Tensors make_tensors(int rank, int count) {
  Tensors t;
  for (int i = 0; i < count; ++i) t.data.emplace_back(rows_of(rank, i) * kCols, rank + 0.5f * i);
  for (auto& d : t.data)
    t.views.emplace_back(d.data(), static_cast<std::int64_t>(d.size()), dtrain::DataType::float32,
                         dtrain::Device::cpu(),
                         dtrain::Shape{static_cast<std::int64_t>(d.size()) / kCols, kCols});
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  bench::MpiProcess mpi(argc, argv);
  const bench::Args args(argc, argv);
  const int rounds = static_cast<int>(args.get_int("rounds", 6));
  const int samples_per_round = static_cast<int>(args.get_int("samples", 20));
  const int count = static_cast<int>(args.get_int("tensors", 100));
  kCols = args.get_int("cols", 16);
  const int rank = mpi.rank(), size = mpi.size();
  Tensors tensors = make_tensors(rank, count);

  // Raw MPI: counts of every rank for every tensor, and the packed layout.
  std::vector<std::vector<int>> counts(count, std::vector<int>(size)), displs = counts;
  std::vector<int> packed_counts(size, 0), packed_displs(size, 0);
  std::int64_t gathered_bytes = 0;
  for (int t = 0; t < count; ++t)
    for (int r = 0; r < size; ++r) {
      counts[t][r] = static_cast<int>(rows_of(r, t) * kCols);
      displs[t][r] = r == 0 ? 0 : displs[t][r - 1] + counts[t][r - 1];
      packed_counts[r] += counts[t][r];
      gathered_bytes += counts[t][r] * 4;
    }
  for (int r = 1; r < size; ++r) packed_displs[r] = packed_displs[r - 1] + packed_counts[r - 1];
  std::vector<std::vector<float>> raw_out(count);
  for (int t = 0; t < count; ++t) raw_out[t].resize(displs[t][size - 1] + counts[t][size - 1]);
  std::vector<float> packed_out(packed_displs[size - 1] + packed_counts[size - 1]);
  std::vector<float> packed_in(packed_counts[rank]);

  bench::Samples samples;
  auto timed = [&](auto&& op) {
    mpi.barrier();
    const auto t0 = bench::Clock::now();
    op();
    return mpi.max_over_ranks(bench::seconds_since(t0));
  };
  auto async_burst = [&] {
    std::vector<dtrain::ResultHandle<dtrain::OwnedTensor>> hs;
    hs.reserve(count);
    for (int t = 0; t < count; ++t)
      hs.push_back(dtrain::allgather_async(tensors.views[t], {.name = fmt::format("ag.{}", t)}));
    for (auto& h : hs) h.wait();
  };
  auto grouped = [&] { (void)dtrain::grouped_allgather(tensors.views, {.name = "agg"}); };
  auto raw_each = [&] {
    for (int t = 0; t < count; ++t)
      MPI_Allgatherv(tensors.data[t].data(), counts[t][rank], MPI_FLOAT, raw_out[t].data(),
                     counts[t].data(), displs[t].data(), MPI_FLOAT, mpi.comm());
  };
  auto raw_packed = [&] {
    std::size_t at = 0;
    for (int t = 0; t < count; ++t) {
      std::copy(tensors.data[t].begin(), tensors.data[t].end(), packed_in.begin() + at);
      at += tensors.data[t].size();
    }
    MPI_Allgatherv(packed_in.data(), packed_counts[rank], MPI_FLOAT, packed_out.data(),
                   packed_counts.data(), packed_displs.data(), MPI_FLOAT, mpi.comm());
  };

  std::uint64_t fused_collectives = 0, unfused_collectives = 0;
  for (int round = 0; round < rounds; ++round) {
    for (int k = 0; k < 2; ++k) {
      const bool fused = (round + k) % 2 == 0;
      dtrain::Config config = dtrain::Config::from_env();
      if (!fused) config.fusion_threshold_bytes = 0;
      dtrain::init(config);
      const std::string label = fused ? "fused" : "unfused";
      for (int w = 0; w < 3; ++w) {  // warm-up: connections, buffers
        async_burst();
        grouped();
      }
      const auto before = dtrain::engine_stats();
      for (int s = 0; s < samples_per_round; ++s) {
        samples.add("async " + label, timed(async_burst));
        samples.add("grouped " + label, timed(grouped));
      }
      const auto used = dtrain::detail::engine_stats_delta(dtrain::engine_stats(), before);
      (fused ? fused_collectives : unfused_collectives) += used.collectives;
      dtrain::shutdown();
    }
    for (int s = 0; s < samples_per_round; ++s) {
      samples.add("raw MPI, one call per tensor", timed(raw_each));
      samples.add("raw MPI, one packed call", timed(raw_packed));
    }
  }

  if (rank == 0) {
    fmt::print("# allgather fusion: {} tensors of 8-12 rows x {} float32 per rank ({} gathered "
               "per burst), median / min over samples\n",
               count, kCols, bench::human_bytes(gathered_bytes));
    fmt::print("# {}\n", bench::machine_line(size));
    fmt::print("| strategy | median | min |\n|---|---|---|\n");
    for (const auto& name : samples.names()) {
      const auto s = samples.get(name);
      fmt::print("| {} | {} | {} |\n", name, bench::human_time(s.median),
                 bench::human_time(s.min));
    }
    const int bursts = rounds * samples_per_round * 2;
    fmt::print("\ncollectives per burst on rank 0: fused {:.1f}, unfused {:.1f}\n",
               static_cast<double>(fused_collectives) / bursts,
               static_cast<double>(unfused_collectives) / bursts);
    for (const char* mode : {"async", "grouped"}) {
      const auto f = samples.get(fmt::format("{} fused", mode));
      const auto u = samples.get(fmt::format("{} unfused", mode));
      fmt::print("{}: unfused / fused = {:.1f}x (medians), {:.1f}x (minima)\n", mode,
                 u.median / f.median, u.min / f.min);
    }
  }
  return 0;
}
