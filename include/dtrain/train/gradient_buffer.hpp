#pragma once
// Gradients that live in fusion memory, for plain C++ models: one persistent, pre-touched buffer
// whose views are the gradients, laid out so that a fused allreduce of them reduces them where
// they are and copies nothing (Note [Gradients in fusion memory] in
// runtime/execution/fusion_pipeline.hpp).
//
//   dtrain::GradientBuffer<float> grads({n_fc2, n_fc1, n_conv});  // backward order
//   model.fc2.grad = grads.view(0);  ...                          // the model writes into views
//   for (std::size_t i = 0; i < grads.count(); ++i) {
//     std::span<float> g = grads.view(i);                       // after backward wrote it
//     handles.push_back(dtrain::allreduce_async(g));
//   }
//
// Views never move or change size for the buffer's lifetime. Tensors are laid out in the order
// given, which should be the order they are submitted in (backward order), so the tensors of one
// fused response lie back to back. Where fused responses reduce large tensors in their own memory
// (Note [Direct segments]), those tensors are placed after all the small ones, so the small ones
// stay back to back in the packed layout. Any other layout or order still works; it only copies.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "dtrain/comm/host_buffer.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/runtime/fusion_layout.hpp"
#include "dtrain/runtime/session.hpp"
#include "dtrain/tensor/dtype.hpp"

namespace dtrain {

enum class GradientLayout : std::uint8_t {
  automatic,    // large_last where fused responses reduce large tensors in place, else in_order
  in_order,     // every tensor in the order given
  large_last,   // tensors below the in-place size in order, then the large ones in order
};

template <class T>
class GradientBuffer {
 public:
  // `numels[i]`: elements of gradient i, in submission order. `automatic` asks the running
  // runtime how fused responses are executed here, so dtrain must be initialized first.
  explicit GradientBuffer(std::vector<std::int64_t> numels,
                          GradientLayout layout = GradientLayout::automatic)
      : numels_(std::move(numels)), offsets_(numels_.size(), 0) {
    for (std::size_t i = 0; i < numels_.size(); ++i)
      if (numels_[i] < 0)
        throw InvalidArgumentError(fmt::format(
            "dtrain: GradientBuffer: gradient {} has {} elements; counts must be >= 0", i,
            numels_[i]));
    if (layout == GradientLayout::automatic) {
      if (!is_initialized())
        throw Error("dtrain: GradientBuffer with GradientLayout::automatic needs dtrain::init() "
                    "first (it asks how fused responses run here); or pass in_order/large_last");
      layout = detail::direct_segments("GradientBuffer") ? GradientLayout::large_last
                                                          : GradientLayout::in_order;
    }
    layout_ = layout;
    const std::int64_t large = detail::kFusionDirectMinBytes / static_cast<std::int64_t>(sizeof(T));
    std::int64_t at = 0;
    for (int pass = 0; pass < 2; ++pass) {
      for (std::size_t i = 0; i < numels_.size(); ++i) {
        const bool is_large = layout == GradientLayout::large_last && numels_[i] >= large;
        if (is_large != (pass == 1)) continue;
        offsets_[i] = at;
        at += numels_[i];
      }
    }
    total_ = at;
    // Pre-touched: the first backward pass writes into memory that is already faulted in.
    data_ = static_cast<T*>(storage_.reserve(static_cast<std::size_t>(total_) * sizeof(T)));
  }

  std::size_t count() const noexcept { return numels_.size(); }
  GradientLayout layout() const noexcept { return layout_; }
  std::int64_t total_numel() const noexcept { return total_; }
  // Gradient i; the same memory for the buffer's lifetime.
  std::span<T> view(std::size_t i) {
    check_index(i);
    return {data_ + offsets_[i], static_cast<std::size_t>(numels_[i])};
  }
  std::span<const T> view(std::size_t i) const {
    check_index(i);
    return {data_ + offsets_[i], static_cast<std::size_t>(numels_[i])};
  }
  // Every gradient, in one span, in memory order (e.g. to zero them all at once).
  std::span<T> flat() noexcept { return {data_, static_cast<std::size_t>(total_)}; }

 private:
  void check_index(std::size_t i) const {
    if (i >= numels_.size())
      throw InvalidArgumentError(fmt::format(
          "dtrain: GradientBuffer::view({}): the buffer holds {} gradients", i, numels_.size()));
  }

  std::vector<std::int64_t> numels_, offsets_;
  std::int64_t total_ = 0;
  GradientLayout layout_ = GradientLayout::in_order;
  detail::HostBuffer storage_;
  T* data_ = nullptr;
};

}  // namespace dtrain
