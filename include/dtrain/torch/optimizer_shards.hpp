#pragma once
// The sharded modes of DistributedOptimizer for libtorch (DistributedOptimizerOptions::shard):
// Shard::optimizer_state, where each rank keeps the optimizer state of 1/size of the parameters,
// and Shard::gradients, where it keeps only its shard's gradients too.
//
// Note [Sharded optimizer state]
// ZeRO's first two stages (Rajbhandari et al., SC'20). The parameters of each (parameter group,
// dtype, device), a family, are laid out in units: runs of consecutive parameters of at most the
// unit size (bucket_bytes; unset, the unsharded optimizer's bucket default with
// Shard::optimizer_state and 25 MiB with Shard::gradients). Each unit is one flat buffer, padded
// to a multiple of the world size and cut into size equal shards; a parameter may straddle two
// shards. The model's parameters become views into the flat buffers. The user's optimizer keeps
// its parameter groups and their options, but each group's parameter list is replaced by this
// rank's shards of its units, so the state the optimizer creates lazily (momentum, Adam's
// moments) exists for the shards alone: 1/size of it, plus at most size-1 padding elements per
// unit. A step is
//   1. a reduce-scatter of each unit's gradients, posted from the post-accumulate-grad hook of
//      the unit's last parameter that backward finishes (Note [Gradient hooks] in
//      torch/optimizer.hpp), so it overlaps the rest of backward; step() (or synchronize())
//      posts the units whose hooks did not all fire, waits for every unit, and the average
//      received (the same prescale, postscale and 16-bit wire format as the allreduce path)
//      becomes the gradient of the shard tensor;
//   2. the optimizer's own step() over the shards;
//   3. an allgather of every shard into the flat parameter buffers, which the model reads.
// Shard::optimizer_state keeps the model's gradients as views into persistent flat buffers
// (Note [Gradient views]): backward accumulates in place, nothing is packed, and after the
// reduce-scatter they are zeroed, as consumed. Shard::gradients instead lets backward allocate
// each gradient, copies it into its unit's buffer in the hook and releases it there; a unit's
// buffer is made by its first gradient and released as soon as its reduce-scatter has read it
// (the hooks check the units in flight), so gradients occupy about the units in flight rather
// than the whole model, and after the step the model holds no gradient at all: the
// gradient of the whole model exists on no rank, as in ZeRO's stage 2. Under
// backward_passes_per_step > 1 the passes before the last accumulate in the model's gradients as
// unsharded; only the last pass's hooks take them.
// Every optimizer whose update is elementwise in the parameters (SGD with momentum and weight
// decay, Adam, AdamW, Adagrad, RMSprop) computes exactly what it computes unsharded, up to the
// summation order of the reduction. LBFGS is refused: its step re-evaluates the loss and keeps
// its history as whole-model vectors. An optimizer that already holds state is refused too: that
// state belongs to the whole parameters, not to a shard.
//
// Refused rather than got wrong: saving the sharded optimizer itself as a checkpoint item and
// broadcast_optimizer_state (each rank holds different state; DistributedOptimizer::gather_state
// is the way to save it, Note [Sharded state in checkpoints] in torch/shard_state.hpp), and
// gradients of a sparse layout.
// Not built: starting the allgather of step 3 early and waiting for it only at the parameters'
// first use in the next forward; sharding over a process set other than the world.
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <algorithm>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dtrain/core/error.hpp"
#include "dtrain/runtime/grouped_collectives.hpp"
#include "dtrain/torch/optimizer_state.hpp"
#include "dtrain/torch/shard_layout.hpp"
#include "dtrain/torch/shard_state.hpp"
#include "dtrain/torch/sharded_optimizers.hpp"
#include "dtrain/torch/tensor.hpp"
#include "dtrain/train/distributed_optimizer.hpp"
#include "dtrain/train/objects.hpp"

namespace dtrain::detail {

class OptimizerShards {
 public:
  // `names`: the optimizer's parameters in parameter-group order, as DistributedOptimizer named
  // them; `unit_bytes`: the unit size (Note [Sharded optimizer state]). Collective: every rank
  // must construct it, with the same parameters and options.
  OptimizerShards(torch::optim::Optimizer& optimizer, const std::vector<std::string>& names,
                  const DistributedOptimizerOptions& options, std::string prefix,
                  std::int64_t unit_bytes)
      : optimizer_(&optimizer),
        options_(options),
        prefix_(std::move(prefix)),
        keep_views_(options.shard == Shard::optimizer_state) {
    const char* mode = keep_views_ ? "Shard::optimizer_state" : "Shard::gradients";
    if (dynamic_cast<torch::optim::LBFGS*>(&optimizer))
      throw InvalidArgumentError(fmt::format(
          "dtrain: DistributedOptimizer: {} cannot shard LBFGS: its step re-evaluates the loss "
          "and keeps its history as vectors of the whole model",
          mode));
    if (!optimizer.state().empty())
      throw InvalidArgumentError(fmt::format(
          "dtrain: DistributedOptimizer: {} needs an optimizer without state, but this one holds "
          "state for {} parameter(s): wrap it before its first step and before loading a "
          "checkpoint into it",
          mode, optimizer.state().size()));
    check_same_parameters_everywhere(names, fmt::format("{}, units of {} bytes", mode, unit_bytes));
    flats_ = lay_out_shards(*optimizer_, names, size(), rank(), unit_bytes, keep_views_);
    units_.resize(flats_.size());
    for (std::size_t u = 0; u < flats_.size(); ++u) {
      units_[u].passes.assign(flats_[u].members.size(), 0);
      units_[u].taken.assign(flats_[u].members.size(), false);
      for (std::size_t j = 0; j < flats_[u].members.size(); ++j)
        where_[flats_[u].members[j].unsafeGetTensorImpl()] = {u, j};
    }
    std::lock_guard lock(sharded_optimizers_mutex());
    sharded_optimizers().insert(optimizer_);
  }

  OptimizerShards(const OptimizerShards&) = delete;
  OptimizerShards& operator=(const OptimizerShards&) = delete;

  ~OptimizerShards() {
    try {
      wait_units();
    } catch (...) {
      // Destructors never throw; the op's error reached (or will reach) its own waiters.
    }
    std::lock_guard lock(sharded_optimizers_mutex());
    sharded_optimizers().erase(optimizer_);
  }

  // From a parameter's post-accumulate-grad hook (autograd's thread): on the last backward pass
  // of a step, takes the gradient into its unit and posts the unit's reduce-scatter once all of
  // its gradients are in. Returns false for a tensor that is not one of the sharded parameters.
  bool on_gradient(const torch::Tensor& param) {
    auto at = where_.find(param.unsafeGetTensorImpl());
    if (at == where_.end()) return false;
    const auto [u, j] = at->second;
    std::lock_guard lock(mutex_);
    auto& unit = units_[u];
    if (unit.pending.valid() || unit.taken[j]) return true;  // a backward after the unit left
    if (++unit.passes[j] < options_.backward_passes_per_step) return true;
    torch::NoGradGuard no_grad;
    release_finished_units();
    take(u, j);
    if (unit.taken_count == flats_[u].members.size()) post(u);
    return true;
  }

  // Step 1 of Note [Sharded optimizer state]: each shard's gradient becomes this rank's slice of
  // the average; the model's gradients are zeroed (optimizer_state) or released (gradients).
  void synchronize() {
    {
      std::lock_guard lock(mutex_);
      torch::NoGradGuard no_grad;
      for (std::size_t u = 0; u < flats_.size(); ++u) {
        if (units_[u].pending.valid()) continue;
        for (std::size_t j = 0; j < flats_[u].members.size(); ++j)
          if (!units_[u].taken[j]) take(u, j);
        post(u);
      }
    }
    wait_units();
    torch::NoGradGuard no_grad;
    for (auto& f : flats_) {
      if (f.wire_out.defined()) f.shard_grad.copy_(f.wire_out);
      auto& grad = f.shard.mutable_grad();
      if (!grad.defined() || grad.data_ptr() != f.shard_grad.data_ptr()) grad = f.shard_grad;
    }
    clear_units();
  }

  // Step 3: every rank's updated shard into every rank's flat parameters (the model's), in
  // place. The input is a copy of the shard: MPI forbids a send buffer inside the receive buffer.
  // One unit at a time: allgathers in flight together fuse, and a fused allgather is staged in a
  // buffer of the size of all of them, the whole model's parameters once more on every rank.
  void gather_parameters() {
    torch::NoGradGuard no_grad;
    for (std::size_t u = 0; u < flats_.size(); ++u) {
      auto& f = flats_[u];
      f.send.copy_(f.shard);
      std::vector<detail::GroupMember> members;
      members.push_back({TensorSource::input(f.send), into(f.params, "allgather")});
      const auto name = flats_.size() == 1 ? prefix_ + ".parameters"
                                           : fmt::format("{}.parameters.{}", prefix_, u);
      Handle(submit_grouped_allgather(std::move(members), CollectiveOptions{name})).wait();
    }
  }

  // Finishes the units a backward without a step posted (every rank posts the same ones, so no
  // rank is left waiting), then zeroes the model's gradients and makes any that backward
  // allocated afresh views into the flat buffers again (optimizer_state), or releases them
  // (gradients).
  void zero_grad() {
    {
      std::lock_guard lock(mutex_);
      torch::NoGradGuard no_grad;
      for (std::size_t u = 0; u < flats_.size(); ++u)
        if (!units_[u].pending.valid() && units_[u].taken_count > 0) {
          for (std::size_t j = 0; j < flats_[u].members.size(); ++j)
            if (!units_[u].taken[j]) take(u, j);
          post(u);
        }
    }
    wait_units();
    clear_units();
    torch::NoGradGuard no_grad;
    for (auto& f : flats_)
      for (std::size_t j = 0; j < f.members.size(); ++j)
        f.members[j].mutable_grad() = keep_views_ ? gradient_view(f, j) : torch::Tensor();
  }

  // The norm (norm_type 2 or infinity) of the whole averaged gradient, from the shards' norms in
  // one allreduce; scales every shard's gradient so that the norm is at most max_norm, as
  // torch::nn::utils::clip_grad_norm_ would on the unsharded gradients. Call after synchronize().
  double clip_grad_norm(double max_norm, double norm_type) {
    torch::NoGradGuard no_grad;
    const bool infinity = std::isinf(norm_type) && norm_type > 0;
    double local = 0;
    for (auto& f : flats_) {
      const auto& g = f.shard.grad();
      if (!g.defined()) continue;
      if (infinity)
        local = std::max(local, g.abs().max().item<double>());
      else
        local += g.to(torch::kFloat64).pow(2).sum().item<double>();
    }
    auto t = torch::full({1}, local, torch::kFloat64);
    AllreduceOptions sum;
    sum.op = infinity ? ReduceOp::Max : ReduceOp::Sum;
    sum.name = prefix_ + ".clip_grad_norm";
    allreduce(t, sum);
    const double total = infinity ? t.item<double>() : std::sqrt(t.item<double>());
    const double coefficient = max_norm / (total + 1e-6);
    if (coefficient < 1)
      for (auto& f : flats_)
        if (f.shard.grad().defined()) f.shard.mutable_grad().mul_(coefficient);
    return total;
  }

  // Collective. Every rank's state of every shard, spread back over each family's parameters
  // whole (Note [Sharded state in checkpoints] in torch/shard_state.hpp).
  OptimizerState gather_state() { return gather_shard_state(*optimizer_, flats_, layout_, prefix_); }

  // Not collective: this rank's shards of a gathered state, on any world size and unit size.
  void load_state(const OptimizerState& state) {
    load_shard_state(*optimizer_, flats_, layout_, state);
  }

  // Elements of this rank's shards (what the optimizer steps).
  std::int64_t shard_numel() const {
    std::int64_t n = 0;
    for (const auto& f : flats_) n += f.shard.numel();
    return n;
  }

 private:
  // An output maker that hands the engine `out` itself, so that a collective writes where the
  // result is used and allocates nothing.
  static OutputMaker into(const torch::Tensor& out, const char* op) {
    return [out, op](const Shape& shape) -> void* {
      const auto numel = dims_product(shape, 0);
      if (numel != out.numel())
        throw InvalidArgumentError(fmt::format(
            "dtrain: DistributedOptimizer: the {} of a shard returned {} elements where {} were "
            "laid out{}",
            op, numel, out.numel(),
            std::string_view(op) == "allgather"
                ? " (a rank that called join() has no shard to give: a sharded optimizer needs "
                  "every rank in every step)"
                : ""));
      return out.data_ptr();
    };
  }

  // Per unit, the state of the current step (guarded by mutex_).
  struct UnitProgress {
    std::vector<int> passes;   // backward passes seen by each member's hook
    std::vector<bool> taken;   // the member's gradient is in the unit's buffer
    std::size_t taken_count = 0;
    Handle pending;            // the unit's reduce-scatter, once posted
    torch::Tensor wire;        // what it reads, alive until it is done
  };

  // Member j's gradient into unit u's buffer (made on the first; zeros where no gradient comes).
  void take(std::size_t u, std::size_t j) {
    auto& f = flats_[u];
    if (!f.grads.defined())
      f.grads = torch::zeros({f.shard.numel() * size()}, f.params.options());
    take_gradient(f, j, keep_views_);
    units_[u].taken[j] = true;
    ++units_[u].taken_count;
  }

  // Posts unit u's reduce-scatter (mutex_ held). Shard::gradients gives the buffer to the op: it
  // is released once the op has read it (release_finished_units, wait_units).
  void post(std::size_t u) {
    auto& f = flats_[u];
    auto& unit = units_[u];
    unit.wire = wire_format(f.grads);
    auto out = unit.wire.scalar_type() == f.shard_grad.scalar_type() ? f.shard_grad : f.wire_out;
    if (!out.defined()) out = f.wire_out = torch::empty({f.shard.numel()}, unit.wire.options());
    std::vector<detail::GroupMember> members;
    members.push_back({TensorSource::input(unit.wire), into(out, "reduce-scatter")});
    ReducescatterOptions rs;
    rs.op = options_.op;
    rs.prescale = 1.0 / options_.gradient_predivide_factor;
    rs.postscale = options_.gradient_predivide_factor;
    rs.name = fmt::format("{}.shards.{}", prefix_, u);
    if (!keep_views_) f.grads = torch::Tensor();
    unit.pending = Handle(submit_grouped_reducescatter(std::move(members), rs));
  }

  // Shard::gradients, from the hooks (mutex_ held): the buffers of units whose reduce-scatter has
  // finished are released while backward still runs.
  void release_finished_units() {
    if (keep_views_) return;
    for (auto& unit : units_)
      if (unit.wire.defined() && unit.pending.valid() && unit.pending.poll()) unit.wire = torch::Tensor();
  }

  // Waits for every posted unit; the first error is rethrown after all have ended.
  void wait_units() {
    std::vector<Handle> pending;
    {
      std::lock_guard lock(mutex_);
      for (auto& unit : units_)
        if (unit.pending.valid()) pending.push_back(unit.pending);
    }
    std::exception_ptr first;
    for (auto& h : pending) {
      try {
        h.wait();
      } catch (...) {
        if (!first) first = std::current_exception();
      }
    }
    if (first) {
      clear_units();
      std::rethrow_exception(first);
    }
  }

  // A new step: no unit posted, no gradient taken; the model's gradients (optimizer_state) zeroed.
  void clear_units() {
    std::lock_guard lock(mutex_);
    torch::NoGradGuard no_grad;
    for (std::size_t u = 0; u < flats_.size(); ++u) {
      auto& unit = units_[u];
      unit = UnitProgress{std::vector<int>(unit.passes.size(), 0),
                          std::vector<bool>(unit.taken.size(), false), 0, {}, {}};
      if (keep_views_)
        flats_[u].grads.zero_();
      else
        flats_[u].grads = torch::Tensor();
    }
  }

  // A rank whose parameters (or sharding options) differ would lay out different shards and
  // reduce unrelated values together: every rank compares every rank's list and names the first
  // difference.
  void check_same_parameters_everywhere(const std::vector<std::string>& names,
                                        const std::string& settings) {
    std::size_t k = 0;
    for (std::size_t g = 0; g < optimizer_->param_groups().size(); ++g)
      for (const auto& p : optimizer_->param_groups()[g].params())
        layout_ += fmt::format("group {} '{}': {}\n", g, names.at(k++), describe_parameter(p));
    auto all = allgather_object(layout_ + settings, prefix_ + ".shard_layout");
    for (std::size_t r = 1; r < all.size(); ++r) {
      if (all[r] == all[0]) continue;
      std::size_t at = 0;
      while (at < all[0].size() && at < all[r].size() && all[0][at] == all[r][at]) ++at;
      auto line = [at](const std::string& s) { return line_at(s, at); };
      throw InvalidArgumentError(fmt::format(
          "dtrain: DistributedOptimizer: a sharded optimizer needs the same parameters and "
          "sharding options on every rank, but rank {} has \"{}\" where rank 0 has \"{}\"",
          r, line(all[r]), line(all[0])));
    }
  }

  torch::Tensor wire_format(const torch::Tensor& grads) const {
    if (options_.compression == Compression::none || grads.scalar_type() == torch::kHalf ||
        grads.scalar_type() == torch::kBFloat16)
      return grads;
    return grads.to(options_.compression == Compression::fp16 ? torch::kHalf : torch::kBFloat16);
  }

  torch::optim::Optimizer* optimizer_;
  DistributedOptimizerOptions options_;
  std::string prefix_;
  bool keep_views_;     // Shard::optimizer_state: the model's gradients are views into the units
  std::string layout_;  // one line per parameter: group, name, dtype, shape
  std::vector<FlatShard> flats_;  // the units
  std::map<const void*, std::pair<std::size_t, std::size_t>> where_;  // parameter: unit, member
  mutable std::mutex mutex_;  // the hooks run on autograd's threads
  std::vector<UnitProgress> units_;
};

}  // namespace dtrain::detail
