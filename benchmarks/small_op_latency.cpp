// Small-op latency: the round trip of one small allreduce through dtrain's engine vs one raw
// MPI_Allreduce of the same size.
//
//   lone          barrier, then one op, timed alone: the engine is otherwise idle (its thread is
//                 blocked when the op arrives), the case Horovod pays a full cycle for
//   back-to-back  100 ops in a row, each waited before the next is submitted, time / 100
// Samples of dtrain and raw MPI alternate (Note [Benchmark method] in bench_common.hpp).
//
// Usage: mpiexec -n <ranks> bench_small_op_latency [--samples=300]
#include <vector>

#include <dtrain/dtrain.hpp>

#include "bench_common.hpp"

int main(int argc, char** argv) {
  bench::MpiProcess mpi(argc, argv);
  const bench::Args args(argc, argv);
  const int samples_per = static_cast<int>(args.get_int("samples", 300));
  const int burst = 100;

  dtrain::init(dtrain::Config::from_env());
  const std::vector<std::int64_t> sizes = {4, 4096};
  bench::Samples samples;
  for (auto bytes : sizes) {
    std::vector<float> a(static_cast<std::size_t>(bytes / 4), 0.0f), b(a.size(), 0.0f);
    const std::string name = fmt::format("lat.{}", bytes);
    auto via_dtrain = [&] { dtrain::allreduce(a, {.op = dtrain::ReduceOp::Sum, .name = name}); };
    auto via_mpi = [&] {
      MPI_Allreduce(MPI_IN_PLACE, b.data(), static_cast<int>(b.size()), MPI_FLOAT, MPI_SUM,
                    mpi.comm());
    };
    auto lone = [&](auto&& op) {
      mpi.barrier();
      const auto t0 = bench::Clock::now();
      op();
      return mpi.max_over_ranks(bench::seconds_since(t0));
    };
    auto burst_of = [&](auto&& op) {
      mpi.barrier();
      const auto t0 = bench::Clock::now();
      for (int i = 0; i < burst; ++i) op();
      return mpi.max_over_ranks(bench::seconds_since(t0) / burst);
    };
    for (int i = 0; i < 20; ++i) {  // warm-up: cache id, MPI connections
      via_dtrain();
      via_mpi();
    }
    for (int s = 0; s < samples_per; ++s) {
      const bool dtrain_first = s % 2 == 0;
      if (dtrain_first) samples.add(fmt::format("dtrain lone/{}", bytes), lone(via_dtrain));
      samples.add(fmt::format("raw lone/{}", bytes), lone(via_mpi));
      if (!dtrain_first) samples.add(fmt::format("dtrain lone/{}", bytes), lone(via_dtrain));
    }
    for (int s = 0; s < samples_per / 20 + 3; ++s) {
      samples.add(fmt::format("dtrain burst/{}", bytes), burst_of(via_dtrain));
      samples.add(fmt::format("raw burst/{}", bytes), burst_of(via_mpi));
    }
  }

  if (mpi.rank() == 0) {
    fmt::print("# small-op allreduce latency, float32 Sum (median / min over samples)\n");
    fmt::print("# {}\n", bench::machine_line(mpi.size()));
    fmt::print("| size | mode | dtrain median | dtrain min | raw median | raw min | ratio "
               "(median) | ratio (min) |\n");
    fmt::print("|---|---|---|---|---|---|---|---|\n");
    for (auto bytes : sizes) {
      for (std::string mode : {"lone", "burst"}) {
        auto d = samples.get(fmt::format("dtrain {}/{}", mode, bytes));
        auto r = samples.get(fmt::format("raw {}/{}", mode, bytes));
        fmt::print("| {} | {} | {} | {} | {} | {} | {:.1f} | {:.1f} |\n", bench::human_bytes(bytes),
                   mode == "lone" ? "lone" : "back-to-back", bench::human_time(d.median),
                   bench::human_time(d.min), bench::human_time(r.median), bench::human_time(r.min),
                   d.median / r.median, d.min / r.min);
      }
    }
  }
  dtrain::shutdown();
  return 0;
}
