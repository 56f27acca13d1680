#pragma once
// Where the opt-in device path registers itself: <dtrain/cuda.hpp> sets the factory during static
// initialization, so that including it anywhere in a program enables device tensors everywhere.
// Light on purpose: the public collectives ask it whether device tensors can be accepted.
#include <cstdint>
#include <memory>

#include "dtrain/tensor/dtype.hpp"

namespace dtrain::detail {

class Backend;
struct BackendContext;

using DeviceBackendFactory = std::unique_ptr<Backend> (*)(const BackendContext&);

inline DeviceBackendFactory& device_backend_factory() noexcept {
  static DeviceBackendFactory f = nullptr;
  return f;
}

// Converts `n` elements between float32 and a 16-bit type on CUDA device `device`, enqueued on
// `stream` (a cudaStream_t; null: the legacy default stream). Set by <dtrain/cuda.hpp>; the
// compression hook uses it for gradients on the device.
using DeviceConverter = void (*)(const void* src, DataType from, void* dst, DataType to,
                                 std::int64_t n, int device, void* stream);

inline DeviceConverter& device_converter() noexcept {
  static DeviceConverter f = nullptr;
  return f;
}

}  // namespace dtrain::detail
