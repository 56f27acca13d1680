// What dtrain::SyncBatchNorm costs against libtorch's BatchNorm2d: one training step of the layer
// alone (forward, then backward from a fixed upstream gradient), on the same input, in the same
// run. Synchronization adds two allreduces of 2C+1 and 2C float64 values and a few per-channel
// passes; the raw-MPI line is the floor of those two allreduces (MPI_Allreduce of the same sizes,
// no dtrain), so the table shows where the extra time goes.
//
// Each round times --iterations steps of every strategy, interleaved, from a barrier; a sample is
// the slowest rank's time per step (Note [Benchmark method] in bench_common.hpp).
//
// Usage: mpiexec -n 2 bench_sync_batch_norm [--rounds=9] [--iterations=20] [--threads=1]
#include <torch/torch.h>

#include <string>
#include <vector>

#include <dtrain/torch.hpp>

#include "bench_common.hpp"

namespace {

struct Shape {
  std::string what;
  std::int64_t batch, channels, side;
};

}  // namespace

int main(int argc, char** argv) {
  bench::MpiProcess mpi(argc, argv);
  const bench::Args args(argc, argv);
  const int rounds = static_cast<int>(args.get_int("rounds", 9));
  const int iterations = static_cast<int>(args.get_int("iterations", 20));
  torch::set_num_threads(static_cast<int>(args.get_int("threads", 1)));
  dtrain::init(dtrain::Config::from_env());

  // Per-rank inputs [batch, channels, side, side]: a ResNet stage on small images, a deep stage,
  // and detection's tiny batch of large maps.
  const std::vector<Shape> shapes = {{"resnet stage, batch 32", 32, 64, 16},
                                     {"deep stage, batch 32", 32, 256, 4},
                                     {"detection, batch 2", 2, 64, 32}};
  std::vector<std::string> lines;
  for (const auto& shape : shapes) {
    torch::manual_seed(1 + mpi.rank());
    const auto x = torch::randn({shape.batch, shape.channels, shape.side, shape.side})
                       .requires_grad_();
    const auto upstream = torch::randn_like(x);
    torch::nn::BatchNorm2d plain(shape.channels);
    dtrain::SyncBatchNorm sync(dtrain::SyncBatchNormOptions(shape.channels).name("bench.bn"));
    std::vector<double> stats(static_cast<std::size_t>(2 * shape.channels + 1), 1.0);
    std::vector<double> reduced(stats.size());

    auto step = [&](auto& layer) {
      x.mutable_grad() = torch::Tensor();
      layer->zero_grad();
      layer(x).backward(upstream);
    };
    auto raw_allreduces = [&] {
      MPI_Allreduce(stats.data(), reduced.data(), static_cast<int>(stats.size()), MPI_DOUBLE,
                    MPI_SUM, mpi.comm());
      MPI_Allreduce(stats.data(), reduced.data(), static_cast<int>(stats.size() - 1), MPI_DOUBLE,
                    MPI_SUM, mpi.comm());
    };
    auto timed = [&](auto&& body) {
      body();  // warm: allocations, the response cache
      mpi.barrier();
      const auto t0 = bench::Clock::now();
      for (int i = 0; i < iterations; ++i) body();
      return mpi.max_over_ranks(bench::seconds_since(t0) / iterations);
    };
    bench::Samples samples;
    for (int round = 0; round < rounds; ++round) {
      samples.add("plain", timed([&] { step(plain); }));
      samples.add("sync", timed([&] { step(sync); }));
      samples.add("raw", timed(raw_allreduces));
    }
    const auto p = samples.get("plain"), s = samples.get("sync"), r = samples.get("raw");
    lines.push_back(fmt::format(
        "| {} [{}, {}, {}, {}] | {} / {} | {} / {} | {:.2f} | {} | {} |", shape.what, shape.batch,
        shape.channels, shape.side, shape.side, bench::human_time(p.median),
        bench::human_time(p.min), bench::human_time(s.median), bench::human_time(s.min),
        s.median / p.median, bench::human_time(s.median - p.median), bench::human_time(r.median)));
  }
  if (mpi.rank() == 0) {
    fmt::print("# SyncBatchNorm vs BatchNorm2d, forward + backward of the layer, {} rounds of {} "
               "steps, {} intra-op thread(s) per rank (median / min per step, slowest rank)\n",
               rounds, iterations, torch::get_num_threads());
    fmt::print("# {}\n", bench::machine_line(mpi.size()));
    fmt::print("| per-rank input | BatchNorm2d | SyncBatchNorm | ratio (medians) | extra | "
               "2 raw MPI_Allreduce |\n|---|---|---|---|---|---|\n");
    for (const auto& line : lines) fmt::print("{}\n", line);
  }
  dtrain::shutdown();
  return 0;
}
