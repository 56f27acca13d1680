#pragma once
#include <atomic>
#include <cmath>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "dtrain/core/error.hpp"
#include "dtrain/train/distributed_optimizer.hpp"

namespace dtrain::detail {

DTRAIN_API void validate(const DistributedOptimizerOptions& o) {
  if (o.op != ReduceOp::Average && o.op != ReduceOp::Sum && o.op != ReduceOp::Adasum)
    throw InvalidArgumentError(fmt::format(
        "dtrain: DistributedOptimizerOptions::op = {}: gradients are combined with Average, Sum "
        "or Adasum",
        o.op));
  if (o.backward_passes_per_step < 1)
    throw InvalidArgumentError(fmt::format(
        "dtrain: DistributedOptimizerOptions::backward_passes_per_step = {}: must be at least 1",
        o.backward_passes_per_step));
  if (!std::isfinite(o.gradient_predivide_factor) || o.gradient_predivide_factor <= 0)
    throw InvalidArgumentError(fmt::format(
        "dtrain: DistributedOptimizerOptions::gradient_predivide_factor = {}: must be a positive "
        "finite number", o.gradient_predivide_factor));
  if (o.bucket_bytes && *o.bucket_bytes < 0)
    throw InvalidArgumentError(fmt::format(
        "dtrain: DistributedOptimizerOptions::bucket_bytes = {}: must be at least 0 (0: each "
        "gradient is submitted as backward produces it)",
        *o.bucket_bytes));
  if (o.shard != Shard::none && o.shard != Shard::optimizer_state && o.shard != Shard::gradients)
    throw InvalidArgumentError(fmt::format(
        "dtrain: DistributedOptimizerOptions::shard = {}: not a Shard (none, optimizer_state or "
        "gradients)",
        static_cast<int>(o.shard)));
  if (o.compression != Compression::none && o.compression != Compression::fp16 &&
      o.compression != Compression::bf16)
    throw InvalidArgumentError(fmt::format(
        "dtrain: DistributedOptimizerOptions::compression = {}: not a Compression (none, fp16 or "
        "bf16)", static_cast<int>(o.compression)));
  if (o.hook && o.compression != Compression::none)
    throw InvalidArgumentError(
        "dtrain: DistributedOptimizerOptions: both hook and compression are set: the hook decides "
        "how gradients travel; for a 16-bit wire format use hook = compression_hook(...) alone");
  if (o.hook && o.shard != Shard::none)
    throw InvalidArgumentError(
        "dtrain: DistributedOptimizerOptions: hook with a Shard: a sharded "
        "optimizer reduce-scatters its gradients and does not call gradient hooks");
  if (o.op == ReduceOp::Adasum && o.compression != Compression::none)
    throw InvalidArgumentError(fmt::format(
        "dtrain: DistributedOptimizerOptions::op = Adasum with compression = {}: Adasum combines "
        "float32 and float64 gradients only, not their 16-bit wire form; set compression = none",
        o.compression == Compression::fp16 ? "fp16" : "bf16"));
  if (o.op == ReduceOp::Adasum && o.shard != Shard::none)
    throw InvalidArgumentError(
        "dtrain: DistributedOptimizerOptions::op = Adasum with a Shard: a sharded "
        "optimizer reduce-scatters its gradients, and Adasum has no reduce-scatter");
  if (o.gradient_predivide_factor != 1.0 && o.op != ReduceOp::Average)
    throw InvalidArgumentError(
        "dtrain: DistributedOptimizerOptions::gradient_predivide_factor applies to "
        "ReduceOp::Average only");
}

DTRAIN_API std::string optimizer_group_name(const std::string& given) {
  static std::atomic<int> counter{0};
  return given.empty() ? fmt::format("DistributedOptimizer.{}", counter.fetch_add(1)) : given;
}

DTRAIN_API AllreduceOptions gradient_allreduce_options(const DistributedOptimizerOptions& o,
                                                       std::string name) {
  AllreduceOptions a;
  a.op = o.op;
  a.prescale = 1.0 / o.gradient_predivide_factor;
  a.postscale = o.gradient_predivide_factor;
  a.name = std::move(name);
  return a;
}

DTRAIN_API std::shared_ptr<GradientHook> gradient_hook(const DistributedOptimizerOptions& o) {
  return o.hook ? o.hook : compression_hook(o.compression);
}
}  // namespace dtrain::detail
