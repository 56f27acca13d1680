#pragma once
// tensor_traits for torch::Tensor (CPU, and CUDA with a CUDA-enabled libtorch). Tensors must be
// contiguous: dtrain reads and writes their memory directly.
//
// Note [CUDA tensors and streams]
// A CUDA tensor is handed to dtrain with libtorch's current stream of its device, so dtrain's
// collective is ordered after the kernels that produced the tensor and before those queued later
// on that stream (docs/device.md). Reading the current stream needs libc10_cuda, which only a
// CUDA-enabled libtorch has: DTRAIN_TORCH_CUDA says that one is linked. dtrain::torch
// (cmake/dtrainTorch.cmake) defines it for a CUDA libtorch; without the CMake target, define it
// where a program links libtorch_cuda. Without it, CUDA tensors run on the default stream.
#include <torch/torch.h>

#include <fmt/format.h>

#include "dtrain/tensor/traits.hpp"

#if defined(DTRAIN_TORCH_CUDA)
#include <c10/cuda/CUDAStream.h>
#endif

namespace dtrain {
namespace detail {

inline DataType torch_dtype(const torch::Tensor& t) {
  // Asked first by every op: an undefined tensor has no dtype to report.
  if (!t.defined())
    throw InvalidArgumentError("dtrain: an undefined torch::Tensor was passed to a collective");
  switch (t.scalar_type()) {
    case torch::kByte: return DataType::uint8;
    case torch::kChar: return DataType::int8;
    case torch::kInt: return DataType::int32;
    case torch::kLong: return DataType::int64;
    case torch::kHalf: return DataType::float16;
    case torch::kBFloat16: return DataType::bfloat16;
    case torch::kFloat: return DataType::float32;
    case torch::kDouble: return DataType::float64;
    default:
      throw InvalidArgumentError(fmt::format(
          "dtrain: torch dtype {} is not supported (uint8, int8, int32, int64, float16, bfloat16, "
          "float32, float64 are)", std::string(c10::toString(t.scalar_type()))));
  }
}

inline torch::ScalarType torch_scalar_type(DataType d) {
  switch (d) {
    case DataType::uint8: return torch::kByte;
    case DataType::int8: return torch::kChar;
    case DataType::int32: return torch::kInt;
    case DataType::int64: return torch::kLong;
    case DataType::float16: return torch::kHalf;
    case DataType::bfloat16: return torch::kBFloat16;
    case DataType::float32: return torch::kFloat;
    case DataType::float64: return torch::kDouble;
  }
  return torch::kFloat;
}

inline void require_contiguous(const torch::Tensor& t) {
  if (!t.defined())
    throw InvalidArgumentError("dtrain: an undefined torch::Tensor was passed to a collective");
  if (!t.is_contiguous())
    throw InvalidArgumentError(fmt::format(
        "dtrain: a non-contiguous torch::Tensor (sizes {}, strides {}) was passed to a collective: "
        "call .contiguous() first (for in-place ops, copy the result back)",
        fmt::join(t.sizes(), ","), fmt::join(t.strides(), ",")));
}

}  // namespace detail

template <>
struct tensor_traits<torch::Tensor> {
  using output_type = torch::Tensor;
  static const void* data(const torch::Tensor& t) {
    detail::require_contiguous(t);
    return t.data_ptr();
  }
  static void* mutable_data(torch::Tensor& t) {
    detail::require_contiguous(t);
    return t.data_ptr();
  }
  static std::int64_t numel(const torch::Tensor& t) { return t.defined() ? t.numel() : 0; }
  static DataType dtype(const torch::Tensor& t) { return detail::torch_dtype(t); }
  static Device device(const torch::Tensor& t) {
    return t.is_cuda() ? Device::cuda(t.get_device()) : Device::cpu();
  }
  static Shape shape(const torch::Tensor& t) {
    Shape s(t.sizes().begin(), t.sizes().end());
    if (s.empty()) s.push_back(1);  // a 0-d tensor travels as one element
    return s;
  }
  // Note [CUDA tensors and streams]
  static void* stream([[maybe_unused]] const torch::Tensor& t) {
#if defined(DTRAIN_TORCH_CUDA)
    if (t.is_cuda()) return c10::cuda::getCurrentCUDAStream(t.get_device()).stream();
#endif
    return nullptr;
  }
  static output_type make_output(const torch::Tensor& like, const Shape& s) {
    return torch::empty(std::vector<std::int64_t>(s.begin(), s.end()), like.options());
  }
  static void* output_data(output_type& o) { return o.data_ptr(); }
};

}  // namespace dtrain
