// dtrain's device allreduce (NCCL through the engine) vs raw ncclAllReduce, in the same run.
//
// Both are timed the same way on the host: from the call until the result is complete on the
// device (dtrain: allreduce() returns; raw: ncclAllReduce then cudaStreamSynchronize), slowest
// rank, after a barrier. Reported in nccl-tests units (algbw; busbw = algbw * 2(n-1)/n, which is 0
// at one rank, so there the ratio of times is the comparison).
// Usage: [mpiexec -n N] bench_gpu_allreduce [--rounds=20] [--max_mib=256]
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include <cstdio>
#include <string>
#include <vector>

#include "dtrain/cuda.hpp"
#include "gpu_bench_common.hpp"

using namespace gpu_bench;

int main(int argc, char** argv) {
  dtrain::Session session(argc, argv);
  if (dtrain::cuda::device_count() < 1 || dtrain::cuda::device_count() < dtrain::local_size()) {
    if (dtrain::rank() == 0) std::printf("no CUDA device for every rank: skipped\n");
    return 0;
  }
  const int rounds = std::stoi(arg(argc, argv, "rounds", "20"));
  const std::int64_t max_bytes = std::stoll(arg(argc, argv, "max_mib", "256")) << 20;
  const int device = dtrain::cuda::set_device_from_local_rank();
  const int rank = dtrain::rank(), size = dtrain::size();
  if (rank == 0) std::printf("# allreduce, float32 Sum, %d rank(s)\n%s\n", size, device_line(device).c_str());
  ncclComm_t raw = raw_nccl_comm();
  cudaStream_t s = nullptr;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");

  if (rank == 0)
    std::printf("%10s %14s %14s %10s %10s %10s %10s %9s\n", "size", "dtrain med", "raw med", "dtrain min",
                "raw min", "algbw dt", "busbw dt", "raw/dt");
  for (std::int64_t bytes = 1 << 20; bytes <= max_bytes; bytes *= 4) {
    const std::int64_t n = bytes / 4;
    void* buf = nullptr;
    check(cudaMalloc(&buf, static_cast<std::size_t>(bytes)), "cudaMalloc");
    check(cudaMemset(buf, 0, static_cast<std::size_t>(bytes)), "cudaMemset");
    dtrain::TensorView view(buf, n, dtrain::DataType::float32, dtrain::Device::cuda(device));
    const std::string name = "bench." + std::to_string(bytes);
    Samples samples;
    for (int r = 0; r < rounds + 3; ++r) {
      const bool warm = r < 3;
      MPI_Barrier(MPI_COMM_WORLD);
      auto t0 = Clock::now();
      dtrain::allreduce(view, {.op = dtrain::ReduceOp::Sum, .name = name});
      const double dt = max_over_ranks(std::chrono::duration<double>(Clock::now() - t0).count());
      MPI_Barrier(MPI_COMM_WORLD);
      t0 = Clock::now();
      check(ncclAllReduce(buf, buf, static_cast<std::size_t>(n), ncclFloat32, ncclSum, raw, s), "ncclAllReduce");
      check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
      const double rt = max_over_ranks(std::chrono::duration<double>(Clock::now() - t0).count());
      if (!warm) {
        samples.add("dtrain", dt);
        samples.add("raw", rt);
      }
    }
    const auto d = samples.get("dtrain"), rw = samples.get("raw");
    if (rank == 0) {
      std::printf("%10s %14s %14s %10s %10s %10.1f %10.1f %8.2fx\n", human_bytes(bytes).c_str(),
                  ms(d.median).c_str(), ms(rw.median).c_str(), ms(d.min).c_str(), ms(rw.min).c_str(),
                  gbps(bytes, d.median), allreduce_busbw(bytes, d.median, size), rw.median / d.median);
      result("allreduce_" + std::to_string(bytes >> 20) + "MiB_np" + std::to_string(size) + "_raw_over_dtrain",
             rw.median / d.median);
    }
    cudaFree(buf);
  }
  ncclCommDestroy(raw);
  cudaStreamDestroy(s);
  return 0;
}
