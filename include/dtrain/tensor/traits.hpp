#pragma once
// The tensor customization point.
//
// Note [tensor_traits]
// dtrain works on any type for which dtrain::tensor_traits<T> is specialized, the way {fmt} works
// on any type with a formatter<T>. A specialization provides static functions:
//   required:  const void* data(const T&);  std::int64_t numel(const T&);
//              DataType dtype(const T&);    Device device(const T&);
//   mutable:   void* mutable_data(T&);              (needed by in-place ops: allreduce, broadcast)
//   optional:  Shape shape(const T&);               (default: 1-D, {numel})
//              void* stream(const T&);              (CUDA stream that produced the data; default none)
//              using output_type = ...;             (type returned by allgather/alltoall/
//              static output_type make_output(const T& like, const Shape& shape);  reducescatter)
//              static void* output_data(output_type&);
// The primary template is empty, so a type without a specialization fails the Tensor concept and
// every dtrain entry point reports it with a static_assert that names tensor_traits.
#include <array>
#include <concepts>
#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

#include "dtrain/tensor/device.hpp"
#include "dtrain/tensor/dtype.hpp"
#include "dtrain/tensor/half.hpp"
#include "dtrain/tensor/shape.hpp"

namespace dtrain {


template <class T, class Enable = void>
struct tensor_traits {};

namespace detail {
template <class A>
struct element_dtype {};
template <> struct element_dtype<std::uint8_t> { static constexpr DataType value = DataType::uint8; };
template <> struct element_dtype<std::int8_t> { static constexpr DataType value = DataType::int8; };
template <> struct element_dtype<std::int32_t> { static constexpr DataType value = DataType::int32; };
template <> struct element_dtype<std::int64_t> { static constexpr DataType value = DataType::int64; };
template <> struct element_dtype<float16_t> { static constexpr DataType value = DataType::float16; };
template <> struct element_dtype<bfloat16_t> { static constexpr DataType value = DataType::bfloat16; };
template <> struct element_dtype<float> { static constexpr DataType value = DataType::float32; };
template <> struct element_dtype<double> { static constexpr DataType value = DataType::float64; };
// `long long` and `long` are distinct types of the same width on LP64; map both to int64.
template <>
struct element_dtype<std::conditional_t<std::is_same_v<std::int64_t, long>, long long, long>> {
  static constexpr DataType value = DataType::int64;
};
// char is neither signed char nor unsigned char; treat it by its signedness.
template <>
struct element_dtype<char> {
  static constexpr DataType value = std::is_signed_v<char> ? DataType::int8 : DataType::uint8;
};
}  // namespace detail

// Element types that the built-in containers can hold.
template <class A>
concept Element = requires { detail::element_dtype<std::remove_cv_t<A>>::value; };

template <Element A>
inline constexpr DataType dtype_of = detail::element_dtype<std::remove_cv_t<A>>::value;

template <class T>
using traits_of = tensor_traits<std::remove_cvref_t<T>>;

template <class T>
concept Tensor = requires(const std::remove_cvref_t<T>& t) {
  { traits_of<T>::data(t) } -> std::convertible_to<const void*>;
  { traits_of<T>::numel(t) } -> std::convertible_to<std::int64_t>;
  { traits_of<T>::dtype(t) } -> std::same_as<DataType>;
  { traits_of<T>::device(t) } -> std::same_as<Device>;
};

template <class T>
concept MutableTensor = Tensor<T> && requires(std::remove_cvref_t<T>& t) {
  { traits_of<T>::mutable_data(t) } -> std::convertible_to<void*>;
};

template <class T>
concept TensorWithOutput = Tensor<T> && requires(const std::remove_cvref_t<T>& t, const Shape& s) {
  typename traits_of<T>::output_type;
  { traits_of<T>::make_output(t, s) } -> std::same_as<typename traits_of<T>::output_type>;
};

template <class T>
inline constexpr bool always_false = false;

// Used by every entry point so a non-tensor fails with one readable message, not a cascade.
#define DTRAIN_REQUIRE_TENSOR(T)                                                                 \
  static_assert(::dtrain::Tensor<T>,                                                             \
                "dtrain: this argument is not a tensor. Specialize dtrain::tensor_traits<T> "     \
                "(data, numel, dtype, device; see <dtrain/tensor/traits.hpp>) or pass a "         \
                "std::vector/std::span/std::array of arithmetic or half types, or a "            \
                "dtrain::TensorView")
#define DTRAIN_REQUIRE_MUTABLE_TENSOR(T)                                                         \
  DTRAIN_REQUIRE_TENSOR(T);                                                                      \
  static_assert(!::dtrain::Tensor<T> || ::dtrain::MutableTensor<T>,                              \
                "dtrain: this argument is not a mutable tensor. In-place ops need "              \
                "dtrain::tensor_traits<T>::mutable_data (see <dtrain/tensor/traits.hpp>); a "     \
                "const or read-only type cannot be reduced or broadcast in place")

namespace detail {
template <class T>
Shape shape_of(const T& t) {
  if constexpr (requires { traits_of<T>::shape(t); }) {
    return Shape(traits_of<T>::shape(t));
  } else {
    return Shape{static_cast<std::int64_t>(traits_of<T>::numel(t))};
  }
}
template <class T>
void* stream_of(const T& t) {
  if constexpr (requires { traits_of<T>::stream(t); }) {
    return traits_of<T>::stream(t);
  } else {
    return nullptr;
  }
}
}  // namespace detail

// std::vector<A>: owning, resizable; outputs are vectors too.
template <Element A, class Alloc>
struct tensor_traits<std::vector<A, Alloc>> {
  using T = std::vector<A, Alloc>;
  using output_type = std::vector<std::remove_cv_t<A>>;
  static const void* data(const T& t) noexcept { return t.data(); }
  static void* mutable_data(T& t) noexcept { return t.data(); }
  static std::int64_t numel(const T& t) noexcept { return static_cast<std::int64_t>(t.size()); }
  static DataType dtype(const T&) noexcept { return dtype_of<A>; }
  static Device device(const T&) noexcept { return Device::cpu(); }
  static output_type make_output(const T&, const Shape& s) { return output_type(numel_of(s)); }
  static void* output_data(output_type& o) noexcept { return o.data(); }
  static std::int64_t numel_of(const Shape& s) { return detail::numel(s); }
};

// std::span<A>: a view; mutable unless A is const. Outputs are std::vectors.
template <Element A, std::size_t Extent>
struct tensor_traits<std::span<A, Extent>> {
  using T = std::span<A, Extent>;
  using output_type = std::vector<std::remove_cv_t<A>>;
  static const void* data(const T& t) noexcept { return t.data(); }
  static void* mutable_data(T& t) noexcept
    requires(!std::is_const_v<A>)
  {
    return t.data();
  }
  static std::int64_t numel(const T& t) noexcept { return static_cast<std::int64_t>(t.size()); }
  static DataType dtype(const T&) noexcept { return dtype_of<A>; }
  static Device device(const T&) noexcept { return Device::cpu(); }
  static output_type make_output(const T&, const Shape& s) {
    return tensor_traits<output_type>::make_output(output_type{}, s);
  }
  static void* output_data(output_type& o) noexcept { return o.data(); }
};

template <Element A, std::size_t N>
struct tensor_traits<std::array<A, N>> {
  using T = std::array<A, N>;
  using output_type = std::vector<std::remove_cv_t<A>>;
  static const void* data(const T& t) noexcept { return t.data(); }
  static void* mutable_data(T& t) noexcept { return t.data(); }
  static std::int64_t numel(const T&) noexcept { return static_cast<std::int64_t>(N); }
  static DataType dtype(const T&) noexcept { return dtype_of<A>; }
  static Device device(const T&) noexcept { return Device::cpu(); }
  static output_type make_output(const T&, const Shape& s) {
    return tensor_traits<output_type>::make_output(output_type{}, s);
  }
  static void* output_data(output_type& o) noexcept { return o.data(); }
};

}  // namespace dtrain
