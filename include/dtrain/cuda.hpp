#pragma once
// dtrain's CUDA/NCCL device path (link dtrain::cuda). Including this header anywhere in the
// program enables device tensors (Device::cuda(i)) in every collective: it registers the device
// backend with the engine, the allocator for device outputs (OwnedTensor), and the NCCL version
// reported by dtrain::build_info(). See docs/device.md for the stream semantics.
//
// Public API added here:
//   dtrain::cuda::device_count(), is_available(), set_device_from_local_rank()
//   dtrain::cuda::set_transport(Transport), active_transport()
//   dtrain::cuda::compress(...), decompress(...)   float32 <-> float16/bfloat16 on the device
#include "dtrain/cuda/backend.hpp"
#include "dtrain/cuda/compression.hpp"
#include "dtrain/cuda/device.hpp"
#include "dtrain/cuda/nccl_comm.hpp"
#include "dtrain/dtrain.hpp"

namespace dtrain::detail {

inline bool register_cuda_support() noexcept {
  device_backend_factory() = &make_cuda_backend;
  cuda_allocator() = DeviceAllocator{&cuda_allocate, &cuda_deallocate};
  device_converter() = &convert_on_device;
  nccl_version_provider() = [] { return nccl_version_string(); };
  return true;
}

// Runs during static initialization of any program that includes this header.
inline const bool cuda_support_registered = register_cuda_support();

}  // namespace dtrain::detail
