#pragma once
// Helpers for the GPU tests: skipping without a device, device buffers, host references.
#include <cuda_runtime.h>
#include <mpi.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <vector>

#include <doctest/doctest.h>

#include "dtrain/cuda.hpp"
#include "support/skip.hpp"

namespace gpu_test {

// True when the test can use a GPU. Otherwise prints "no CUDA device: skipped" once per process,
// marks the binary skipped (ctest then reports it skipped, not passed: support/skip.hpp) and the
// caller returns without checking anything.
inline bool have_device(int needed = 1) {
  const int n = dtrain::cuda::device_count();
  if (n >= needed) return true;
  dtrain_test_support::mark_skipped();
  static std::once_flag once;
  std::call_once(once, [&] {
    int rank = 0, initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 0) {
      if (n == 0) std::printf("no CUDA device: skipped\n");
      else std::printf("only %d CUDA device(s), %d needed: skipped\n", n, needed);
      std::fflush(stdout);
    }
  });
  return false;
}

inline void check_cuda(cudaError_t e) {
  if (e != cudaSuccess) FAIL(cudaGetErrorString(e));
}

// Device memory holding a copy of host bytes.
class DeviceBytes {
 public:
  DeviceBytes() = default;
  explicit DeviceBytes(std::size_t bytes) : size_(bytes) {
    check_cuda(cudaMalloc(&ptr_, bytes == 0 ? 1 : bytes));
    check_cuda(cudaMemset(ptr_, 0xEE, bytes == 0 ? 1 : bytes));
  }
  template <class T>
  explicit DeviceBytes(const std::vector<T>& host) : DeviceBytes(host.size() * sizeof(T)) {
    if (!host.empty())
      check_cuda(cudaMemcpy(ptr_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
  DeviceBytes(DeviceBytes&& o) noexcept : ptr_(o.ptr_), size_(o.size_) { o.ptr_ = nullptr; }
  ~DeviceBytes() {
    if (ptr_) cudaFree(ptr_);
  }
  void* get() const noexcept { return ptr_; }
  template <class T>
  std::vector<T> to_host(std::size_t count) const {
    std::vector<T> out(count);
    if (count) check_cuda(cudaMemcpy(out.data(), ptr_, count * sizeof(T), cudaMemcpyDeviceToHost));
    return out;
  }

 private:
  void* ptr_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace gpu_test
