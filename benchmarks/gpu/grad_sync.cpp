// ResNet-50 gradient synchronization on the device: 161 tensors, 102 MB, float32.
//
// dtrain: every gradient submitted with allreduce_async (as backward hooks do), then all waited
// on; and the same as one grouped_allreduce. Raw baselines: one ncclAllReduce over a buffer that
// already holds every gradient (the lower bound: no packing at all), and a hand-written fused sync
// (cudaMemcpyAsync each gradient into a buffer, ncclAllReduce, copy back).
// Usage: [mpiexec -n N] bench_gpu_grad_sync [--rounds=20]
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
  const int device = dtrain::cuda::set_device_from_local_rank();
  const int rank = dtrain::rank(), size = dtrain::size();
  if (rank == 0) std::printf("# ResNet-50 gradient sync on device, %d rank(s)\n%s\n", size, device_line(device).c_str());
  const auto sizes = resnet50_gradient_sizes();
  std::int64_t total = 0;
  for (auto c : sizes) total += c;
  std::vector<void*> grads;
  std::vector<dtrain::TensorView> views;
  for (auto c : sizes) {
    void* p = nullptr;
    check(cudaMalloc(&p, static_cast<std::size_t>(c) * 4), "cudaMalloc");
    check(cudaMemset(p, 0, static_cast<std::size_t>(c) * 4), "cudaMemset");
    grads.push_back(p);
    views.emplace_back(p, c, dtrain::DataType::float32, dtrain::Device::cuda(device));
  }
  void* flat = nullptr;
  check(cudaMalloc(&flat, static_cast<std::size_t>(total) * 4), "cudaMalloc");
  check(cudaMemset(flat, 0, static_cast<std::size_t>(total) * 4), "cudaMemset");
  ncclComm_t raw = raw_nccl_comm();
  cudaStream_t s = nullptr;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");

  auto timed = [&](auto&& work) {
    MPI_Barrier(MPI_COMM_WORLD);
    const auto t0 = Clock::now();
    work();
    return max_over_ranks(std::chrono::duration<double>(Clock::now() - t0).count());
  };
  Samples samples;
  for (int r = 0; r < rounds + 3; ++r) {
    const bool warm = r < 3;
    auto add = [&](const std::string& n, double t) { if (!warm) samples.add(n, t); };
    add("dtrain, 161 async allreduces", timed([&] {
          std::vector<dtrain::Handle> hs;
          for (std::size_t i = 0; i < views.size(); ++i)
            hs.push_back(dtrain::allreduce_async(views[i], {.name = "grad." + std::to_string(i)}));
          for (auto& h : hs) h.wait();
        }));
    add("dtrain, grouped_allreduce", timed([&] { dtrain::grouped_allreduce(views, {.name = "grads"}); }));
    add("raw NCCL, one flat buffer", timed([&] {
          check(ncclAllReduce(flat, flat, static_cast<std::size_t>(total), ncclFloat32, ncclAvg, raw, s), "ncclAllReduce");
          check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
        }));
    add("raw NCCL, memcpy fused", timed([&] {
          std::int64_t off = 0;
          for (std::size_t i = 0; i < grads.size(); ++i) {
            check(cudaMemcpyAsync(static_cast<float*>(flat) + off, grads[i], static_cast<std::size_t>(sizes[i]) * 4,
                                  cudaMemcpyDeviceToDevice, s), "cudaMemcpyAsync");
            off += sizes[i];
          }
          check(ncclAllReduce(flat, flat, static_cast<std::size_t>(total), ncclFloat32, ncclAvg, raw, s), "ncclAllReduce");
          off = 0;
          for (std::size_t i = 0; i < grads.size(); ++i) {
            check(cudaMemcpyAsync(grads[i], static_cast<float*>(flat) + off, static_cast<std::size_t>(sizes[i]) * 4,
                                  cudaMemcpyDeviceToDevice, s), "cudaMemcpyAsync");
            off += sizes[i];
          }
          check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
        }));
  }
  if (rank == 0) {
    const double lower = samples.get("raw NCCL, one flat buffer").median;
    std::printf("%-32s %12s %12s %14s\n", "strategy", "median", "min", "vs flat NCCL");
    for (const auto& n : samples.names()) {
      const auto sm = samples.get(n);
      std::printf("%-32s %12s %12s %13.2fx\n", n.c_str(), ms(sm.median).c_str(), ms(sm.min).c_str(),
                  sm.median / lower);
    }
    const std::string np = "_np" + std::to_string(size);
    result("grad_sync_resnet50_dtrain_async_ms" + np, samples.get("dtrain, 161 async allreduces").median * 1e3);
    result("grad_sync_resnet50_dtrain_grouped_ms" + np, samples.get("dtrain, grouped_allreduce").median * 1e3);
    result("grad_sync_resnet50_raw_flat_ms" + np, lower * 1e3);
    result("grad_sync_resnet50_raw_memcpy_fused_ms" + np, samples.get("raw NCCL, memcpy fused").median * 1e3);
  }
  const auto stats = dtrain::engine_stats();
  if (rank == 0) std::printf("engine: %llu collectives, %llu fused\n",
                             static_cast<unsigned long long>(stats.collectives),
                             static_cast<unsigned long long>(stats.fused_collectives));
  for (void* p : grads) cudaFree(p);
  cudaFree(flat);
  ncclCommDestroy(raw);
  cudaStreamDestroy(s);
  return 0;
}
