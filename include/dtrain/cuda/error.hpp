#pragma once
// CUDA runtime and NCCL failures as dtrain errors whose messages say what failed, the library's
// own description, and the usual cause.
#include <cuda_runtime.h>
#include <nccl.h>

#include <string>
#include <string_view>

#include <fmt/format.h>

#include "dtrain/core/error.hpp"

namespace dtrain::detail {

inline std::string_view cuda_error_hint(cudaError_t e) noexcept {
  switch (e) {
    case cudaErrorNoDevice:
      return "no CUDA device is visible to this process: check nvidia-smi and "
             "CUDA_VISIBLE_DEVICES";
    case cudaErrorInsufficientDriver:
      return "the NVIDIA driver is missing or older than the CUDA runtime this program was built "
             "with: install or update the driver, or build with an older CUDA toolkit";
    case cudaErrorInvalidDevice:
      return "the device index is out of range: the tensor names a GPU this process cannot see "
             "(check CUDA_VISIBLE_DEVICES and dtrain::cuda::set_device_from_local_rank())";
    case cudaErrorMemoryAllocation:
      return "the GPU is out of memory: reduce the batch size or DTRAIN_FUSION_THRESHOLD";
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
      return "a kernel touched invalid memory: a tensor was freed or resized while its op was in "
             "flight, or a pointer does not belong to the device the tensor names";
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorUnsupportedPtxVersion:
    case cudaErrorJitCompilerNotFound:
      return "the driver cannot load kernels built by this CUDA toolkit: update the driver";
    default:
      return {};
  }
}

inline std::string cuda_error_message(cudaError_t e, std::string_view what) {
  const std::string_view hint = cuda_error_hint(e);
  return fmt::format("dtrain: {} failed: {} ({}){}{}", what, cudaGetErrorString(e),
                     cudaGetErrorName(e), hint.empty() ? "" : ". Likely cause: ", hint);
}

inline void cuda_check(cudaError_t e, std::string_view what) {
  if (e != cudaSuccess) throw CommunicationError(cuda_error_message(e, what));
}

inline std::string_view nccl_error_hint(ncclResult_t r) noexcept {
  switch (r) {
    case ncclUnhandledCudaError:
      return "a CUDA call inside NCCL failed: GPU out of memory, a driver/runtime mismatch, or "
             "an earlier kernel fault";
    case ncclSystemError:
      return "a system call failed: often /dev/shm is too small (containers: --shm-size=1g or "
             "more), or a socket/InfiniBand device is unreachable (see NCCL_SOCKET_IFNAME, "
             "NCCL_IB_DISABLE; rerun with NCCL_DEBUG=WARN)";
    case ncclInternalError:
      return "NCCL hit an internal error: rerun with NCCL_DEBUG=INFO to see where";
    case ncclInvalidArgument:
      return "an argument was rejected: two ranks may be using the same GPU (NCCL needs one GPU "
             "per rank; call dtrain::cuda::set_device_from_local_rank() after dtrain::init())";
    case ncclInvalidUsage:
      return "NCCL was called in an invalid order or with mismatched collectives across ranks";
    case ncclRemoteError:
      return "a peer rank failed or the network connection to it broke";
    default:
      return {};
  }
}

// `detail` is ncclGetLastError() text when a communicator is at hand.
inline std::string nccl_error_message(ncclResult_t r, std::string_view what,
                                      std::string_view detail = {}) {
  const std::string_view hint = nccl_error_hint(r);
  return fmt::format("dtrain: {} failed: {}{}{}{}{}", what, ncclGetErrorString(r),
                     detail.empty() ? "" : " (", detail, detail.empty() ? "" : ")",
                     hint.empty() ? std::string() : fmt::format(". Likely cause: {}", hint));
}

}  // namespace dtrain::detail
