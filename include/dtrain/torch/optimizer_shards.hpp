#pragma once
// The sharded mode of DistributedOptimizer for libtorch (DistributedOptimizerOptions::shard =
// Shard::optimizer_state): each rank keeps the optimizer state of 1/size of the parameters.
//
// Note [Sharded optimizer state]
// ZeRO's first stage (Rajbhandari et al., SC'20). The parameters of each (parameter group, dtype,
// device) are laid out in one flat buffer, padded to a multiple of the world size and cut into
// size equal shards; a parameter may straddle two shards. The model's parameters become views into
// the flat buffer and their gradients views into a second one, so backward accumulates in place
// (Note [Gradient views]) and nothing is packed. The user's optimizer keeps its parameter groups
// and their options, but each group's parameter list is replaced by this rank's shards, so the
// state the optimizer creates lazily (momentum, Adam's moments) exists for the shard alone: 1/size
// of it, plus at most size-1 padding elements per flat buffer. A step is
//   1. a reduce-scatter of each flat gradient buffer: this rank receives its shard's average (the
//      same prescale, postscale and 16-bit wire format as the allreduce path), which becomes the
//      gradient of the shard tensor; the model's gradients are then zeroed, as consumed;
//   2. the optimizer's own step() over the shards;
//   3. an allgather of every shard into the flat parameter buffers, which the model reads.
// Every optimizer whose update is elementwise in the parameters (SGD with momentum and weight
// decay, Adam, AdamW, Adagrad, RMSprop) computes exactly what it computes unsharded, up to the
// summation order of the reduction. LBFGS is refused: its step re-evaluates the loss and keeps
// its history as whole-model vectors. An optimizer that already holds state is refused too: that
// state belongs to the whole parameters, not to a shard.
//
// Refused rather than got wrong: saving the sharded optimizer itself as a checkpoint item and
// broadcast_optimizer_state (each rank holds different state; DistributedOptimizer::gather_state
// is the way to save it, Note [Sharded state in checkpoints]), and gradients of a sparse layout.
// Not built yet: the reduce-scatter runs when step() (or synchronize()) is called, after backward,
// not overlapped with it; the gradients are not sharded during backward (ZeRO's second stage).
//
// Note [Sharded state in checkpoints]
// Checkpoint saves shared items from rank 0 alone (Note [Checkpoint flow]), and a sharded
// optimizer's state is spread over every rank, so it is gathered first, by a collective every
// rank calls: gather_state() allgathers each shard-shaped field of each shard's state (momentum,
// Adam's moments), one at a time, and cuts the padding off. The result describes the flat
// buffers whole and is the same on every rank, which an elastic commit, written by one rank of
// each host, needs too. Fields that are not shard-shaped (step counts) are equal on every rank
// and kept as they are. load_state() takes its own slice of each field for the world size it
// runs on: the flat layout depends on the parameters alone, never on the world size, so state
// gathered on 3 ranks loads on 2 or 4. The cost is the whole state in memory on every rank while
// it is gathered and saved. Per-rank files with a reshard on load would avoid that, but need
// every rank to write and read its own file, which Checkpoint and elastic commits do not do.
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <algorithm>
#include <map>
#include <sstream>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dtrain/core/error.hpp"
#include "dtrain/runtime/grouped_collectives.hpp"
#include "dtrain/torch/optimizer_state.hpp"
#include "dtrain/torch/shard_layout.hpp"
#include "dtrain/torch/sharded_optimizers.hpp"
#include "dtrain/torch/tensor.hpp"
#include "dtrain/train/distributed_optimizer.hpp"
#include "dtrain/train/objects.hpp"

namespace dtrain::detail {

class OptimizerShards {
 public:
  // `names`: the optimizer's parameters in parameter-group order, as DistributedOptimizer named
  // them. Collective: every rank must construct it, with the same parameters.
  OptimizerShards(torch::optim::Optimizer& optimizer, const std::vector<std::string>& names,
                  const DistributedOptimizerOptions& options, std::string prefix)
      : optimizer_(&optimizer), options_(options), prefix_(std::move(prefix)) {
    if (dynamic_cast<torch::optim::LBFGS*>(&optimizer))
      throw InvalidArgumentError(
          "dtrain: DistributedOptimizer: Shard::optimizer_state cannot shard LBFGS: its step "
          "re-evaluates the loss and keeps its history as vectors of the whole model");
    if (!optimizer.state().empty())
      throw InvalidArgumentError(fmt::format(
          "dtrain: DistributedOptimizer: Shard::optimizer_state needs an optimizer without state, "
          "but this one holds state for {} parameter(s): wrap it before its first step and "
          "before loading a checkpoint into it",
          optimizer.state().size()));
    check_same_parameters_everywhere(names);
    flats_ = lay_out_shards(*optimizer_, names, size(), rank());
    std::lock_guard lock(sharded_optimizers_mutex());
    sharded_optimizers().insert(optimizer_);
  }

  OptimizerShards(const OptimizerShards&) = delete;
  OptimizerShards& operator=(const OptimizerShards&) = delete;

  ~OptimizerShards() {
    std::lock_guard lock(sharded_optimizers_mutex());
    sharded_optimizers().erase(optimizer_);
  }

  // Step 1 of Note [Sharded optimizer state]: each shard's gradient becomes this rank's slice of
  // the average; the model's gradients are zeroed.
  void synchronize() {
    torch::NoGradGuard no_grad;
    std::vector<torch::Tensor> wires;  // alive until the op ends: the members refer to them
    wires.reserve(flats_.size());
    std::vector<detail::GroupMember> members;
    for (auto& f : flats_) {
      gather_gradients(f);
      const auto& wire = wires.emplace_back(wire_format(f.grads));
      auto out = wire.scalar_type() == f.shard_grad.scalar_type() ? f.shard_grad : f.wire_out;
      if (!out.defined()) out = f.wire_out = torch::empty({f.shard.numel()}, wire.options());
      members.push_back({TensorSource::input(wire), into(out, "reduce-scatter")});
    }
    ReducescatterOptions rs;
    rs.op = options_.op;
    rs.prescale = 1.0 / options_.gradient_predivide_factor;
    rs.postscale = options_.gradient_predivide_factor;
    rs.name = prefix_ + ".shards";
    Handle(submit_grouped_reducescatter(std::move(members), rs)).wait();
    for (auto& f : flats_) {
      if (f.wire_out.defined()) f.shard_grad.copy_(f.wire_out);
      auto& grad = f.shard.mutable_grad();
      if (!grad.defined() || grad.data_ptr() != f.shard_grad.data_ptr()) grad = f.shard_grad;
      f.grads.zero_();
    }
  }

  // Step 3: every rank's updated shard into every rank's flat parameters (the model's), in
  // place. The input is a copy of the shard: MPI forbids a send buffer inside the receive buffer.
  void gather_parameters() {
    torch::NoGradGuard no_grad;
    std::vector<detail::GroupMember> members;
    for (auto& f : flats_) {
      f.send.copy_(f.shard);
      members.push_back({TensorSource::input(f.send), into(f.params, "allgather")});
    }
    Handle(submit_grouped_allgather(std::move(members), CollectiveOptions{prefix_ + ".parameters"}))
        .wait();
  }

  // Zeroes the model's gradients, and makes any that backward allocated afresh (after a
  // zero_grad() that set them to undefined) views into the flat buffer again.
  void zero_grad() {
    torch::NoGradGuard no_grad;
    for (auto& f : flats_) {
      f.grads.zero_();
      for (std::size_t j = 0; j < f.members.size(); ++j)
        f.members[j].mutable_grad() = gradient_view(f, j);
    }
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

  // Collective. Every rank's state of every shard, spread back over the whole flat buffers
  // (Note [Sharded state in checkpoints]).
  OptimizerState gather_state() {
    torch::NoGradGuard no_grad;
    OptimizerState out;
    out.sharded = true;
    out.layout = layout_;
    for (auto& group : optimizer_->param_groups()) out.groups.push_back(options_bytes(group));
    for (std::size_t i = 0; i < flats_.size(); ++i) {
      auto& f = flats_[i];
      std::vector<std::string> gathered;
      std::string archive;
      if (auto* state = state_of(f)) {
        torch::serialize::OutputArchive whole;
        auto entries = archive_entries(*state);
        for (auto& [key, value] : entries) {
          if (value.isTensor() && value.toTensor().dim() == 1 &&
              value.toTensor().numel() == f.shard.numel()) {
            auto all = allgather(value.toTensor().contiguous(),
                                 CollectiveOptions{fmt::format("{}.state.{}.{}", prefix_, i, key)});
            whole.write(key, all.narrow(0, 0, flat_numel(f)).clone());
            gathered.push_back(key);
          } else {
            whole.write(key, value);
          }
        }
        std::ostringstream os;
        whole.save_to(os);
        archive = std::move(os).str();
      }
      out.flats.push_back(std::move(archive));
      out.gathered.push_back(std::move(gathered));
    }
    return out;
  }

  // Not collective: this rank's shard of a gathered state, on any world size.
  void load_state(const OptimizerState& state) {
    torch::NoGradGuard no_grad;
    if (!state.sharded)
      throw InvalidArgumentError(
          "dtrain: DistributedOptimizer::load_state: the state was gathered from an unsharded "
          "DistributedOptimizer; this one has Shard::optimizer_state");
    if (state.layout != layout_)
      throw InvalidArgumentError(fmt::format(
          "dtrain: DistributedOptimizer::load_state: the state belongs to other parameters: it "
          "has {}",
          first_difference(state.layout, layout_)));
    if (state.flats.size() != flats_.size() || state.gathered.size() != flats_.size() ||
        state.groups.size() != optimizer_->param_groups().size())
      throw InvalidArgumentError(
          "dtrain: DistributedOptimizer::load_state: the state's flat buffers do not match this "
          "optimizer's");
    for (std::size_t g = 0; g < state.groups.size(); ++g) {
      torch::serialize::InputArchive in;
      std::istringstream is(state.groups[g]);
      in.load_from(is);
      optimizer_->param_groups()[g].options().serialize(in);
    }
    bool missing = false;
    for (std::size_t i = 0; i < flats_.size(); ++i)
      missing = missing || (!state.flats[i].empty() && state_of(flats_[i]) == nullptr);
    if (missing) create_state();
    const std::int64_t me = rank();
    for (std::size_t i = 0; i < flats_.size(); ++i) {
      auto& f = flats_[i];
      if (state.flats[i].empty()) {
        optimizer_->state().erase(f.shard.unsafeGetTensorImpl());
        continue;
      }
      torch::serialize::InputArchive whole;
      std::istringstream is(state.flats[i]);
      whole.load_from(is);
      torch::serialize::OutputArchive mine;
      const auto& gathered = state.gathered[i];
      for (const auto& key : whole.keys()) {
        c10::IValue value;
        whole.read(key, value);
        if (std::find(gathered.begin(), gathered.end(), key) == gathered.end()) {
          mine.write(key, value);
          continue;
        }
        const auto& all = value.toTensor();
        const std::int64_t per_rank = f.shard.numel();
        const std::int64_t begin = std::min(me * per_rank, all.numel());
        const std::int64_t end = std::min((me + 1) * per_rank, all.numel());
        auto slice = torch::zeros({per_rank}, all.options());
        slice.narrow(0, 0, end - begin).copy_(all.narrow(0, begin, end - begin));
        mine.write(key, slice.to(f.shard.device()));
      }
      std::stringstream bytes;
      mine.save_to(bytes);
      torch::serialize::InputArchive in;
      in.load_from(bytes);
      state_of(f)->serialize(in);
    }
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

  // A rank whose parameters differ would lay out different shards and reduce unrelated values
  // together: every rank compares every rank's list and names the first difference.
  void check_same_parameters_everywhere(const std::vector<std::string>& names) {
    std::size_t k = 0;
    for (std::size_t g = 0; g < optimizer_->param_groups().size(); ++g)
      for (const auto& p : optimizer_->param_groups()[g].params())
        layout_ += fmt::format("group {} '{}': {}\n", g, names.at(k++), describe_parameter(p));
    auto all = allgather_object(layout_, prefix_ + ".shard_layout");
    for (std::size_t r = 1; r < all.size(); ++r) {
      if (all[r] == all[0]) continue;
      std::size_t at = 0;
      while (at < all[0].size() && at < all[r].size() && all[0][at] == all[r][at]) ++at;
      auto line = [at](const std::string& s) { return line_at(s, at); };
      throw InvalidArgumentError(fmt::format(
          "dtrain: DistributedOptimizer: Shard::optimizer_state needs the same parameters on "
          "every rank, but rank {} has \"{}\" where rank 0 has \"{}\"",
          r, line(all[r]), line(all[0])));
    }
  }

  torch::optim::OptimizerParamState* state_of(const FlatShard& f) const {
    auto it = optimizer_->state().find(f.shard.unsafeGetTensorImpl());
    return it == optimizer_->state().end() ? nullptr : it->second.get();
  }

  // The optimizer creates a shard's state object (of its own class) on its first step: one step
  // with a learning rate of 0 and zero gradients makes them without moving a parameter, and
  // load_state() then overwrites every field.
  void create_state() {
    std::vector<double> lrs;
    for (auto& group : optimizer_->param_groups()) {
      lrs.push_back(group.options().get_lr());
      group.options().set_lr(0);
    }
    for (auto& f : flats_) {
      f.shard_grad.zero_();
      f.shard.mutable_grad() = f.shard_grad;
    }
    optimizer_->step();
    for (std::size_t g = 0; g < lrs.size(); ++g)
      optimizer_->param_groups()[g].options().set_lr(lrs[g]);
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
  std::string layout_;  // one line per parameter: group, name, dtype, shape
  std::vector<FlatShard> flats_;
};

}  // namespace dtrain::detail
