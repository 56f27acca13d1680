#pragma once
// Loading and launching the run-time compiled kernels.
//
// Note [Loading kernels]
// The kernel source is compiled with NVRTC once per process and GPU architecture (a cubin for the
// device's exact architecture, or PTX when the GPU is newer than the toolkit) and loaded with the
// runtime's library API (cudaLibraryLoadData, cudaLibraryGetKernel). A cudaKernel_t is valid on
// every device and launches through cudaLaunchKernel. Using the runtime rather than the driver API
// (cuModuleLoadData) keeps libcuda.so.1 out of the program's link dependencies, so a binary built
// with dtrain::cuda still starts, and reports "no device", on a machine without the NVIDIA driver.
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cstdint>
#include <map>
#include <mutex>
#include <span>
#include <vector>

#include <fmt/format.h>

#include "dtrain/cuda/copy_plan.hpp"
#include "dtrain/cuda/error.hpp"
#include "dtrain/cuda/kernel_source.hpp"
#include "dtrain/cuda/nvrtc.hpp"
#include "dtrain/tensor/dtype.hpp"

namespace dtrain::detail {

// The kernels of one architecture, as cudaKernel_t handles cast for cudaLaunchKernel.
struct DeviceKernels {
  std::array<const void*, kernel_names.size()> fn{};
  int arch = 0;
  const void* operator[](KernelId id) const noexcept { return fn[static_cast<int>(id)]; }
};

class KernelLibrary {
 public:
  // Process-wide; never destroyed, so no unload runs after the CUDA runtime has shut down.
  static KernelLibrary& instance() {
    static KernelLibrary* lib = new KernelLibrary();
    return *lib;
  }

  // Kernels for `device`, compiled and loaded on first use of its architecture. Thread-safe.
  const DeviceKernels& for_device(int device) {
    std::lock_guard lock(mutex_);
    auto known = arch_of_device_.find(device);
    int arch = 0;
    if (known != arch_of_device_.end()) {
      arch = known->second;
    } else {
      int major = 0, minor = 0;
      cuda_check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device),
                 "cudaDeviceGetAttribute(compute capability)");
      cuda_check(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device),
                 "cudaDeviceGetAttribute(compute capability)");
      arch = major * 10 + minor;
      arch_of_device_[device] = arch;
    }
    auto it = loaded_.find(arch);
    if (it != loaded_.end()) return it->second;
    return loaded_.emplace(arch, load(arch)).first->second;
  }

 private:
  KernelLibrary() = default;

  static DeviceKernels load(int device_arch) {
    int target = 0;
    const KernelImageKind kind = choose_image_kind(device_arch, nvrtc_supported_archs(), target);
    const KernelImage image = compile_kernels(kernel_source, target, kind);
    cudaLibrary_t library = nullptr;
    cuda_check(cudaLibraryLoadData(&library, image.data.data(), nullptr, nullptr, 0, nullptr,
                                   nullptr, 0),
               fmt::format("loading dtrain's device kernels ({} for {}_{})",
                           kind == KernelImageKind::cubin ? "cubin" : "PTX",
                           kind == KernelImageKind::cubin ? "sm" : "compute", target));
    DeviceKernels k;
    k.arch = device_arch;
    for (std::size_t i = 0; i < kernel_names.size(); ++i) {
      cudaKernel_t handle = nullptr;
      cuda_check(cudaLibraryGetKernel(&handle, library, kernel_names[i]),
                 fmt::format("cudaLibraryGetKernel({})", kernel_names[i]));
      k.fn[i] = reinterpret_cast<const void*>(handle);
    }
    return k;
  }

  std::mutex mutex_;
  std::map<int, int> arch_of_device_;
  std::map<int, DeviceKernels> loaded_;
};

inline void launch_copy_batches(const void* kernel, std::span<const DeviceCopyBatch> batches,
                                cudaStream_t stream, const char* what) {
  for (const DeviceCopyBatch& b : batches) {
    if (b.blocks == 0) continue;
    const dim3 grid(static_cast<unsigned>(std::min<std::int64_t>(b.blocks, INT_MAX)));
    const dim3 block(kCopyThreads);
    void* args[] = {const_cast<DeviceCopyBatch*>(&b)};  // copied at launch
    cuda_check(cudaLaunchKernel(kernel, grid, block, args, 0, stream), what);
  }
}

// Copies every segment (elements of `dtype`; a null source writes zeros), multiplying by `scale`.
// Integer data and scale 1 move as bytes. Stream-ordered on `stream`; returns at once.
inline void batched_copy(const DeviceKernels& k, std::span<const CopySegment> segments,
                         DataType dtype, double scale, cudaStream_t stream) {
  const std::size_t es = element_size(dtype);
  if (scale == 1.0 || !is_floating_point(dtype)) {
    std::vector<CopySegment> bytes(segments.begin(), segments.end());
    for (auto& s : bytes) s.count *= static_cast<std::int64_t>(es);
    launch_copy_batches(k[KernelId::copy_raw],
                        plan_copy_batches(bytes, static_cast<std::int32_t>(kCopyBytesPerBlock)),
                        stream, "launching dtrain's copy kernel");
    return;
  }
  KernelId id = KernelId::scale_f32;
  switch (dtype) {
    case DataType::float64: id = KernelId::scale_f64; break;
    case DataType::float16: id = KernelId::scale_f16; break;
    case DataType::bfloat16: id = KernelId::scale_bf16; break;
    default: break;
  }
  launch_copy_batches(k[id], plan_copy_batches(segments, copy_elems_per_block(es), scale), stream,
                      "launching dtrain's scaled copy kernel");
}

enum class Conversion : std::uint8_t {
  narrow,  // float32 -> float16/bfloat16
  widen,   // float16/bfloat16 -> float32
};

// float32 <-> float16/bfloat16 conversions of every segment, scaled by `scale` in float32.
inline void batched_convert(const DeviceKernels& k, std::span<const CopySegment> segments,
                            DataType half_type, Conversion conversion, double scale,
                            cudaStream_t stream) {
  const bool narrow = conversion == Conversion::narrow;
  if (half_type != DataType::float16 && half_type != DataType::bfloat16)
    throw InvalidArgumentError(fmt::format(
        "dtrain: gradient compression converts float32 to float16 or bfloat16, not {}",
        half_type));
  for (const auto& s : segments)
    if (s.count > 0 && (!s.src || !s.dst))
      throw InvalidArgumentError("dtrain: compression: a null source or destination pointer");
  const KernelId id = half_type == DataType::float16
                          ? (narrow ? KernelId::narrow_f16 : KernelId::widen_f16)
                          : (narrow ? KernelId::narrow_bf16 : KernelId::widen_bf16);
  launch_copy_batches(k[id], plan_copy_batches(segments, copy_elems_per_block(4), scale), stream,
                      "launching dtrain's compression kernel");
}

}  // namespace dtrain::detail
