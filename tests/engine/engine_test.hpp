#pragma once
// Helpers for the multi-process engine tests. Every test case initializes dtrain with the Config
// it needs and shuts it down (collectively) at the end, so test cases are independent.
#include <doctest/doctest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "dtrain/runtime/collectives.hpp"
#include "dtrain/core/config.hpp"
#include "dtrain/core/logging.hpp"
#include "dtrain/runtime/session.hpp"
#include "dtrain/tensor/half.hpp"
#include "dtrain/tensor/view.hpp"
#include "support/world.hpp"

namespace dtrain::test {

using dtrain_test_support::world_rank;
using dtrain_test_support::world_size;

// dtrain initialized with `config` for the life of the object.
class Initialized {
 public:
  explicit Initialized(const Config& config = Config::from_env()) { dtrain::init(config); }
  ~Initialized() {
    try {
      dtrain::shutdown();
    } catch (const std::exception& e) {
      FAIL_CHECK("dtrain::shutdown() threw: " << e.what());
    }
  }
  Initialized(const Initialized&) = delete;
  Initialized& operator=(const Initialized&) = delete;
};

// Captures dtrain's log lines (written by any thread) while alive; restores stderr after.
class LogLines {
 public:
  LogLines() {
    detail::set_log_sink([this](std::string_view line) {
      std::lock_guard lock(mutex_);
      lines_.emplace_back(line);
    });
  }
  ~LogLines() { detail::set_log_sink({}); }
  LogLines(const LogLines&) = delete;
  LogLines& operator=(const LogLines&) = delete;

  std::vector<std::string> lines() const {
    std::lock_guard lock(mutex_);
    return lines_;
  }
  // Lines that contain every fragment.
  std::vector<std::string> matching(std::initializer_list<std::string_view> fragments) const {
    std::vector<std::string> out;
    for (const auto& line : lines()) {
      bool all = true;
      for (auto f : fragments) all = all && line.find(f) != std::string::npos;
      if (all) out.push_back(line);
    }
    return out;
  }

 private:
  mutable std::mutex mutex_;
  std::vector<std::string> lines_;
};

inline bool contains(std::string_view haystack, std::string_view needle) {
  return haystack.find(needle) != std::string_view::npos;
}

// Whether every rank passes `ok` (for checks whose failure should be seen on all ranks at once).
inline bool all_ranks(bool ok) {
  int mine = ok ? 1 : 0, all = 0;
  MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all == 1;
}

}  // namespace dtrain::test

namespace dtrain::test {

// A tensor of any dtype, read and written as doubles (tests use values every dtype holds exactly).
class Buffer {
 public:
  Buffer() = default;
  Buffer(DataType dtype, std::int64_t n, Shape shape = {})
      : dtype_(dtype), n_(n), shape_(std::move(shape)),
        bytes_(static_cast<std::size_t>(n) * element_size(dtype)) {}

  TensorView view() { return TensorView(bytes_.data(), n_, dtype_, Device::cpu(), shape_); }
  std::int64_t size() const noexcept { return n_; }
  DataType dtype() const noexcept { return dtype_; }
  const std::vector<std::byte>& bytes() const noexcept { return bytes_; }

  void set(std::int64_t i, double v) {
    void* p = bytes_.data() + i * static_cast<std::int64_t>(element_size(dtype_));
    switch (dtype_) {
      case DataType::uint8: store(p, static_cast<std::uint8_t>(v)); break;
      case DataType::int8: store(p, static_cast<std::int8_t>(v)); break;
      case DataType::int32: store(p, static_cast<std::int32_t>(v)); break;
      case DataType::int64: store(p, static_cast<std::int64_t>(v)); break;
      case DataType::float16: store(p, float16_t(v)); break;
      case DataType::bfloat16: store(p, bfloat16_t(v)); break;
      case DataType::float32: store(p, static_cast<float>(v)); break;
      case DataType::float64: store(p, v); break;
    }
  }
  double get(std::int64_t i) const {
    const void* p = bytes_.data() + i * static_cast<std::int64_t>(element_size(dtype_));
    switch (dtype_) {
      case DataType::uint8: return load<std::uint8_t>(p);
      case DataType::int8: return load<std::int8_t>(p);
      case DataType::int32: return load<std::int32_t>(p);
      case DataType::int64: return static_cast<double>(load<std::int64_t>(p));
      case DataType::float16: return static_cast<float>(load<float16_t>(p));
      case DataType::bfloat16: return static_cast<float>(load<bfloat16_t>(p));
      case DataType::float32: return load<float>(p);
      case DataType::float64: return load<double>(p);
    }
    return 0;
  }

 private:
  template <class A>
  static void store(void* p, A v) { std::memcpy(p, &v, sizeof(A)); }
  template <class A>
  static A load(const void* p) {
    A v;
    std::memcpy(&v, p, sizeof(A));
    return v;
  }
  DataType dtype_ = DataType::float32;
  std::int64_t n_ = 0;
  Shape shape_;
  std::vector<std::byte> bytes_;
};

// Whether a reduction result matches its exact value up to the rounding of its dtype (Average
// multiplies by 1/size, which is inexact for sizes that are not powers of two).
inline bool close(double got, double want, DataType dtype) {
  double tol = 0;
  switch (dtype) {
    case DataType::float16: tol = 1e-3; break;
    case DataType::bfloat16: tol = 1e-2; break;
    case DataType::float32: tol = 1e-6; break;
    case DataType::float64: tol = 1e-12; break;
    default: return got == want;
  }
  return std::abs(got - want) <= tol * std::max(1.0, std::abs(want));
}

inline constexpr DataType all_dtypes[] = {DataType::uint8,   DataType::int8,    DataType::int32,
                                          DataType::int64,   DataType::float16, DataType::bfloat16,
                                          DataType::float32, DataType::float64};

}  // namespace dtrain::test
