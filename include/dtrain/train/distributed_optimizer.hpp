#pragma once
// DistributedOptimizer: wraps an optimizer so that step() first averages the gradients across
// ranks.
//
// Note [Optimizer customization point]
// Any optimizer works if dtrain::optimizer_traits<Opt> provides
//   static void step(Opt&);                 // apply the update from the current gradients
//   static auto gradients(Opt&);            // a range of mutable tensors: the gradients, in an
//                                           // order that is the same on every rank
// The primary template covers types with member functions step() and gradients(). libtorch
// optimizers are covered by <dtrain/torch.hpp>, which also submits gradients from autograd
// hooks as backward produces them.
//
// Note [Gradient accumulation]
// With backward_passes_per_step = k, call step() after every backward pass: the first k-1 calls
// only count (gradients keep accumulating in your buffers, as with plain accumulation), the k-th
// allreduces and applies the update, and step() returns whether it did. As in Horovod the
// accumulated gradient is the sum over the k passes: divide the loss by k for the mean. The count
// carries over epoch boundaries; nothing asserts on a partial window, and synchronize() can be
// called at any time to flush.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "dtrain/core/build_mode.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/range.hpp"
#include "dtrain/runtime/collectives.hpp"
#include "dtrain/train/compression.hpp"
#include "dtrain/train/gradient_hook.hpp"
#include "dtrain/train/step_gate.hpp"

namespace dtrain {

template <class Opt, class Enable = void>
struct optimizer_traits {};

template <class Opt>
  requires requires(Opt& o) {
    o.step();
    o.gradients();
  }
struct optimizer_traits<Opt> {
  static void step(Opt& o) { o.step(); }
  static decltype(auto) gradients(Opt& o) { return o.gradients(); }
};

template <class Opt>
concept Optimizer = requires(Opt& o) {
  optimizer_traits<Opt>::step(o);
  { optimizer_traits<Opt>::gradients(o) } -> Range;
} && MutableTensor<range_value_t<decltype(optimizer_traits<Opt>::gradients(std::declval<Opt&>()))>>;

// What each rank keeps of the optimizer: everything (none); with optimizer_state the state of
// 1/size of the parameters (ZeRO stage 1); with gradients that and, after each unit's
// reduce-scatter, only its own slice of the gradients (ZeRO stage 2). libtorch optimizers; Note
// [Sharded optimizer state] in torch/optimizer_shards.hpp.
enum class Shard : std::uint8_t { none, optimizer_state, gradients };

struct DistributedOptimizerOptions {
  ReduceOp op = ReduceOp::Average;              // Average, Sum or Adasum
  Compression compression = Compression::none;  // 16-bit wire format for float32/float64 gradients
  int backward_passes_per_step = 1;             // see Note [Gradient accumulation]
  double gradient_predivide_factor = 1.0;       // Average only: divide by f before the sum and
                                                // multiply by f/size after (overflow control)
  std::string name = {};                        // group name; empty: generated
  // libtorch hooks only (Note [Gradient buckets] in torch/optimizer.hpp): gradients are submitted
  // in groups of at least this many bytes; 0: each as backward produces it; unset: 25 MiB on
  // GPUs and across hosts, one group per step for CPU gradients on one host.
  std::optional<std::int64_t> bucket_bytes = std::nullopt;
  Shard shard = Shard::none;  // libtorch optimizers only
  // How the gradients travel (Note [Gradient communication hooks] in train/gradient_hook.hpp):
  // unset, compression_hook(compression); set, this hook (compression must then be none).
  std::shared_ptr<GradientHook> hook = nullptr;
};

namespace detail {
DTRAIN_API void validate(const DistributedOptimizerOptions& o);
// The group name of an optimizer's gradients: `given`, or a new "DistributedOptimizer.<n>".
DTRAIN_API std::string optimizer_group_name(const std::string& given);
DTRAIN_API AllreduceOptions gradient_allreduce_options(const DistributedOptimizerOptions& o,
                                                       std::string name);
// The hook an optimizer with these options uses.
DTRAIN_API std::shared_ptr<GradientHook> gradient_hook(const DistributedOptimizerOptions& o);
}  // namespace detail

template <class Opt>
class DistributedOptimizer {
 public:
  // Collective: every rank constructs its DistributedOptimizers in the same order (their names
  // match across ranks) and with the same hook.
  explicit DistributedOptimizer(Opt& optimizer, DistributedOptimizerOptions options = {})
      : optimizer_(&optimizer),
        options_(std::move(options)),
        gate_(options_.backward_passes_per_step) {
    static_assert(Optimizer<Opt>,
                  "dtrain: DistributedOptimizer needs dtrain::optimizer_traits<Opt> (step and "
                  "gradients; see Note [Optimizer customization point]) — or include "
                  "<dtrain/torch.hpp> for libtorch optimizers");
    detail::validate(options_);
    if (options_.shard != Shard::none)
      throw InvalidArgumentError(
          "dtrain: DistributedOptimizerOptions::shard: sharding needs the optimizer's parameters, "
          "which optimizer_traits does not give: it is built for libtorch optimizers "
          "(<dtrain/torch.hpp>) only");
    group_ = detail::optimizer_group_name(options_.name);
    hook_ = detail::gradient_hook(options_);
    detail::check_same_hook_everywhere(*hook_, group_);
  }

  // Counts one backward pass; every backward_passes_per_step-th call allreduces the gradients
  // (unless synchronize() already did, see skip_synchronize) and steps. Returns true if it stepped.
  bool step() {
    return gate_.step([&] { synchronize(); }, [&] { optimizer_traits<Opt>::step(*optimizer_); });
  }

  // Combines the gradients across ranks now (blocking), e.g. to clip them before step().
  void synchronize() {
    GradientBucket bucket;
    bucket.options = detail::gradient_allreduce_options(options_, group_);
    bucket.step = synchronizations_;
    bucket.group = group_;  // every rank's one bucket: fused alike every step
    auto&& grads = optimizer_traits<Opt>::gradients(*optimizer_);
    for (auto& g : grads) {
      bucket.names.push_back(fmt::format("{}.{}", group_, bucket.gradients.size()));
      bucket.gradients.push_back(detail::mutable_view_of(g));
    }
    hook_->start(std::move(bucket))->wait();
    ++synchronizations_;
  }

  // Within the returned scope, the next step() uses the gradients as they are (already
  // synchronized by an explicit synchronize() call) instead of allreducing again.
  using SkipSynchronize = detail::StepGate::SkipScope;
  [[nodiscard]] SkipSynchronize skip_synchronize() { return gate_.skip_synchronize(); }

  Opt& optimizer() noexcept { return *optimizer_; }
  const DistributedOptimizerOptions& options() const noexcept { return options_; }

 private:
  Opt* optimizer_;
  DistributedOptimizerOptions options_;
  std::string group_;
  detail::StepGate gate_;
  std::shared_ptr<GradientHook> hook_;
  std::int64_t synchronizations_ = 0;
};

}  // namespace dtrain

#ifdef DTRAIN_HEADER_ONLY
#include "dtrain/train/distributed_optimizer_impl.hpp"
#endif
