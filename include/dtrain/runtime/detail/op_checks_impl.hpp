#pragma once
// Definitions of runtime/detail/op_checks.hpp (Note [Build modes] in core/build_mode.hpp).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dtrain/core/error.hpp"
#include "dtrain/runtime/detail/op_checks.hpp"
#include "dtrain/runtime/device_registry.hpp"
#include "dtrain/runtime/handle.hpp"

namespace dtrain::detail {

DTRAIN_API void check_tensor(Request& q, std::int64_t numel, bool has_data) {
  const auto op = to_string(q.kind);
  if (numel < 0)
    throw InvalidArgumentError(fmt::format("dtrain: {} '{}': negative element count {}", op, q.name, numel));
  if (!is_valid(q.dtype))
    throw InvalidArgumentError(fmt::format("dtrain: {} '{}': invalid dtype value {}", op, q.name,
                                           static_cast<int>(q.dtype)));
  std::int64_t product = numel;
  try {
    if (!q.shape.empty()) product = detail::numel(q.shape);
  } catch (const InvalidArgumentError& e) {
    // Name the op and the tensor too: the shape alone does not say which call was wrong.
    constexpr std::string_view prefix = "dtrain: ";
    std::string_view why = e.what();
    if (why.starts_with(prefix)) why.remove_prefix(prefix.size());
    throw InvalidArgumentError(fmt::format("dtrain: {} '{}': {}", op, q.name, why));
  }
  if (q.shape.empty()) q.shape = {numel};
  else if (product != numel)
    throw InvalidArgumentError(fmt::format(
        "dtrain: {} '{}': shape [{}] has {} elements but the tensor reports {}", op, q.name,
        fmt::join(q.shape, ", "), product, numel));
  if (numel > 0 && !has_data)
    throw InvalidArgumentError(fmt::format("dtrain: {} '{}': tensor data is null but it has {} elements",
                                           op, q.name, numel));
  if (q.device.is_cuda() && !device_backend_factory())
    throw InvalidArgumentError(fmt::format(
        "dtrain: {} '{}': the tensor is on {}, but this program was built without dtrain's CUDA "
        "support: include <dtrain/cuda.hpp> and link dtrain::cuda",
        op, q.name, q.device));
}

// What Adasum is built for (Note [Adasum tree] in runtime/detail/adasum_tree.hpp).
inline void check_adasum(const Request& q) {
  if (q.kind != OpKind::allreduce)
    throw InvalidArgumentError(fmt::format(
        "dtrain: {} '{}': ReduceOp::Adasum is defined for allreduce and grouped_allreduce only: "
        "its result is one combined vector, not a sum that can be scattered; use ReduceOp::Sum or "
        "ReduceOp::Average",
        q.kind, q.name));
  if (q.dtype != DataType::float32 && q.dtype != DataType::float64)
    throw InvalidArgumentError(fmt::format(
        "dtrain: allreduce '{}': ReduceOp::Adasum is built for float32 and float64 tensors only, "
        "and this one is {}{}",
        q.name, q.dtype,
        is_floating_point(q.dtype) ? " (convert 16-bit gradients to float32 first)"
                                   : " (it scales by dot products, which an integer cannot hold)"));
  if (q.device.is_cuda())
    throw InvalidArgumentError(fmt::format(
        "dtrain: allreduce '{}': ReduceOp::Adasum on a tensor on {}: Adasum runs on host memory "
        "only (dtrain has no device path for it); copy the tensor to the CPU first",
        q.name, q.device));
}

DTRAIN_API void check_reduction(const Request& q, ReduceOp op, double prescale, double postscale) {
  for (const auto& [label, factor] : {std::pair{"prescale", prescale}, std::pair{"postscale", postscale}})
    if (!std::isfinite(factor))
      throw InvalidArgumentError(fmt::format("dtrain: {} '{}': the {} factor is {}; scale factors "
                                             "must be finite numbers",
                                             q.kind, q.name, label, factor));
  if (op == ReduceOp::Adasum) check_adasum(q);
  if (!is_floating_point(q.dtype) && (op == ReduceOp::Average || prescale != 1.0 || postscale != 1.0))
    throw InvalidArgumentError(fmt::format(
        "dtrain: {} '{}': {} on an integer tensor ({}): Average and scale factors are defined for "
        "floating-point tensors only (they would truncate). Use ReduceOp::Sum and divide yourself.",
        q.kind, q.name,
        op == ReduceOp::Average ? "ReduceOp::Average" : "a scale factor other than 1",
        q.dtype));
  if (static_cast<int>(op) > static_cast<int>(ReduceOp::Adasum))
    throw InvalidArgumentError(fmt::format("dtrain: {} '{}': invalid ReduceOp value {}",
                                           q.kind, q.name, static_cast<int>(op)));
}


DTRAIN_API void check_root(const Request& q, int root_rank, const SetOfOp& set) {
  const auto& ranks = *set.ranks;
  if (std::binary_search(ranks.begin(), ranks.end(), root_rank)) return;
  const int world_size = set.id == 0 ? static_cast<int>(ranks.size()) : 0;
  if (set.id == 0)
    throw InvalidArgumentError(fmt::format(
        "dtrain: broadcast '{}': root rank {} is out of range: the world has {} ranks (0..{})",
        q.name, root_rank, world_size, world_size - 1));
  throw InvalidArgumentError(fmt::format(
      "dtrain: broadcast '{}' on process set {}: root rank {} is not a member of the set (ranks "
      "[{}]); the root is the world rank (dtrain::rank()) of one of its members",
      q.name, set.id, root_rank, fmt::join(ranks, ", ")));
}

DTRAIN_API void check_splits(const Request& q, std::span<const std::int64_t> splits,
                             const SetOfOp& set) {
  const int ranks = static_cast<int>(set.ranks->size());
  std::int64_t sum = 0;
  for (auto v : splits) {
    if (v < 0)
      throw InvalidArgumentError(fmt::format("dtrain: alltoall '{}': negative split in [{}]",
                                             q.name, fmt::join(splits, ", ")));
    sum += v;
  }
  if (static_cast<int>(splits.size()) != ranks)
    throw InvalidArgumentError(fmt::format(
        "dtrain: alltoall '{}': {} splits given but {} has {} ranks: give one row count per "
        "destination rank{}",
        q.name, splits.size(),
        set.id == 0 ? std::string("the world") : fmt::format("process set {}", set.id), ranks,
        set.id == 0 ? "" : ", in the set's rank order"));
  if (sum != q.dim0())
    throw InvalidArgumentError(fmt::format(
        "dtrain: alltoall '{}': splits [{}] add up to {} rows but the tensor has {} rows (dim 0)",
        q.name, fmt::join(splits, ", "), sum, q.dim0()));
}

DTRAIN_API std::shared_ptr<Entry> new_entry(Request q) {
  auto e = std::make_shared<Entry>();
  e->request = std::move(q);
  e->state = make_op_state();
  return e;
}

}  // namespace dtrain::detail
