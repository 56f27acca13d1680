#pragma once
#include <exception>
#include <map>
#include <mutex>
#include <utility>

#include <fmt/format.h>

#include "dtrain/core/error.hpp"
#include "dtrain/core/fnv1a.hpp"
#include "dtrain/runtime/collectives.hpp"
#include "dtrain/runtime/device_registry.hpp"
#include "dtrain/runtime/grouped_collectives.hpp"
#include "dtrain/runtime/session.hpp"
#include "dtrain/train/gradient_hook.hpp"

namespace dtrain {
namespace detail {

// Waits for every handle, so that no buffer is still in use when the first error surfaces.
inline void wait_all(std::vector<Handle>& handles) {
  std::exception_ptr first;
  for (auto& h : handles) {
    try {
      h.wait();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  handles.clear();
  if (first) std::rethrow_exception(first);
}

inline AllreduceOptions named(const AllreduceOptions& options, const std::string& name) {
  AllreduceOptions o = options;
  o.name = name;
  return o;
}

class AllreducePending final : public PendingGradients {
 public:
  explicit AllreducePending(std::vector<Handle> handles) : handles_(std::move(handles)) {}
  ~AllreducePending() override {
    try {
      wait_all(handles_);
    } catch (...) {
      // The owner saw (or will see) the error through wait(); a destructor never throws.
    }
  }
  void wait() override { wait_all(handles_); }

 private:
  std::vector<Handle> handles_;
};

class AllreduceHook final : public GradientHook {
 public:
  std::unique_ptr<PendingGradients> start(GradientBucket bucket) override {
    std::vector<Handle> handles;
    if (!bucket.group.empty()) {
      handles.push_back(
          grouped_allreduce_async(bucket.gradients, named(bucket.options, bucket.group)));
      return std::make_unique<AllreducePending>(std::move(handles));
    }
    handles.reserve(bucket.gradients.size());
    for (std::size_t i = 0; i < bucket.gradients.size(); ++i)
      handles.push_back(allreduce_async(bucket.gradients[i], named(bucket.options, bucket.names[i])));
    return std::make_unique<AllreducePending>(std::move(handles));
  }
  std::string settings() const override { return "allreduce"; }
};

inline DataType wire_type(Compression c) {
  return c == Compression::fp16 ? DataType::float16 : DataType::bfloat16;
}

// A gradient in flight as 16 bits: widened back into `gradient` once its op completes.
struct NarrowedGradient {
  TensorView gradient;
  TensorView wire;
};

class CompressionPending final : public PendingGradients {
 public:
  CompressionPending(Compression c, std::vector<Handle> handles,
                     std::vector<NarrowedGradient> narrowed)
      : compression_(c), handles_(std::move(handles)), narrowed_(std::move(narrowed)) {}
  ~CompressionPending() override {
    try {
      wait_all(handles_);
    } catch (...) {
      // As AllreducePending.
    }
  }
  void wait() override {
    wait_all(handles_);
    for (auto& n : narrowed_) widen(n);
    narrowed_.clear();
  }

 private:
  void widen(NarrowedGradient& n) const {
    const auto* src = static_cast<const std::uint16_t*>(n.wire.data);
    if (n.gradient.device.is_cuda()) {
      device_converter()(n.wire.data, n.wire.dtype, n.gradient.data, n.gradient.dtype,
                         n.gradient.numel, n.gradient.device.index, n.gradient.stream);
    } else if (n.gradient.dtype == DataType::float32) {
      decompress(src, static_cast<float*>(n.gradient.data), n.gradient.numel, compression_);
    } else {
      decompress(src, static_cast<double*>(n.gradient.data), n.gradient.numel, compression_);
    }
  }

  Compression compression_;
  std::vector<Handle> handles_;
  std::vector<NarrowedGradient> narrowed_;
};

// Note [Gradient communication hooks]: the 16-bit wire formats. The wire buffers are kept per
// gradient name and reused every step, so a step allocates nothing after the first.
class CompressionHook final : public GradientHook {
 public:
  explicit CompressionHook(Compression c) : compression_(c) {}

  std::unique_ptr<PendingGradients> start(GradientBucket bucket) override {
    std::vector<Handle> handles;
    std::vector<NarrowedGradient> narrowed;
    std::vector<TensorView> sent;  // with a group: what travels, in the bucket's order
    handles.reserve(bucket.gradients.size());
    for (std::size_t i = 0; i < bucket.gradients.size(); ++i) {
      TensorView& g = bucket.gradients[i];
      const auto options = named(bucket.options, bucket.names[i]);
      TensorView wire = g;
      if (compressible(g, bucket.names[i])) {
        wire = narrow(g, bucket.names[i]);
        narrowed.push_back({g, wire});
      }
      if (bucket.group.empty())
        handles.push_back(allreduce_async(wire, options));
      else
        sent.push_back(wire);
    }
    if (!bucket.group.empty())
      handles.push_back(grouped_allreduce_async(sent, named(bucket.options, bucket.group)));
    return std::make_unique<CompressionPending>(compression_, std::move(handles),
                                                std::move(narrowed));
  }

  std::string settings() const override {
    return compression_ == Compression::fp16 ? "compression fp16" : "compression bf16";
  }

 private:
  // The device kernels convert float32 only: a float64 gradient on a GPU travels as it is.
  static bool compressible(const TensorView& g, const std::string& name) {
    if (g.device.is_cuda()) {
      if (g.dtype != DataType::float32) return false;
      if (!device_converter())
        throw InvalidArgumentError(fmt::format(
            "dtrain: gradient compression: gradient '{}' is on {}: the device conversion needs "
            "<dtrain/cuda.hpp> included in the program (and dtrain::cuda linked)",
            name, to_string(g.device)));
      return true;
    }
    return g.dtype == DataType::float32 || g.dtype == DataType::float64;
  }

  TensorView narrow(const TensorView& g, const std::string& name) {
    const DataType wire_dtype = wire_type(compression_);
    OwnedTensor* buffer = nullptr;
    {
      std::lock_guard lock(mutex_);
      auto& b = buffers_[name];
      if (b.numel() != g.numel || b.device() != g.device)
        b = OwnedTensor(wire_dtype, Shape{g.numel}, g.device);
      buffer = &b;  // map nodes do not move; this name's buffer is used by one bucket at a time
    }
    TensorView wire(buffer->data(), g.numel, wire_dtype, g.device, g.shape, g.stream);
    if (g.device.is_cuda())
      device_converter()(g.data, g.dtype, wire.data, wire_dtype, g.numel, g.device.index, g.stream);
    else if (g.dtype == DataType::float32)
      compress(static_cast<const float*>(g.data), static_cast<std::uint16_t*>(wire.data), g.numel,
               compression_);
    else
      compress(static_cast<const double*>(g.data), static_cast<std::uint16_t*>(wire.data), g.numel,
               compression_);
    return wire;
  }

  Compression compression_;
  std::mutex mutex_;
  std::map<std::string, OwnedTensor> buffers_;
};

DTRAIN_API void check_same_hook_everywhere(const GradientHook& hook, const std::string& owner) {
  const std::string mine = hook.settings();
  const auto fingerprint = static_cast<std::int64_t>(fnv1a(mine) >> 1);
  std::vector<std::int64_t> one{fingerprint};
  const auto all = allgather(one, CollectiveOptions{owner + ".hook_settings"});
  std::vector<int> differ;
  for (std::size_t r = 0; r < all.size(); ++r)
    if (all[r] != all[0]) differ.push_back(static_cast<int>(r));
  if (differ.empty()) return;
  throw InvalidArgumentError(fmt::format(
      "dtrain: {}: the gradient hooks differ across ranks: rank(s) {} differ from rank 0 (this "
      "rank, {}, uses '{}'); every rank must use the same hook with the same settings",
      owner, fmt::join(differ, ", "), rank(), mine));
}

}  // namespace detail

DTRAIN_API std::shared_ptr<GradientHook> allreduce_hook() {
  return std::make_shared<detail::AllreduceHook>();
}

DTRAIN_API std::shared_ptr<GradientHook> compression_hook(Compression c) {
  if (c == Compression::none) return allreduce_hook();
  if (c != Compression::fp16 && c != Compression::bf16)
    throw InvalidArgumentError(fmt::format(
        "dtrain: compression_hook: {} is not a Compression (none, fp16 or bf16)",
        static_cast<int>(c)));
  return std::make_shared<detail::CompressionHook>(c);
}

}  // namespace dtrain
