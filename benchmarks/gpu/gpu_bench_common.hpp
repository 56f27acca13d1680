#pragma once
// Shared helpers for the device benchmarks: samples and statistics, nccl-tests units, ResNet-50's
// gradient shapes, a plain NCCL communicator for the raw baselines, and result lines.
//
// Method: strategies are interleaved round by round inside one run and reported as median and
// minimum, and every ratio is taken against a baseline measured in the same run. Each benchmark
// prints a table for people and "RESULT <key> <value>" lines that tests/gpu/run_device_checks.sh
// collects.
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>

namespace gpu_bench {

using Clock = std::chrono::steady_clock;

inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s failed: %s\n", what, cudaGetErrorString(e));
    std::exit(2);
  }
}
inline void check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) {
    std::fprintf(stderr, "%s failed: %s\n", what, ncclGetErrorString(r));
    std::exit(2);
  }
}

struct Summary {
  double median = 0, min = 0;
};
inline Summary summarize(std::vector<double> v) {
  Summary s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  s.min = v.front();
  s.median = v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
  return s;
}

class Samples {
 public:
  void add(const std::string& name, double secs) {
    if (!data_.count(name)) order_.push_back(name);
    data_[name].push_back(secs);
  }
  Summary get(const std::string& name) const {
    auto it = data_.find(name);
    return it == data_.end() ? Summary{} : summarize(it->second);
  }
  const std::vector<std::string>& names() const { return order_; }

 private:
  std::map<std::string, std::vector<double>> data_;
  std::vector<std::string> order_;
};

inline double gbps(double bytes, double secs) { return secs > 0 ? bytes / secs / 1e9 : 0; }
// nccl-tests: busbw = algbw * 2(n-1)/n for allreduce (0 at one rank, where nothing crosses a link).
inline double allreduce_busbw(double bytes, double secs, int n) {
  return gbps(bytes, secs) * 2.0 * (n - 1) / n;
}

inline std::string human_bytes(std::int64_t b) {
  if (b >= (1 << 20) && b % (1 << 20) == 0) return fmt::format("{} MiB", b >> 20);
  if (b >= (1 << 10) && b % (1 << 10) == 0) return fmt::format("{} KiB", b >> 10);
  return fmt::format("{} B", b);
}
inline std::string ms(double secs) { return fmt::format("{:.3f} ms", secs * 1e3); }

inline void result(const std::string& key, double value) {
  std::printf("RESULT %s %.6g\n", key.c_str(), value);
  std::fflush(stdout);
}

inline std::string device_line(int device) {
  cudaDeviceProp p{};
  cudaGetDeviceProperties(&p, device);
  int nccl = 0;
  ncclGetVersion(&nccl);
  int rt = 0, drv = 0;
  cudaRuntimeGetVersion(&rt);
  cudaDriverGetVersion(&drv);
  return fmt::format("device: {} (sm_{}{}, {:.0f} GiB), CUDA runtime {}, driver {}, NCCL {}",
                     p.name, p.major, p.minor, static_cast<double>(p.totalGlobalMem) / (1 << 30),
                     rt, drv, nccl);
}

// ResNet-50's 161 parameter shapes (torchvision), in the order backward produces the gradients.
inline std::vector<std::int64_t> resnet50_gradient_sizes() {
  std::vector<std::int64_t> p;
  auto conv = [&](std::int64_t out, std::int64_t in, std::int64_t k) { p.push_back(out * in * k * k); };
  auto bn = [&](std::int64_t c) {
    p.push_back(c);
    p.push_back(c);
  };
  conv(64, 3, 7);
  bn(64);
  std::int64_t in = 64;
  const int blocks[] = {3, 4, 6, 3};
  for (int layer = 0; layer < 4; ++layer) {
    const std::int64_t width = 64 << layer;
    for (int b = 0; b < blocks[layer]; ++b) {
      conv(width, in, 1);
      bn(width);
      conv(width, width, 3);
      bn(width);
      conv(width * 4, width, 1);
      bn(width * 4);
      if (b == 0) {
        conv(width * 4, in, 1);
        bn(width * 4);
      }
      in = width * 4;
    }
  }
  p.push_back(1000 * in);
  p.push_back(1000);
  std::reverse(p.begin(), p.end());
  std::int64_t total = 0;
  for (auto x : p) total += x;
  if (p.size() != 161 || total != 25557032) {
    std::fprintf(stderr, "ResNet-50 shape list is wrong: %zu tensors, %lld values\n", p.size(),
                 static_cast<long long>(total));
    std::exit(2);
  }
  return p;
}

// A blocking NCCL communicator over MPI_COMM_WORLD for the raw baselines.
inline ncclComm_t raw_nccl_comm() {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  ncclUniqueId id{};
  if (rank == 0) check(ncclGetUniqueId(&id), "ncclGetUniqueId");
  MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclComm_t comm = nullptr;
  check(ncclCommInitRank(&comm, size, id, rank), "ncclCommInitRank");
  return comm;
}

inline double max_over_ranks(double v) {
  double out = v;
  MPI_Allreduce(&v, &out, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return out;
}

inline std::string arg(int argc, char** argv, const std::string& key, const std::string& fallback) {
  const std::string prefix = "--" + key + "=";
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]).rfind(prefix, 0) == 0) return std::string(argv[i]).substr(prefix.size());
  return fallback;
}

}  // namespace gpu_bench
