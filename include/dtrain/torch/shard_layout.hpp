#pragma once
// The flat buffers of a sharded optimizer (Note [Sharded optimizer state] in
// torch/optimizer_shards.hpp): how the parameters of each (group, dtype, device) are laid out in
// units, each padded and cut into one shard per rank, and how the model's parameters (and, with
// Shard::optimizer_state, their gradients) become views into them.
#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dtrain/core/error.hpp"

namespace dtrain::detail {

// One unit: a run of consecutive parameters of one family, (group, dtype, device), reduce-scattered
// as one op as soon as backward has produced all of their gradients.
struct FlatShard {
  std::size_t group = 0;
  std::size_t family = 0;  // checkpoints describe each family whole, whatever its units
  std::int64_t base = 0;   // where this unit starts in its family's elements
  std::vector<torch::Tensor> members;  // the model's parameters, views into `params`
  std::vector<std::int64_t> offsets;
  torch::Tensor params;  // padded to a multiple of the world size
  // The same layout. Shard::optimizer_state: persistent, the model's gradients are views into it.
  // Shard::gradients: made when backward produces the unit's first gradient and released once its
  // reduce-scatter has read it.
  torch::Tensor grads;
  torch::Tensor shard;   // this rank's slice of `params`: what the optimizer steps
  torch::Tensor shard_grad;  // the shard's gradient: what the reduce-scatter writes
  torch::Tensor wire_out;    // the reduce-scatter's 16-bit output, under compression
  torch::Tensor send;        // the allgather's input: a copy of the shard
};

inline std::string describe_parameter(const torch::Tensor& p) {
  return fmt::format("{} [{}]", c10::toString(p.scalar_type()), fmt::join(p.sizes(), ", "));
}

inline std::int64_t flat_numel(const FlatShard& f) {
  return f.offsets.back() + f.members.back().numel();
}

inline torch::Tensor gradient_view(const FlatShard& f, std::size_t j) {
  const auto& p = f.members[j];
  return f.grads.narrow(0, f.offsets[j], p.numel()).view(p.sizes());
}

// Member j's gradient into the unit's buffer. Shard::optimizer_state (`keep_views`): a gradient
// that is no longer its view (backward allocated one after the user's zero_grad set it to
// undefined) is copied in and made the view again. Shard::gradients: the gradient is copied in
// and released, so that the model holds none.
inline void take_gradient(FlatShard& f, std::size_t j, bool keep_views) {
  auto& p = f.members[j];
  auto& grad = p.mutable_grad();
  if (grad.defined() && grad.is_sparse())
    throw InvalidArgumentError(
        "dtrain: DistributedOptimizer: a sharded optimizer cannot reduce a sparse gradient");
  auto view = gradient_view(f, j);
  if (grad.defined() && grad.data_ptr() == view.data_ptr()) return;
  if (grad.defined())
    view.copy_(grad.reshape(view.sizes()));
  else
    view.zero_();
  grad = keep_views ? view : torch::Tensor();
}

// Lays out the parameters of every group of `optimizer` (named `names`, in group order) in units
// of at most `unit_bytes` (a parameter larger than that is a unit alone), makes the model's
// parameters views into the flat buffers (and with `gradient_views` their gradients too), and
// replaces each group's parameter list by this rank's shards. A unit never depends on the world
// size, only its padding does.
inline std::vector<FlatShard> lay_out_shards(torch::optim::Optimizer& optimizer,
                                             const std::vector<std::string>& names,
                                             std::int64_t ranks, std::int64_t me,
                                             std::int64_t unit_bytes, bool gradient_views) {
  std::vector<FlatShard> flats;
  torch::NoGradGuard no_grad;
  auto& groups = optimizer.param_groups();
  std::size_t k = 0;
  std::size_t families = 0;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    std::map<std::tuple<int, std::string>, std::size_t> last_unit;  // (dtype, device)
    const std::size_t first = flats.size();
    for (auto& p : groups[g].params()) {
      const std::string& name = names.at(k++);
      if (p.is_sparse() || (p.grad().defined() && p.grad().is_sparse()))
        throw InvalidArgumentError(fmt::format(
            "dtrain: DistributedOptimizer: a sharded optimizer cannot shard parameter '{}': "
            "its gradient is sparse",
            name));
      if (!p.is_floating_point())
        throw InvalidArgumentError(fmt::format(
            "dtrain: DistributedOptimizer: a sharded optimizer cannot shard parameter '{}' "
            "({}): only floating-point parameters have gradients to reduce",
            name, describe_parameter(p)));
      auto key = std::make_tuple(static_cast<int>(p.scalar_type()), p.device().str());
      const std::int64_t bytes = p.numel() * static_cast<std::int64_t>(p.element_size());
      auto it = last_unit.find(key);
      if (it != last_unit.end()) {
        const auto& unit = flats[it->second];
        const std::int64_t unit_numel = unit.offsets.back() + unit.members.back().numel();
        if ((unit_numel * static_cast<std::int64_t>(p.element_size())) + bytes > unit_bytes) {
          FlatShard next;
          next.family = unit.family;
          next.base = unit.base + unit_numel;
          it->second = flats.size();
          flats.push_back(std::move(next));
        }
      } else {
        it = last_unit.emplace(key, flats.size()).first;
        flats.push_back(FlatShard{});
        flats.back().family = families++;
      }
      auto& f = flats[it->second];
      f.group = g;
      f.offsets.push_back(f.members.empty() ? 0 : f.offsets.back() + f.members.back().numel());
      f.members.push_back(p);
    }
    for (std::size_t i = first; i < flats.size(); ++i) {
      auto& f = flats[i];
      const std::int64_t numel = f.offsets.back() + f.members.back().numel();
      const std::int64_t per_rank = std::max<std::int64_t>(1, (numel + ranks - 1) / ranks);
      auto like = f.members.front();
      f.params = torch::zeros({per_rank * ranks}, like.options().requires_grad(false));
      if (gradient_views)
        f.grads = torch::zeros({per_rank * ranks}, like.options().requires_grad(false));
      for (std::size_t j = 0; j < f.members.size(); ++j) {
        auto& p = f.members[j];
        auto slice = f.params.narrow(0, f.offsets[j], p.numel());
        slice.copy_(p.detach().reshape({-1}));
        p.set_data(slice.view(p.sizes()));
        if (!gradient_views) continue;
        auto view = gradient_view(f, j);
        if (p.grad().defined()) view.copy_(p.grad());
        p.mutable_grad() = view;
      }
      f.shard = f.params.narrow(0, me * per_rank, per_rank);
      f.shard_grad = torch::zeros({per_rank}, f.params.options());
      f.send = torch::empty({per_rank}, f.params.options());
    }
    std::vector<torch::Tensor> shards;
    for (std::size_t i = first; i < flats.size(); ++i) shards.push_back(flats[i].shard);
    groups[g].params() = std::move(shards);
  }
  return flats;
}

}  // namespace dtrain::detail
