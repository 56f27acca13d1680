#pragma once
// Gradient compression: float32/float64 gradients travel as float16 or bfloat16 and are widened
// back after the reduction. Halves the bytes on the wire at the cost of 16-bit precision (about 3
// significant decimal digits for float16, 2 for bfloat16; bfloat16 keeps float32's range).
#include <cstdint>
#include <vector>

#include <fmt/format.h>

#include "dtrain/runtime/collectives.hpp"

namespace dtrain {

enum class Compression : std::uint8_t { none, fp16, bf16 };

namespace detail {

template <class From>
void compress(const From* src, std::uint16_t* dst, std::int64_t n, Compression c) {
  if (c == Compression::fp16)
    for (std::int64_t i = 0; i < n; ++i) dst[i] = float_to_half(static_cast<float>(src[i]));
  else
    for (std::int64_t i = 0; i < n; ++i) dst[i] = float_to_bf16(static_cast<float>(src[i]));
}
template <class To>
void decompress(const std::uint16_t* src, To* dst, std::int64_t n, Compression c) {
  if (c == Compression::fp16)
    for (std::int64_t i = 0; i < n; ++i) dst[i] = static_cast<To>(half_to_float(src[i]));
  else
    for (std::int64_t i = 0; i < n; ++i) dst[i] = static_cast<To>(bf16_to_float(src[i]));
}

// Allreduces a group of gradients, compressing host float32/float64 ones into persistent 16-bit
// buffers (allocated once, reused every step). Other gradients travel as they are.
class GradientCompressor {
 public:
  void allreduce(std::vector<TensorView>& grads, const AllreduceOptions& options, Compression c) {
    if (c == Compression::none) {
      grouped_allreduce(grads, options);
      return;
    }
    const DataType wire = c == Compression::fp16 ? DataType::float16 : DataType::bfloat16;
    if (buffers_.size() < grads.size()) buffers_.resize(grads.size());
    std::vector<TensorView> sent = grads;
    for (std::size_t i = 0; i < grads.size(); ++i) {
      const TensorView& g = grads[i];
      if (!compressible(g)) continue;
      if (g.device.is_cuda())
        throw InvalidArgumentError(fmt::format(
            "dtrain: gradient compression of CUDA tensors needs <dtrain/torch.hpp> (libtorch "
            "tensors are compressed on the device); gradient #{} is a plain device buffer", i));
      auto& b = buffers_[i];
      b.resize(static_cast<std::size_t>(g.numel));
      if (g.dtype == DataType::float32)
        compress(static_cast<const float*>(g.data), b.data(), g.numel, c);
      else
        compress(static_cast<const double*>(g.data), b.data(), g.numel, c);
      sent[i] = TensorView(b.data(), g.numel, wire, g.device, g.shape);
    }
    grouped_allreduce(sent, options);
    for (std::size_t i = 0; i < grads.size(); ++i) {
      const TensorView& g = grads[i];
      if (!compressible(g)) continue;
      if (g.dtype == DataType::float32)
        decompress(buffers_[i].data(), static_cast<float*>(g.data), g.numel, c);
      else
        decompress(buffers_[i].data(), static_cast<double*>(g.data), g.numel, c);
    }
  }

 private:
  static bool compressible(const TensorView& g) {
    return g.dtype == DataType::float32 || g.dtype == DataType::float64;
  }
  std::vector<std::vector<std::uint16_t>> buffers_;
};

}  // namespace detail
}  // namespace dtrain
