#pragma once
// Which libtorch optimizers hold sharded state (Note [Sharded optimizer state] in
// torch/optimizer_shards.hpp), for the functions that would otherwise treat it as the whole
// model's: checkpoints and broadcast_optimizer_state.
#include <torch/torch.h>

#include <mutex>
#include <set>
#include <string_view>

#include <fmt/format.h>

#include "dtrain/core/error.hpp"

namespace dtrain::detail {

// The optimizers whose parameter groups a sharded DistributedOptimizer has replaced by shards:
// saving or broadcasting their state as if it were the whole model's would be silently wrong.
inline std::mutex& sharded_optimizers_mutex() {
  static std::mutex m;
  return m;
}
inline std::set<const torch::optim::Optimizer*>& sharded_optimizers() {
  static std::set<const torch::optim::Optimizer*> s;
  return s;
}
inline void refuse_if_sharded(const torch::optim::Optimizer& optimizer, std::string_view what) {
  std::lock_guard lock(sharded_optimizers_mutex());
  if (sharded_optimizers().count(&optimizer))
    throw InvalidArgumentError(fmt::format(
        "dtrain: {} of an optimizer wrapped by a sharded DistributedOptimizer "
        "is not built: each rank holds the state of its own shard only (Note [Sharded optimizer "
        "state])",
        what));
}

}  // namespace dtrain::detail
