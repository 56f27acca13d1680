#pragma once
// Correctness checks of every collective on device tensors, at any world size, against values
// computed on the host. Shared by the NCCL tests (one rank per GPU) and the staging tests (ranks
// sharing a GPU). Inputs are small integers, so every reduction is exact in every dtype whatever
// the association order, and results compare bit for bit (Average, which divides, within a
// tolerance).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "dtrain/cuda.hpp"
#include "gpu_test_support.hpp"
#include "support/reference_reduce.hpp"

namespace gpu_test {

using dtrain::DataType;
using dtrain::ReduceOp;

inline double input_value(int rank, std::int64_t i, DataType dtype) {
  int v = static_cast<int>((rank * 7 + i * 3) % 7) - 3;  // [-3, 3]
  if (dtype == DataType::uint8) v += 3;
  return v;
}

inline std::vector<char> encode(DataType dtype, const std::vector<double>& values) {
  std::vector<char> out(values.size() * dtrain::element_size(dtype));
  dtrain::detail::visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    T* p = reinterpret_cast<T*>(out.data());
    for (std::size_t i = 0; i < values.size(); ++i) {
      if constexpr (dtrain::detail::is_half_v<T>) p[i] = dtrain::detail::from_f32<T>(static_cast<float>(values[i]));
      else if constexpr (std::is_integral_v<T>) p[i] = static_cast<T>(static_cast<std::int64_t>(values[i]));
      else p[i] = static_cast<T>(values[i]);
    }
  });
  return out;
}

inline std::vector<double> decode(DataType dtype, const std::vector<char>& bytes) {
  const std::size_t n = bytes.size() / dtrain::element_size(dtype);
  std::vector<double> out(n);
  dtrain::detail::visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* p = reinterpret_cast<const T*>(bytes.data());
    for (std::size_t i = 0; i < n; ++i) {
      if constexpr (dtrain::detail::is_half_v<T>) out[i] = dtrain::detail::to_f32(p[i]);
      else out[i] = static_cast<double>(p[i]);
    }
  });
  return out;
}

inline std::vector<double> inputs(int rank, std::int64_t n, DataType dtype, std::int64_t offset = 0) {
  std::vector<double> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) v[i] = input_value(rank, i + offset, dtype);
  return v;
}

// The reduction of every rank's inputs, computed here; uint8 products wrap like the device's.
inline std::vector<double> expected_reduce(DataType dtype, ReduceOp op, std::int64_t n, int size,
                                           double pre, double post, std::int64_t offset = 0) {
  std::vector<double> out(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    double acc = dtrain::test::reference_reduce(
        op, size, [&](int r) { return input_value(r, i + offset, dtype) * pre; });
    if (dtype == DataType::uint8) acc = static_cast<double>(static_cast<std::uint8_t>(static_cast<std::int64_t>(acc)));
    if (dtype == DataType::int8) acc = static_cast<double>(static_cast<std::int8_t>(static_cast<std::int64_t>(acc)));
    out[i] = acc * post;
  }
  return out;
}

inline void compare(DataType dtype, const std::vector<double>& got, const std::vector<double>& want,
                    bool exact) {
  REQUIRE(got.size() == want.size());
  const double tol = dtype == DataType::bfloat16 ? 1e-2 : dtype == DataType::float16 ? 1e-3 : 1e-6;
  for (std::size_t i = 0; i < got.size(); ++i) {
    CAPTURE(i);
    if (exact) REQUIRE(got[i] == want[i]);
    else REQUIRE(std::fabs(got[i] - want[i]) <= tol * std::max(1.0, std::fabs(want[i])));
  }
}

inline std::vector<ReduceOp> ops_for(DataType dtype) {
  std::vector<ReduceOp> ops = {ReduceOp::Sum, ReduceOp::Min, ReduceOp::Max, ReduceOp::Product};
  if (dtrain::is_floating_point(dtype)) ops.push_back(ReduceOp::Average);
  return ops;
}

// A device tensor filled with this rank's inputs.
struct DeviceTensor {
  DeviceBytes mem;
  dtrain::TensorView view;
  DeviceTensor(DataType dtype, std::int64_t n, int device, int rank, std::int64_t offset = 0,
               dtrain::Shape shape = {})
      : mem(encode(dtype, inputs(rank, n, dtype, offset))),
        view(mem.get(), n, dtype, dtrain::Device::cuda(device), std::move(shape)) {}
  std::vector<double> values() const {
    return decode(view.dtype, mem.to_host<char>(static_cast<std::size_t>(view.nbytes())));
  }
};

inline std::vector<double> owned_values(const dtrain::OwnedTensor& t) {
  std::vector<char> bytes(static_cast<std::size_t>(t.numel()) * dtrain::element_size(t.dtype()));
  if (!bytes.empty())
    check_cuda(cudaMemcpy(bytes.data(), t.data(), bytes.size(), cudaMemcpyDeviceToHost));
  return decode(t.dtype(), bytes);
}

inline void check_allreduce(int device, int rank, int size) {
  for (DataType dtype : dtrain::all_data_types) {
    for (ReduceOp op : ops_for(dtype)) {
      CAPTURE(std::string(dtrain::to_string(dtype)));
      CAPTURE(std::string(dtrain::to_string(op)));
      const bool fp = dtrain::is_floating_point(dtype);
      const double pre = fp ? 0.5 : 1.0, post = fp ? 2.0 : 1.0;
      const bool exact = op != ReduceOp::Average;
      // A lone tensor (reduced in place), with scaling for floating-point types.
      {
        DeviceTensor t(dtype, 1001, device, rank);
        dtrain::allreduce(t.view, {.op = op, .prescale = pre, .postscale = post});
        compare(dtype, t.values(), expected_reduce(dtype, op, 1001, size, pre, post), exact);
      }
      // Many tensors fused into one buffer: sizes around the copy kernel's block size, an odd
      // element offset (unaligned), and an empty tensor.
      {
        const std::vector<std::int64_t> sizes = {1, 7, 0, 8192, 8193, 333, 100000};
        std::vector<DeviceTensor> ts;
        std::vector<dtrain::TensorView> views;
        std::int64_t offset = 0;
        for (auto n : sizes) {
          ts.emplace_back(dtype, n, device, rank, offset);
          offset += n;
        }
        for (auto& t : ts) views.push_back(t.view);
        dtrain::grouped_allreduce(views, {.op = op, .prescale = pre, .postscale = post});
        offset = 0;
        for (std::size_t k = 0; k < ts.size(); ++k) {
          CAPTURE(k);
          compare(dtype, ts[k].values(), expected_reduce(dtype, op, sizes[k], size, pre, post, offset), exact);
          offset += sizes[k];
        }
      }
    }
  }
}

inline void check_allgather(int device, int rank, int size) {
  for (DataType dtype : dtrain::all_data_types) {
    CAPTURE(std::string(dtrain::to_string(dtype)));
    for (bool equal_rows : {true, false}) {
      CAPTURE(equal_rows);
      const std::int64_t row = 3, rows = equal_rows ? 2 : rank + 1;
      DeviceTensor t(dtype, rows * row, device, rank, 0, {rows, row});
      dtrain::OwnedTensor out = dtrain::allgather(t.view);
      std::vector<double> want;
      std::int64_t total_rows = 0;
      for (int r = 0; r < size; ++r) {
        const std::int64_t rr = equal_rows ? 2 : r + 1;
        total_rows += rr;
        auto v = inputs(r, rr * row, dtype);
        want.insert(want.end(), v.begin(), v.end());
      }
      CHECK(out.device() == dtrain::Device::cuda(device));
      CHECK(out.shape() == dtrain::Shape{total_rows, row});
      compare(dtype, owned_values(out), decode(dtype, encode(dtype, want)), true);
    }
  }
}

inline void check_broadcast(int device, int rank, int size) {
  const int root = size - 1;
  for (DataType dtype : dtrain::all_data_types) {
    CAPTURE(std::string(dtrain::to_string(dtype)));
    DeviceTensor t(dtype, 4099, device, rank);
    dtrain::broadcast(t.view, root);
    compare(dtype, t.values(), decode(dtype, encode(dtype, inputs(root, 4099, dtype))), true);
  }
}

inline void check_reducescatter(int device, int rank, int size) {
  for (DataType dtype : dtrain::all_data_types) {
    CAPTURE(std::string(dtrain::to_string(dtype)));
    for (std::int64_t rows : {std::int64_t(2) * size, std::int64_t(2) * size + 1}) {
      CAPTURE(rows);
      const std::int64_t row = 5;
      DeviceTensor t(dtype, rows * row, device, rank, 0, {rows, row});
      dtrain::OwnedTensor out = dtrain::reducescatter(t.view, ReduceOp::Sum);
      std::int64_t first = 0;
      for (int r = 0; r < rank; ++r) first += rows / size + (r < rows % size ? 1 : 0);
      const std::int64_t mine = rows / size + (rank < rows % size ? 1 : 0);
      CHECK(out.shape() == dtrain::Shape{mine, row});
      const auto all = expected_reduce(dtype, ReduceOp::Sum, rows * row, size, 1.0, 1.0);
      std::vector<double> want(all.begin() + first * row, all.begin() + (first + mine) * row);
      compare(dtype, owned_values(out), want, true);
    }
  }
}

inline void check_alltoall(int device, int rank, int size) {
  for (DataType dtype : {DataType::float32, DataType::int64, DataType::bfloat16, DataType::uint8}) {
    CAPTURE(std::string(dtrain::to_string(dtype)));
    // Rank r sends (r + k) % 3 rows of 2 elements to rank k.
    const std::int64_t row = 2;
    std::vector<int> splits(size);
    std::int64_t rows = 0;
    for (int k = 0; k < size; ++k) rows += splits[k] = (rank + k) % 3;
    DeviceTensor t(dtype, rows * row, device, rank, 0, {rows, row});
    auto [out, received] = dtrain::alltoall(t.view, splits);
    std::vector<double> want;
    std::vector<std::int64_t> want_splits;
    for (int r = 0; r < size; ++r) {
      std::int64_t before = 0;
      for (int k = 0; k < rank; ++k) before += (r + k) % 3;
      const std::int64_t mine = (r + rank) % 3;
      want_splits.push_back(mine);
      auto v = inputs(r, (before + mine) * row, dtype);
      want.insert(want.end(), v.begin() + before * row, v.end());
    }
    CHECK(received == want_splits);
    compare(dtype, owned_values(out), decode(dtype, encode(dtype, want)), true);
  }
}

// The op must wait for work already queued on the producer's stream, without the caller
// synchronizing: a long memset is queued first, then the real values are copied in behind it.
inline void check_producer_stream_ordering(int device, int rank, int size) {
  dtrain::cuda::set_device_from_local_rank();
  cudaStream_t producer = nullptr;
  check_cuda(cudaStreamCreateWithFlags(&producer, cudaStreamNonBlocking));
  const std::int64_t n = 1 << 20;
  DeviceBytes big(std::size_t(512) << 20);
  DeviceBytes data(static_cast<std::size_t>(n) * sizeof(float));
  std::vector<float> host(static_cast<std::size_t>(n), static_cast<float>(rank + 1));
  float* pinned = nullptr;
  check_cuda(cudaMallocHost(reinterpret_cast<void**>(&pinned), host.size() * sizeof(float)));
  std::memcpy(pinned, host.data(), host.size() * sizeof(float));
  for (int round = 0; round < 4; ++round) {
    check_cuda(cudaMemsetAsync(data.get(), 0, host.size() * sizeof(float), producer));
    for (int k = 0; k < 8; ++k) check_cuda(cudaMemsetAsync(big.get(), k, std::size_t(512) << 20, producer));
    check_cuda(cudaMemcpyAsync(data.get(), pinned, host.size() * sizeof(float), cudaMemcpyHostToDevice,
                               producer));
    dtrain::TensorView v(data.get(), n, DataType::float32, dtrain::Device::cuda(device), {}, producer);
    dtrain::allreduce(v, {.op = ReduceOp::Sum});
    // After wait() the result is visible to any stream: read it on another one.
    const auto got = data.to_host<float>(static_cast<std::size_t>(n));
    const float want = static_cast<float>(size * (size + 1) / 2);
    CHECK(got.front() == want);
    CHECK(got.back() == want);
  }
  cudaFreeHost(pinned);
  cudaStreamDestroy(producer);
}

// Every collective in turn. The first allreduce starts the device path, after which the engine must
// be using `transport`.
inline void check_every_collective(int device, int rank, int size,
                                   dtrain::cuda::Transport transport) {
  check_allreduce(device, rank, size);
  CHECK(dtrain::cuda::active_transport() == transport);
  check_allgather(device, rank, size);
  check_broadcast(device, rank, size);
  check_reducescatter(device, rank, size);
  check_alltoall(device, rank, size);
  check_producer_stream_ordering(device, rank, size);
}

}  // namespace gpu_test
