#pragma once
// Gradients that live in fusion memory, for libtorch models (the opt-in that DDP calls
// gradient_as_bucket_view): each parameter's .grad() becomes a view into a persistent,
// pre-touched buffer, laid out in backward order, so that DistributedOptimizer's fused allreduce
// reduces the gradients where they are and packs and unpacks nothing.
//
//   dtrain::GradientViews views(model->parameters());           // before the first backward
//   dtrain::DistributedOptimizer opt(sgd, model->named_parameters());
//   for (...) {
//     views.zero_grad();                                         // instead of opt.zero_grad()
//     loss.backward();
//     opt.step();
//   }
//
// Note [Gradient views]
// Backward accumulates into a gradient that is already defined in place (libtorch's
// AccumulateGrad adds into it when grad mode is off, as it is during backward), so a gradient
// set to a view before backward stays that view. What undoes it is assigning a new tensor:
// torch::optim::Optimizer::zero_grad() sets gradients to undefined by default, and the next
// backward then allocates fresh ones. zero_grad() here zeroes each buffer in one pass and
// re-attaches any gradient that is no longer its view, so calling the optimizer's zero_grad()
// as well costs a copy-free step nothing but is never needed. The views hold the buffer alive
// (their deleter owns a reference), so a gradient outliving this object stays valid.
//
// The layout is the reverse of the order given (module->parameters() lists parameters in
// forward order; hooks fire in backward order), one buffer per dtype, large tensors last where
// fused responses reduce them in place (GradientLayout in train/gradient_buffer.hpp). A
// gradient computed in another order, or fused with tensors from outside the views, is still
// reduced correctly; it only costs the copies the views would have saved.
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include <torch/torch.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dtrain/core/error.hpp"
#include "dtrain/torch/tensor.hpp"
#include "dtrain/train/gradient_buffer.hpp"

namespace dtrain {

class GradientViews {
 public:
  // `parameters` in forward order (module->parameters()); those that do not require a gradient
  // are left alone. CPU tensors only: on a GPU, gradients are reduced by NCCL in device memory.
  explicit GradientViews(const std::vector<torch::Tensor>& parameters,
                         GradientLayout layout = GradientLayout::automatic) {
    std::map<torch::ScalarType, std::size_t> group_of;
    for (auto it = parameters.rbegin(); it != parameters.rend(); ++it) {
      const torch::Tensor& p = *it;
      if (!p.requires_grad()) continue;
      check_parameter(p, static_cast<std::size_t>(parameters.rend() - it - 1));
      auto [g, added] = group_of.emplace(p.scalar_type(), groups_.size());
      if (added) groups_.emplace_back();
      groups_[g->second].params.push_back(p);
    }
    for (auto& group : groups_) {
      std::vector<std::int64_t> bytes;
      for (const auto& p : group.params) bytes.push_back(p.numel() * p.element_size());
      group.buffer = std::make_shared<GradientBuffer<std::byte>>(std::move(bytes), layout);
      for (std::size_t i = 0; i < group.params.size(); ++i) group.views.push_back(make_view(group, i));
    }
    zero_grad();  // touches the buffers and makes every gradient its view
  }

  GradientViews(const GradientViews&) = delete;
  GradientViews& operator=(const GradientViews&) = delete;

  // Zeroes every gradient (one pass per buffer) and makes any gradient that was replaced or
  // cleared its view again (Note [Gradient views]). Call it where the loop would call the
  // optimizer's zero_grad(): after step(), with no allreduce of these gradients in flight.
  void zero_grad() {
    torch::NoGradGuard no_grad;
    for (auto& group : groups_) {
      std::fill(group.buffer->flat().begin(), group.buffer->flat().end(), std::byte{0});
      for (std::size_t i = 0; i < group.params.size(); ++i) {
        auto& grad = group.params[i].mutable_grad();
        if (!grad.defined() || grad.data_ptr() != group.views[i].data_ptr())
          grad = group.views[i];
      }
    }
  }

  // Parameters whose gradient is its view now (all of them, unless something replaced one since
  // the last zero_grad()).
  std::size_t attached() const {
    std::size_t n = 0;
    for (const auto& group : groups_)
      for (std::size_t i = 0; i < group.params.size(); ++i) {
        const auto& grad = group.params[i].grad();
        n += grad.defined() && grad.data_ptr() == group.views[i].data_ptr();
      }
    return n;
  }
  std::size_t size() const noexcept {
    std::size_t n = 0;
    for (const auto& group : groups_) n += group.params.size();
    return n;
  }
  std::size_t buffers() const noexcept { return groups_.size(); }  // one per dtype
  std::int64_t total_bytes() const noexcept {
    std::int64_t n = 0;
    for (const auto& group : groups_) n += group.buffer->total_numel();
    return n;
  }

 private:
  struct Group {
    std::vector<torch::Tensor> params;  // backward order
    std::vector<torch::Tensor> views;
    std::shared_ptr<GradientBuffer<std::byte>> buffer;
  };

  static void check_parameter(const torch::Tensor& p, std::size_t index) {
    const auto where = [&] {
      return fmt::format("parameter #{} (shape [{}], {})", index, fmt::join(p.sizes(), ", "),
                         std::string(c10::toString(p.scalar_type())));
    };
    if (!p.device().is_cpu())
      throw InvalidArgumentError(fmt::format(
          "dtrain: GradientViews: {} is on {}: gradient views are for CPU parameters (on a GPU, "
          "NCCL reduces gradients in device memory)",
          where(), p.device().str()));
    if (!p.is_contiguous())
      throw InvalidArgumentError(fmt::format(
          "dtrain: GradientViews: {} is not contiguous: its gradient could not be a flat view",
          where()));
    (void)detail::torch_dtype(p);  // a dtype dtrain cannot reduce fails here, by name
  }

  static torch::Tensor make_view(const Group& group, std::size_t i) {
    const torch::Tensor& p = group.params[i];
    auto keep = group.buffer;  // the view owns a reference: Note [Gradient views]
    return torch::from_blob(group.buffer->view(i).data(), p.sizes(),
                            [keep](void*) {}, p.options().requires_grad(false));
  }

  std::vector<Group> groups_;
};

}  // namespace dtrain
