#pragma once
// TensorView: a non-owning description of memory (pointer, count, dtype, device, shape, stream)
// for callers whose tensors are not one of the built-in types. OwnedTensor: the owning result of
// ops that produce new tensors (allgather, alltoall, reducescatter) from TensorView inputs.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <utility>

#include "dtrain/tensor/traits.hpp"

namespace dtrain {

struct TensorView {
  void* data = nullptr;
  std::int64_t numel = 0;
  DataType dtype = DataType::float32;
  Device device = Device::cpu();
  Shape shape;            // empty means 1-D: {numel}
  void* stream = nullptr; // CUDA stream that produced the data (cudaStream_t), if any

  TensorView() = default;
  TensorView(void* data, std::int64_t numel, DataType dtype, Device device = Device::cpu(),
             Shape shape = {}, void* stream = nullptr)
      : data(data), numel(numel), dtype(dtype), device(device), shape(std::move(shape)),
        stream(stream) {}
  template <class A>
    requires Element<A>
  TensorView(A* ptr, std::int64_t n) : TensorView(ptr, n, dtype_of<A>) {}

  std::int64_t nbytes() const noexcept {
    return numel * static_cast<std::int64_t>(element_size(dtype));
  }
};

// Allocators for OwnedTensor memory, one per device type. The CUDA header installs its own.
struct DeviceAllocator {
  void* (*allocate)(std::size_t bytes, int device_index) = nullptr;
  void (*deallocate)(void* ptr, int device_index) noexcept = nullptr;
};

namespace detail {
inline void* host_allocate(std::size_t bytes, int) {
  // 64-byte alignment keeps vectorized reduction loops on aligned data.
  std::size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
  if (!p) throw std::bad_alloc();
  return p;
}
inline void host_deallocate(void* p, int) noexcept { std::free(p); }
inline DeviceAllocator& cuda_allocator() noexcept {
  static DeviceAllocator allocator;
  return allocator;
}
}  // namespace detail

// Move-only owning tensor; a moved-from OwnedTensor is empty.
class OwnedTensor {
 public:
  OwnedTensor() = default;
  OwnedTensor(DataType dtype, Shape shape, Device device = Device::cpu())
      : dtype_(dtype), device_(device), shape_(std::move(shape)) {
    numel_ = detail::numel(shape_);
    std::size_t bytes = static_cast<std::size_t>(numel_) * element_size(dtype_);
    if (device_.is_cpu()) {
      data_ = detail::host_allocate(bytes, -1);
      std::memset(data_, 0, bytes);
    } else {
      auto& a = detail::cuda_allocator();
      if (!a.allocate)
        throw InvalidArgumentError(
            "dtrain: cannot allocate an output tensor on " + to_string(device_) +
            ": include <dtrain/cuda.hpp> and link dtrain::cuda to enable device tensors");
      data_ = a.allocate(bytes, device_.index);
    }
  }
  OwnedTensor(OwnedTensor&& o) noexcept { swap(o); }
  OwnedTensor& operator=(OwnedTensor&& o) noexcept {
    OwnedTensor tmp(std::move(o));
    swap(tmp);
    return *this;
  }
  OwnedTensor(const OwnedTensor&) = delete;
  OwnedTensor& operator=(const OwnedTensor&) = delete;
  ~OwnedTensor() { reset(); }

  void* data() noexcept { return data_; }
  const void* data() const noexcept { return data_; }
  template <Element A>
  A* data_as() {
    if (dtype_of<A> != dtype_) throw InvalidArgumentError("dtrain: OwnedTensor::data_as: dtype is " +
                                                          std::string(to_string(dtype_)));
    return static_cast<A*>(data_);
  }
  std::int64_t numel() const noexcept { return numel_; }
  DataType dtype() const noexcept { return dtype_; }
  Device device() const noexcept { return device_; }
  const Shape& shape() const noexcept { return shape_; }
  TensorView view() noexcept { return TensorView(data_, numel_, dtype_, device_, shape_); }

 private:
  void reset() noexcept {
    if (!data_) return;
    if (device_.is_cpu()) {
      detail::host_deallocate(data_, -1);
    } else if (auto& a = detail::cuda_allocator(); a.deallocate) {
      a.deallocate(data_, device_.index);
    }
    data_ = nullptr;
  }
  void swap(OwnedTensor& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(numel_, o.numel_);
    std::swap(dtype_, o.dtype_);
    std::swap(device_, o.device_);
    std::swap(shape_, o.shape_);
  }
  void* data_ = nullptr;
  std::int64_t numel_ = 0;
  DataType dtype_ = DataType::float32;
  Device device_ = Device::cpu();
  Shape shape_;
};

template <>
struct tensor_traits<OwnedTensor> {
  using output_type = OwnedTensor;
  static const void* data(const OwnedTensor& t) noexcept { return t.data(); }
  static void* mutable_data(OwnedTensor& t) noexcept { return t.data(); }
  static std::int64_t numel(const OwnedTensor& t) noexcept { return t.numel(); }
  static DataType dtype(const OwnedTensor& t) noexcept { return t.dtype(); }
  static Device device(const OwnedTensor& t) noexcept { return t.device(); }
  static Shape shape(const OwnedTensor& t) { return t.shape(); }
  static output_type make_output(const OwnedTensor& like, const Shape& s) {
    return OwnedTensor(like.dtype(), s, like.device());
  }
  static void* output_data(output_type& o) noexcept { return o.data(); }
};

template <>
struct tensor_traits<TensorView> {
  using output_type = OwnedTensor;
  static const void* data(const TensorView& t) noexcept { return t.data; }
  static void* mutable_data(TensorView& t) noexcept { return t.data; }
  static std::int64_t numel(const TensorView& t) noexcept { return t.numel; }
  static DataType dtype(const TensorView& t) noexcept { return t.dtype; }
  static Device device(const TensorView& t) noexcept { return t.device; }
  static Shape shape(const TensorView& t) {
    return t.shape.empty() ? Shape{t.numel} : t.shape;
  }
  static void* stream(const TensorView& t) noexcept { return t.stream; }
  static output_type make_output(const TensorView& like, const Shape& s) {
    return OwnedTensor(like.dtype, s, like.device);
  }
  static void* output_data(output_type& o) noexcept { return o.data(); }
};

}  // namespace dtrain
