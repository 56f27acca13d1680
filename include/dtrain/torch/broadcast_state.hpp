#pragma once
// Broadcast of a libtorch module's parameters and buffers and of an optimizer's state, and the
// learning rate of every parameter group.
#include <torch/torch.h>

#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "dtrain/torch/sharded_optimizers.hpp"
#include "dtrain/torch/tensor.hpp"
#include "dtrain/train/broadcast_parameters.hpp"
#include "dtrain/train/objects.hpp"

namespace dtrain {

namespace detail {

inline std::vector<std::pair<std::string, torch::Tensor>> to_pairs(
    const torch::OrderedDict<std::string, torch::Tensor>& dict) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& item : dict) out.emplace_back(item.key(), item.value());
  return out;
}

}  // namespace detail

// Parameters and buffers (batch-norm statistics) of a module.
inline void broadcast_module(torch::nn::Module& module, int root_rank = 0) {
  torch::NoGradGuard no_grad;
  auto params = detail::to_pairs(module.named_parameters(true));
  detail::broadcast_named(params, root_rank, "broadcast_module.parameters");
  auto buffers = detail::to_pairs(module.named_buffers(true));
  detail::broadcast_named(buffers, root_rank, "broadcast_module.buffers");
}

// Makes every rank's optimizer state (momentum/Adam buffers, step counts, lr and other options
// of every parameter group) equal to root's, through libtorch's own optimizer serialization, so
// state that root created lazily and other ranks have not created yet is handled.
inline void broadcast_optimizer_state(torch::optim::Optimizer& optimizer, int root_rank = 0) {
  detail::refuse_if_sharded(optimizer, "broadcast_optimizer_state");
  std::string bytes;
  if (rank() == root_rank) {
    torch::serialize::OutputArchive archive;
    optimizer.save(archive);
    std::ostringstream os;
    archive.save_to(os);
    bytes = os.str();
  }
  bytes = broadcast_object(bytes, root_rank, "broadcast_optimizer_state");
  if (rank() == root_rank) return;
  torch::serialize::InputArchive archive;
  std::istringstream is(bytes);
  archive.load_from(is);
  optimizer.load(archive);
  // Optimizer::load restores the state but not the groups' options (lr, momentum, betas, ...) in
  // libtorch 1.13; read those from the same archive into each group's own options.
  torch::serialize::InputArchive groups;
  archive.read("param_groups", groups);
  auto& param_groups = optimizer.param_groups();
  for (std::size_t i = 0; i < param_groups.size(); ++i) {
    torch::serialize::InputArchive group, options;
    groups.read("param_groups/" + std::to_string(i), group);
    group.read("options", options);
    param_groups[i].options().serialize(options);
  }
}

// Sets the learning rate of every parameter group (e.g. from an LrSchedule).
inline void set_learning_rate(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
}

}  // namespace dtrain
