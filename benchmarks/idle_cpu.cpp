// CPU burned by dtrain when there is nothing to do, measured with getrusage(RUSAGE_SELF) (all
// threads of the process) over a wall-clock interval.
//
//   idle            dtrain initialized, every rank sleeps --seconds: the engine must block
//   waiting         every rank but the last waits in dtrain::allreduce while the last rank sleeps
//                   --wait-seconds before submitting: waiting on a straggler must not spin a core
//   raw waiting     the same straggler pattern with a blocking MPI_Allreduce, for comparison
//                   (MPICH busy-polls inside blocking calls)
// Reported in cores: CPU seconds / wall seconds, per rank.
//
// Usage: mpiexec -n 2 bench_idle_cpu [--seconds=10] [--wait-seconds=3]
#include <chrono>
#include <thread>
#include <vector>

#include <dtrain/dtrain.hpp>

#include "bench_common.hpp"

int main(int argc, char** argv) {
  bench::MpiProcess mpi(argc, argv);
  const bench::Args args(argc, argv);
  const double idle_s = args.get_double("seconds", 10);
  const double wait_s = args.get_double("wait-seconds", 3);
  const bool straggler = mpi.rank() == mpi.size() - 1;

  dtrain::init(dtrain::Config::from_env());
  std::vector<float> x(1024, 1.0f);
  dtrain::allreduce(x, {.name = "warm"});  // the engine has run once: threads exist, MPI is warm

  auto cores_during = [&](auto&& body) {
    mpi.barrier();
    const double cpu0 = bench::cpu_seconds_self();
    const auto t0 = bench::Clock::now();
    body();
    const double wall = bench::seconds_since(t0);
    return (bench::cpu_seconds_self() - cpu0) / wall;
  };
  auto sleep_for = [](double s) { std::this_thread::sleep_for(std::chrono::duration<double>(s)); };

  const double idle = cores_during([&] { sleep_for(idle_s); });
  const double waiting = cores_during([&] {
    if (straggler) sleep_for(wait_s);
    dtrain::allreduce(x, {.name = "straggler"});
  });
  const double raw_waiting = cores_during([&] {
    if (straggler) sleep_for(wait_s);
    MPI_Allreduce(MPI_IN_PLACE, x.data(), static_cast<int>(x.size()), MPI_FLOAT, MPI_SUM, mpi.comm());
  });

  std::vector<double> all(static_cast<std::size_t>(mpi.size()) * 3);
  const double mine[3] = {idle, waiting, raw_waiting};
  MPI_Gather(mine, 3, MPI_DOUBLE, all.data(), 3, MPI_DOUBLE, 0, mpi.comm());
  if (mpi.rank() == 0) {
    fmt::print("# idle CPU in cores (CPU seconds of all threads / wall seconds)\n");
    fmt::print("# {}\n", bench::machine_line(mpi.size()));
    fmt::print("| rank | dtrain idle ({} s) | dtrain waiting on straggler ({} s) | raw MPI waiting on "
               "straggler |\n|---|---|---|---|\n",
               idle_s, wait_s);
    for (int r = 0; r < mpi.size(); ++r) {
      const double* v = &all[static_cast<std::size_t>(r) * 3];
      fmt::print("| {}{} | {:.4f} | {:.4f} | {:.4f} |\n", r, r == mpi.size() - 1 ? " (straggler)" : "",
                 v[0], v[1], v[2]);
    }
  }
  dtrain::shutdown();
  return 0;
}
