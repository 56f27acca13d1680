#pragma once
// A sharded optimizer's state gathered whole and loaded back in shards (Note [Sharded optimizer
// state] in torch/optimizer_shards.hpp): what DistributedOptimizer::gather_state and load_state
// do in the sharded modes.
//
// Note [Sharded state in checkpoints]
// Checkpoint saves shared items from rank 0 alone (Note [Checkpoint flow]), and a sharded
// optimizer's state is spread over every rank, so it is gathered first, by a collective every
// rank calls: gather_state() allgathers each shard-shaped field of each unit's state (momentum,
// Adam's moments), one at a time, cuts the padding off and joins the units of each family. The
// result describes each family's parameters whole, in order, and is the same on every rank,
// which an elastic commit, written by one rank of each host, needs too. Fields that are not
// shard-shaped (step counts) are equal on every rank and unit and kept as they are. load_state()
// takes its own slice of each field for the world size and the units it runs with: a family
// depends on the parameters alone, never on the world size or the unit size, so state gathered
// on 3 ranks loads on 2 or 4, and with either sharded mode. The cost is the whole state in memory
// on every rank while it is gathered and saved. Per-rank files with a reshard on load would avoid
// that, but need every rank to write and read its own file, which Checkpoint and elastic commits
// do not do.
#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "dtrain/core/error.hpp"
#include "dtrain/runtime/collectives.hpp"
#include "dtrain/runtime/session.hpp"
#include "dtrain/torch/optimizer_state.hpp"
#include "dtrain/torch/shard_layout.hpp"
#include "dtrain/torch/tensor.hpp"
#include "dtrain/train/objects.hpp"

namespace dtrain::detail {

// The units of each family, in order.
inline std::vector<std::vector<std::size_t>> shard_families(const std::vector<FlatShard>& flats) {
  std::vector<std::vector<std::size_t>> out;
  for (std::size_t u = 0; u < flats.size(); ++u) {
    if (flats[u].family >= out.size()) out.resize(flats[u].family + 1);
    out[flats[u].family].push_back(u);
  }
  return out;
}

inline bool shard_shaped(const c10::IValue& value, const FlatShard& f) {
  return value.isTensor() && value.toTensor().dim() == 1 &&
         value.toTensor().numel() == f.shard.numel();
}

inline torch::optim::OptimizerParamState* shard_state_of(torch::optim::Optimizer& optimizer,
                                                          const FlatShard& f) {
  auto it = optimizer.state().find(f.shard.unsafeGetTensorImpl());
  return it == optimizer.state().end() ? nullptr : it->second.get();
}

// The optimizer creates a shard's state object (of its own class) on its first step: one step
// with a learning rate of 0 and zero gradients makes them without moving a parameter, and
// load_state() then overwrites every field.
inline void create_shard_state(torch::optim::Optimizer& optimizer, std::vector<FlatShard>& flats) {
  std::vector<double> lrs;
  for (auto& group : optimizer.param_groups()) {
    lrs.push_back(group.options().get_lr());
    group.options().set_lr(0);
  }
  for (auto& f : flats) {
    f.shard_grad.zero_();
    f.shard.mutable_grad() = f.shard_grad;
  }
  optimizer.step();
  for (std::size_t g = 0; g < lrs.size(); ++g)
    optimizer.param_groups()[g].options().set_lr(lrs[g]);
}

// Collective. Every rank's state of every shard, spread back over each family's parameters
// whole (Note [Sharded state in checkpoints]).
inline OptimizerState gather_shard_state(torch::optim::Optimizer& optimizer,
                                         const std::vector<FlatShard>& flats,
                                         const std::string& layout, const std::string& prefix) {
  torch::NoGradGuard no_grad;
  OptimizerState out;
  out.sharded = true;
  out.layout = layout;
  for (auto& group : optimizer.param_groups()) out.groups.push_back(options_bytes(group));
  for (const auto& units : shard_families(flats)) {
    std::vector<std::string> gathered;
    std::string archive;
    std::vector<std::vector<std::pair<std::string, c10::IValue>>> entries;
    for (auto u : units)
      if (auto* state = shard_state_of(optimizer, flats[u])) entries.push_back(archive_entries(*state));
    if (!entries.empty() && entries.size() != units.size())
      throw InvalidArgumentError(fmt::format(
          "dtrain: DistributedOptimizer::gather_state: the optimizer holds state for {} of the "
          "{} shards of one parameter family: step the optimizer (or load a state) before "
          "gathering",
          entries.size(), units.size()));
    if (!entries.empty()) {
      torch::serialize::OutputArchive whole;
      for (std::size_t e = 0; e < entries.front().size(); ++e) {
        const auto& [key, value] = entries.front()[e];
        if (!shard_shaped(value, flats[units.front()])) {
          whole.write(key, value);
          continue;
        }
        std::vector<torch::Tensor> pieces;
        for (std::size_t k = 0; k < units.size(); ++k) {
          const auto& f = flats[units[k]];
          const auto& mine = entries[k].at(e).second;
          if (entries[k][e].first != key || !shard_shaped(mine, f))
            throw InvalidArgumentError(fmt::format(
                "dtrain: DistributedOptimizer::gather_state: the shards' states differ in "
                "field '{}'",
                key));
          auto all = allgather(mine.toTensor().contiguous(),
                               CollectiveOptions{fmt::format("{}.state.{}.{}", prefix,
                                                             units[k], key)});
          pieces.push_back(all.narrow(0, 0, flat_numel(f)));
        }
        whole.write(key, torch::cat(pieces));
        gathered.push_back(key);
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

// Not collective: this rank's shards of a gathered state, on any world size and unit size.
inline void load_shard_state(torch::optim::Optimizer& optimizer, std::vector<FlatShard>& flats,
                             const std::string& layout, const OptimizerState& state) {
  torch::NoGradGuard no_grad;
  if (!state.sharded)
    throw InvalidArgumentError(
        "dtrain: DistributedOptimizer::load_state: the state was gathered from an unsharded "
        "DistributedOptimizer; this one is sharded");
  if (state.layout != layout)
    throw InvalidArgumentError(fmt::format(
        "dtrain: DistributedOptimizer::load_state: the state belongs to other parameters: it "
        "has {}",
        first_difference(state.layout, layout)));
  const auto family_units = shard_families(flats);
  if (state.flats.size() != family_units.size() ||
      state.gathered.size() != family_units.size() ||
      state.groups.size() != optimizer.param_groups().size())
    throw InvalidArgumentError(
        "dtrain: DistributedOptimizer::load_state: the state's flat buffers do not match this "
        "optimizer's");
  for (std::size_t g = 0; g < state.groups.size(); ++g) {
    torch::serialize::InputArchive in;
    std::istringstream is(state.groups[g]);
    in.load_from(is);
    optimizer.param_groups()[g].options().serialize(in);
  }
  bool missing = false;
  for (std::size_t i = 0; i < family_units.size(); ++i)
    for (auto u : family_units[i])
      missing = missing || (!state.flats[i].empty() && shard_state_of(optimizer, flats[u]) == nullptr);
  if (missing) create_shard_state(optimizer, flats);
  const std::int64_t me = rank();
  for (std::size_t i = 0; i < family_units.size(); ++i) {
    if (state.flats[i].empty()) {
      for (auto u : family_units[i]) optimizer.state().erase(flats[u].shard.unsafeGetTensorImpl());
      continue;
    }
    torch::serialize::InputArchive whole;
    std::istringstream is(state.flats[i]);
    whole.load_from(is);
    std::vector<std::pair<std::string, c10::IValue>> values;
    for (const auto& key : whole.keys()) {
      c10::IValue value;
      whole.read(key, value);
      values.emplace_back(key, std::move(value));
    }
    const auto& gathered = state.gathered[i];
    for (auto u : family_units[i]) {
      const auto& f = flats[u];
      torch::serialize::OutputArchive mine;
      for (const auto& [key, value] : values) {
        if (std::find(gathered.begin(), gathered.end(), key) == gathered.end()) {
          mine.write(key, value);
          continue;
        }
        const auto& all = value.toTensor();
        const std::int64_t family_numel =
            flat_numel(flats[family_units[i].back()]) + flats[family_units[i].back()].base;
        if (all.numel() != family_numel)
          throw InvalidArgumentError(fmt::format(
              "dtrain: DistributedOptimizer::load_state: field '{}' has {} elements where the "
              "parameters have {}",
              key, all.numel(), family_numel));
        const std::int64_t per_rank = f.shard.numel();
        const std::int64_t begin = std::min(me * per_rank, flat_numel(f));
        const std::int64_t end = std::min((me + 1) * per_rank, flat_numel(f));
        auto slice = torch::zeros({per_rank}, all.options());
        slice.narrow(0, 0, end - begin).copy_(all.narrow(0, f.base + begin, end - begin));
        mine.write(key, slice.to(f.shard.device()));
      }
      std::stringstream bytes;
      mine.save_to(bytes);
      torch::serialize::InputArchive in;
      in.load_from(bytes);
      shard_state_of(optimizer, f)->serialize(in);
    }
  }
}

}  // namespace dtrain::detail
