#pragma once
// Gradient compression on the device: float32 -> float16/bfloat16 before communication and back
// after, optionally scaled (e.g. by 1/world_size). Many tensors go in one kernel launch.
//
// Stream semantics: every function enqueues its kernels on `stream` (null: the legacy default
// stream) of the calling thread's current device and returns without waiting. The host waits for
// nothing; the device runs the conversion after the work already queued on `stream`, and work
// queued on `stream` afterwards sees the result. Values round to nearest even; NaN stays NaN.
#include <cuda_runtime.h>

#include <cstdint>
#include <span>
#include <vector>

#include "dtrain/cuda/device.hpp"
#include "dtrain/cuda/error.hpp"
#include "dtrain/cuda/kernels.hpp"

namespace dtrain {
namespace cuda {

// One tensor to convert: `count` elements from `src` to `dst` (both on the current device).
struct ConvertItem {
  const void* src = nullptr;
  void* dst = nullptr;
  std::int64_t count = 0;
};

}  // namespace cuda

namespace detail {
inline const DeviceKernels& current_device_kernels() {
  int device = 0;
  cuda_check(cudaGetDevice(&device), "cudaGetDevice");
  return KernelLibrary::instance().for_device(device);
}
inline std::vector<CopySegment> to_segments(std::span<const cuda::ConvertItem> items) {
  std::vector<CopySegment> out;
  out.reserve(items.size());
  for (const auto& i : items) out.push_back({i.src, i.dst, i.count});
  return out;
}
}  // namespace detail

namespace cuda {

// float32 sources -> `to` (DataType::float16 or DataType::bfloat16) destinations, each value
// multiplied by `scale` first.
inline void compress(std::span<const ConvertItem> items, DataType to, cudaStream_t stream = nullptr,
                     double scale = 1.0) {
  dtrain::detail::batched_convert(dtrain::detail::current_device_kernels(),
                                  dtrain::detail::to_segments(items), to,
                                  dtrain::detail::Conversion::narrow, scale, stream);
}

// `from` (float16 or bfloat16) sources -> float32 destinations, each value multiplied by `scale`.
inline void decompress(std::span<const ConvertItem> items, DataType from,
                       cudaStream_t stream = nullptr, double scale = 1.0) {
  dtrain::detail::batched_convert(dtrain::detail::current_device_kernels(),
                                  dtrain::detail::to_segments(items), from,
                                  dtrain::detail::Conversion::widen, scale, stream);
}

inline void compress(const float* src, void* dst, std::int64_t n, DataType to,
                     cudaStream_t stream = nullptr, double scale = 1.0) {
  const ConvertItem item{src, dst, n};
  compress(std::span<const ConvertItem>(&item, 1), to, stream, scale);
}

inline void decompress(const void* src, DataType from, float* dst, std::int64_t n,
                       cudaStream_t stream = nullptr, double scale = 1.0) {
  const ConvertItem item{src, dst, n};
  decompress(std::span<const ConvertItem>(&item, 1), from, stream, scale);
}

}  // namespace cuda

namespace detail {

// The DeviceConverter <dtrain/cuda.hpp> registers (runtime/device_registry.hpp): float32 to a
// 16-bit type or back, on `device`.
inline void convert_on_device(const void* src, DataType from, void* dst, DataType to,
                              std::int64_t n, int device, void* stream) {
  DeviceGuard guard(device, "gradient compression");
  const cuda::ConvertItem item{src, dst, n};
  const auto s = static_cast<cudaStream_t>(stream);
  if (from == DataType::float32)
    cuda::compress(std::span<const cuda::ConvertItem>(&item, 1), to, s);
  else
    cuda::decompress(std::span<const cuda::ConvertItem>(&item, 1), from, s);
}

}  // namespace detail
}  // namespace dtrain
