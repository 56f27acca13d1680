#pragma once
// GPU selection and device memory: the public dtrain::cuda::set_device_from_local_rank(), and the
// internal allocator, device guard and buffers the device backends use.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <new>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "dtrain/comm/host_buffer.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/cuda/error.hpp"
#include "dtrain/runtime/session.hpp"

namespace dtrain {
namespace cuda {

// Number of CUDA devices this process can see; 0 when there is none or no usable driver.
inline int device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" state so later calls report their own errors
    return 0;
  }
  return n;
}

inline bool is_available() noexcept { return device_count() > 0; }

// Makes GPU (local_rank % device_count) current on the calling thread and returns its index: the
// usual one-GPU-per-process layout. Call after dtrain::init(), before creating device tensors.
inline int set_device_from_local_rank() {
  const int local = dtrain::local_rank();  // throws NotInitializedError before init()
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    cudaGetLastError();
    throw Error(fmt::format(
        "dtrain::cuda::set_device_from_local_rank(): rank {} (local rank {}) sees no CUDA device "
        "({}). Check that the NVIDIA driver is installed (nvidia-smi), that CUDA_VISIBLE_DEVICES "
        "is not empty for this process, and that the job runs on GPU nodes.",
        dtrain::rank(), local,
        e == cudaSuccess ? std::string("cudaGetDeviceCount reported 0 devices")
                         : std::string(cudaGetErrorString(e))));
  }
  const int device = local % n;
  detail::cuda_check(cudaSetDevice(device),
                     fmt::format("cudaSetDevice({}) for local rank {}", device, local));
  if (dtrain::local_size() > n && local == 0)
    detail::log(LogLevel::warning,
                "dtrain: {} ranks on this host share {} GPU(s); NCCL needs one GPU per rank, so "
                "device tensors will go through pinned host memory over MPI (slower)",
                dtrain::local_size(), n);
  return device;
}

}  // namespace cuda

namespace detail {

// Makes `device` current for a scope and restores the previous device.
class DeviceGuard {
 public:
  // `purpose` names what the device is needed for, in error messages.
  explicit DeviceGuard(int device, std::string_view purpose = {}) {
    auto what = [&](std::string_view call) {
      return purpose.empty() ? std::string(call) : fmt::format("{} for {}", call, purpose);
    };
    cuda_check(cudaGetDevice(&previous_), what("cudaGetDevice"));
    if (previous_ != device)
      cuda_check(cudaSetDevice(device), what(fmt::format("cudaSetDevice({})", device)));
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  ~DeviceGuard() {
    int now = -1;
    if (cudaGetDevice(&now) == cudaSuccess && now != previous_) cudaSetDevice(previous_);
  }

 private:
  int previous_ = 0;
};

// OwnedTensor memory on a GPU (registered as detail::cuda_allocator() by <dtrain/cuda.hpp>).
inline void* cuda_allocate(std::size_t bytes, int device) {
  const std::string what = fmt::format("cudaMalloc of {} bytes on cuda:{}", bytes, device);
  DeviceGuard guard(device, what);
  void* p = nullptr;
  cuda_check(cudaMalloc(&p, bytes == 0 ? 1 : bytes), what);
  return p;
}
inline void cuda_deallocate(void* p, int device) noexcept {
  int previous = -1;
  cudaGetDevice(&previous);
  if (previous != device) cudaSetDevice(device);
  cudaFree(p);
  if (previous >= 0 && previous != device) cudaSetDevice(previous);
}

// Device memory on the current device, in the allocator's 2 MiB granules.
struct DeviceMemory {
  static constexpr std::size_t granule = std::size_t{2} << 20;
  static void* allocate(std::size_t bytes) {
    void* p = nullptr;
    cuda_check(cudaMalloc(&p, bytes), fmt::format("cudaMalloc of a {} byte device buffer", bytes));
    return p;
  }
  static void release(void* p) noexcept { cudaFree(p); }
};

// Page-locked host memory: device copies to and from it run asynchronously at full speed.
struct PinnedMemory {
  static constexpr std::size_t granule = 4096;
  static void* allocate(std::size_t bytes) {
    void* p = nullptr;
    cuda_check(cudaHostAlloc(&p, bytes, cudaHostAllocPortable),
               fmt::format("cudaHostAlloc of a {} byte pinned staging buffer", bytes));
    return p;
  }
  static void release(void* p) noexcept { cudaFreeHost(p); }
};

// Persistent buffers that only grow: fusion and scratch space on the device, staging in pinned
// host memory.
using DeviceBuffer = GrowingBuffer<DeviceMemory>;
using PinnedBuffer = GrowingBuffer<PinnedMemory>;

}  // namespace detail
}  // namespace dtrain
