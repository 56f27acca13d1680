// Fusion-buffer pack/unpack kernels vs cudaMemcpy device-to-device, in the same run.
//
// Workloads: ResNet-50's 161 gradients (102 MB) packed into / unpacked from one buffer, with and
// without a prescale, and one 256 MiB tensor. Baselines: one cudaMemcpyAsync of the same total
// bytes between two contiguous buffers (the copy engine's ceiling for this much data) and one
// cudaMemcpyAsync per tensor (what packing without a batched kernel costs).
// Usage: bench_gpu_pack [--rounds=30]
#include <cuda_runtime.h>

#include <cstdio>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "dtrain/cuda.hpp"
#include "gpu_bench_common.hpp"

using namespace gpu_bench;

int main(int argc, char** argv) {
  if (dtrain::cuda::device_count() == 0) {
    std::printf("no CUDA device: skipped\n");
    return 0;
  }
  const int rounds = std::stoi(arg(argc, argv, "rounds", "30"));
  const int device = 0;
  check(cudaSetDevice(device), "cudaSetDevice");
  std::printf("# pack/unpack bandwidth\n%s\n", device_line(device).c_str());
  const auto& kernels = dtrain::detail::KernelLibrary::instance().for_device(device);

  cudaStream_t s = nullptr;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  cudaEvent_t t0, t1;
  check(cudaEventCreate(&t0), "cudaEventCreate");
  check(cudaEventCreate(&t1), "cudaEventCreate");
  auto time_it = [&](auto&& work) {
    check(cudaEventRecord(t0, s), "cudaEventRecord");
    work();
    check(cudaEventRecord(t1, s), "cudaEventRecord");
    check(cudaEventSynchronize(t1), "cudaEventSynchronize");
    float msec = 0;
    check(cudaEventElapsedTime(&msec, t0, t1), "cudaEventElapsedTime");
    return msec * 1e-3;
  };

  struct Workload {
    std::string name;
    std::vector<std::int64_t> counts;  // float32 elements per tensor
  };
  const std::vector<Workload> workloads = {{"resnet50", resnet50_gradient_sizes()},
                                           {"single_256MiB", {std::int64_t(64) << 20}}};
  for (const auto& w : workloads) {
    std::int64_t total = 0;
    for (auto c : w.counts) total += c;
    const std::size_t bytes = static_cast<std::size_t>(total) * sizeof(float);
    // Tensors live in separate allocations, as gradients do.
    std::vector<void*> tensors;
    for (auto c : w.counts) {
      void* p = nullptr;
      check(cudaMalloc(&p, static_cast<std::size_t>(c) * sizeof(float)), "cudaMalloc");
      check(cudaMemset(p, 1, static_cast<std::size_t>(c) * sizeof(float)), "cudaMemset");
      tensors.push_back(p);
    }
    void *fusion = nullptr, *contiguous = nullptr;
    check(cudaMalloc(&fusion, bytes), "cudaMalloc");
    check(cudaMalloc(&contiguous, bytes), "cudaMalloc");
    check(cudaMemset(contiguous, 1, bytes), "cudaMemset");
    const dtrain::detail::FusedLayout layout = dtrain::detail::plan_fused_layout(w.counts);
    const auto pack = dtrain::detail::fused_segments(layout, w.counts, tensors, fusion, sizeof(float), dtrain::detail::CopyDirection::pack);
    const auto unpack = dtrain::detail::fused_segments(layout, w.counts, tensors, fusion, sizeof(float), dtrain::detail::CopyDirection::unpack);

    Samples samples;
    for (int r = 0; r < rounds + 2; ++r) {
      const bool warm = r < 2;
      auto add = [&](const std::string& n, double t) { if (!warm) samples.add(n, t); };
      add("memcpy D2D, one call", time_it([&] {
            check(cudaMemcpyAsync(fusion, contiguous, bytes, cudaMemcpyDeviceToDevice, s), "cudaMemcpyAsync");
          }));
      add("pack kernel", time_it([&] {
            dtrain::detail::batched_copy(kernels, pack, dtrain::DataType::float32, 1.0, s);
          }));
      add("pack kernel, prescale", time_it([&] {
            dtrain::detail::batched_copy(kernels, pack, dtrain::DataType::float32, 0.5, s);
          }));
      add("unpack kernel, postscale", time_it([&] {
            dtrain::detail::batched_copy(kernels, unpack, dtrain::DataType::float32, 2.0, s);
          }));
      add("memcpy D2D per tensor", time_it([&] {
            for (const auto& seg : pack)
              check(cudaMemcpyAsync(seg.dst, seg.src, static_cast<std::size_t>(seg.count) * sizeof(float),
                                    cudaMemcpyDeviceToDevice, s), "cudaMemcpyAsync");
          }));
    }
    const double base = samples.get("memcpy D2D, one call").median;
    std::printf("\n## %s: %zu tensors, %.1f MB (float32)\n", w.name.c_str(), w.counts.size(), bytes / 1e6);
    std::printf("%-28s %12s %12s %12s %10s\n", "strategy", "median", "min", "GB/s (med)", "vs memcpy");
    for (const auto& n : samples.names()) {
      const auto sm = samples.get(n);
      std::printf("%-28s %12s %12s %12.1f %9.2fx\n", n.c_str(), ms(sm.median).c_str(), ms(sm.min).c_str(),
                  gbps(static_cast<double>(bytes), sm.median), base / sm.median);
    }
    result("pack_" + w.name + "_vs_memcpy", base / samples.get("pack kernel").median);
    result("pack_prescale_" + w.name + "_vs_memcpy", base / samples.get("pack kernel, prescale").median);
    result("unpack_postscale_" + w.name + "_vs_memcpy", base / samples.get("unpack kernel, postscale").median);
    result("pack_" + w.name + "_GBps", gbps(static_cast<double>(bytes), samples.get("pack kernel").median));
    result("memcpy_" + w.name + "_GBps", gbps(static_cast<double>(bytes), base));
    for (void* p : tensors) cudaFree(p);
    cudaFree(fusion);
    cudaFree(contiguous);
  }
  cudaEventDestroy(t0);
  cudaEventDestroy(t1);
  cudaStreamDestroy(s);
  return 0;
}
