#pragma once
// DistributedOptimizer for libtorch optimizers.
//
// Note [Gradient hooks]
// A post-accumulate-grad hook on each parameter fires right after backward has written that
// parameter's gradient into .grad(), and puts it in the current bucket; a bucket is handed to the
// gradient hook (Note [Gradient communication hooks] in train/gradient_hook.hpp: by default one
// allreduce per gradient, which the engine fuses) as soon as it holds bucket_bytes, so
// communication of the last layers' gradients can overlap the backward pass of the first layers
// (Note [Gradient buckets]). step() submits what is still held and the gradients whose hook never
// fired (parameters unused in this step: zeros if they have no gradient, so every rank still
// submits the same names), waits for every bucket, and applies the update. zero_grad() submits
// what is held and waits too, so a backward without a step leaves no rank waiting for another.
//
// Note [Gradient buckets]
// Every submission is a point where the ranks meet: the allreduce starts only once every rank has
// submitted, and a rank that is ahead waits for the others. Fewer, larger submissions mean fewer
// meetings; overlap with backward needs some before backward ends. Which wins depends on where the
// reduction runs. On a GPU it runs on a stream beside the compute kernels, and overlap hides it:
// the default for CUDA gradients is 25 MiB buckets, as DDP's bucket_cap_mb. On the host it runs on
// the same cores as backward (the engine thread, MPI's shared-memory copies). Where every rank
// shares one host, the reduction is memory traffic on those cores: overlap moves work rather than
// hiding it, and each meeting costs the rank that arrives first CPU time spent waiting, so the
// default for CPU gradients there is one bucket per backward, submitted by step(); with ranks that
// fill the cores it beat both 25 MiB buckets and a submission per hook on ResNet-20 and ResNet-18
// (docs/performance.md, "Gradient buckets"). Where the job spans hosts, the gradients cross a
// network link that backward does not use, and 25 MiB buckets sent during backward were faster
// than one bucket at every link speed measured, over MPI (3 to 8%) and more over Gloo (8 to 17%;
// docs/scaling.md, experiment 4 on this engine): the CPU default there is 25 MiB too. Set
// bucket_bytes to choose; 0 submits each gradient from its hook.
//
// The hook is libtorch's torch::autograd::PostAccumulateGradHook (libtorch >= 2.1), the hook that
// backs Python's Tensor.register_post_accumulate_grad_hook: it lives in the parameter's own
// autograd metadata and is called by the AccumulateGrad node after accumulating. The C++ frontend
// has no public registration function for it; impl::set_post_acc_grad_hooks is that function, with
// one hook per tensor, so a parameter that already has one (another DistributedOptimizer over the
// same model, say) is refused rather than silently taken over. The alternative, a post-hook on
// impl::grad_accumulator(p), needs the optimizer to keep the accumulator node alive (the tensor
// holds it weakly) and changed type across releases (std::shared_ptr in 1.x, c10::intrusive_ptr
// in 2.x).
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "dtrain/torch/broadcast_state.hpp"
#include "dtrain/torch/optimizer_shards.hpp"
#include "dtrain/torch/serialize.hpp"
#include "dtrain/torch/tensor.hpp"
#include "dtrain/train/broadcast_parameters.hpp"
#include "dtrain/train/distributed_optimizer.hpp"
#include "dtrain/train/objects.hpp"
#include "dtrain/train/step_gate.hpp"

namespace dtrain {

// The gradients of a libtorch optimizer, in parameter-group order (undefined ones become zeros so
// every rank submits the same list). Used by the generic DistributedOptimizer machinery.
template <class Opt>
  requires std::derived_from<Opt, torch::optim::Optimizer>
struct optimizer_traits<Opt> {
  static void step(Opt& o) { o.step(); }
  static std::vector<torch::Tensor> gradients(Opt& o) {
    std::vector<torch::Tensor> grads;
    for (auto& group : o.param_groups())
      for (auto& p : group.params()) {
        if (!p.mutable_grad().defined()) p.mutable_grad() = torch::zeros_like(p);
        grads.push_back(p.mutable_grad());
      }
    return grads;
  }
};

template <class Opt>
  requires std::derived_from<Opt, torch::optim::Optimizer>
class DistributedOptimizer<Opt> {
 public:
  // named_parameters: the model's named parameters (module->named_parameters()); names make the
  // allreduces match across ranks. Every parameter of the optimizer must be named exactly once.
  // Collective: every rank constructs it, with the same options.
  DistributedOptimizer(Opt& optimizer,
                       const torch::OrderedDict<std::string, torch::Tensor>& named_parameters,
                       DistributedOptimizerOptions options = {})
      : optimizer_(&optimizer),
        options_(std::move(options)),
        gate_(options_.backward_passes_per_step) {
    detail::validate(options_);
    prefix_ = detail::optimizer_group_name(options_.name);
    std::map<const void*, std::string> name_of;
    std::set<std::string> seen;
    for (const auto& item : named_parameters) {
      if (item.key().empty())
        throw InvalidArgumentError("dtrain: DistributedOptimizer: a named parameter has an empty name");
      if (!seen.insert(item.key()).second)
        throw InvalidArgumentError(fmt::format(
            "dtrain: DistributedOptimizer: parameter name '{}' appears twice", item.key()));
      name_of[item.value().unsafeGetTensorImpl()] = item.key();
    }
    // Every name is resolved before any hook is registered: a constructor that throws must not
    // leave hooks behind that point into the half-built object.
    std::vector<std::pair<torch::Tensor*, std::string>> resolved;
    for (auto& group : optimizer_->param_groups())
      for (auto& p : group.params()) {
        auto it = name_of.find(p.unsafeGetTensorImpl());
        if (it == name_of.end())
          throw InvalidArgumentError(fmt::format(
              "dtrain: DistributedOptimizer: the optimizer has a parameter of shape [{}] that is "
              "not in named_parameters: pass module->named_parameters() of the module whose "
              "parameters the optimizer updates",
              fmt::join(p.sizes(), ", ")));
        resolved.emplace_back(&p, it->second);
      }
    check_each_parameter_once(resolved);
    adopt(resolved);
  }

  // Without names: parameters are named by their position in the optimizer's groups, which must
  // then be built in the same order on every rank.
  explicit DistributedOptimizer(Opt& optimizer, DistributedOptimizerOptions options = {})
      : optimizer_(&optimizer),
        options_(std::move(options)),
        gate_(options_.backward_passes_per_step) {
    detail::validate(options_);
    prefix_ = detail::optimizer_group_name(options_.name);
    std::vector<std::pair<torch::Tensor*, std::string>> resolved;
    std::size_t g = 0;
    for (auto& group : optimizer_->param_groups()) {
      std::size_t i = 0;
      for (auto& p : group.params())
        resolved.emplace_back(&p, fmt::format("group{}.param{}", g, i++));
      ++g;
    }
    check_each_parameter_once(resolved);
    adopt(resolved);
  }

  DistributedOptimizer(const DistributedOptimizer&) = delete;
  DistributedOptimizer& operator=(const DistributedOptimizer&) = delete;

  ~DistributedOptimizer() {
    try {
      wait_pending();
    } catch (...) {
      // Destructors never throw; the error was (or will be) reported by the op's own waiter.
    }
    for (auto& s : slots_)
      if (s->hooked) torch::autograd::impl::set_post_acc_grad_hooks(s->param, nullptr);
  }

  // Call after every backward pass; see Note [Gradient accumulation]. Returns true if it stepped.
  bool step() {
    return gate_.step([&] { synchronize(); },
                      [&] {
                        optimizer_->step();
                        if (shards_) shards_->gather_parameters();
                      });
  }

  // Completes the allreduce of every gradient now (submitting those whose hook did not fire).
  // Sharded: completes their reduce-scatter, so that this rank's shard holds its part of the
  // average and the model's gradients are zero (Shard::optimizer_state) or released
  // (Shard::gradients; Note [Sharded optimizer state]).
  void synchronize() {
    if (shards_) {
      shards_->synchronize();
      return;
    }
    flush();
    wait_pending();
    for (auto& s : slots_) s->passes = 0;
    ++synchronizations_;
  }

  // Waits for in-flight allreduces before clearing the gradients they write into.
  void zero_grad() {
    submit_held();
    wait_pending();
    optimizer_->zero_grad();
    if (shards_) shards_->zero_grad();
  }

  // After synchronize(): scales the averaged gradients so that their norm (norm_type 2 or
  // infinity) is at most max_norm, as torch::nn::utils::clip_grad_norm_, and returns the norm
  // before scaling. Sharded, the norm is that of the whole gradient, from every rank's shard.
  //   opt.synchronize();
  //   opt.clip_grad_norm(1.0);
  //   { auto skip = opt.skip_synchronize(); opt.step(); }
  double clip_grad_norm(double max_norm, double norm_type = 2.0) {
    if (!(max_norm > 0) || !std::isfinite(max_norm))
      throw InvalidArgumentError(fmt::format(
          "dtrain: DistributedOptimizer::clip_grad_norm: max_norm = {}: must be a positive "
          "finite number", max_norm));
    if (norm_type != 2.0 && !(std::isinf(norm_type) && norm_type > 0))
      throw InvalidArgumentError(fmt::format(
          "dtrain: DistributedOptimizer::clip_grad_norm: norm_type = {}: 2 or infinity",
          norm_type));
    if (shards_) return shards_->clip_grad_norm(max_norm, norm_type);
    std::vector<torch::Tensor> params;
    for (auto& s : slots_) params.push_back(s->param);
    return torch::nn::utils::clip_grad_norm_(params, max_norm, norm_type);
  }

  // Within the returned scope, the next step() uses the gradients as they are (already
  // synchronized by an explicit synchronize() call) instead of allreducing again.
  using SkipSynchronize = detail::StepGate::SkipScope;
  [[nodiscard]] SkipSynchronize skip_synchronize() { return gate_.skip_synchronize(); }

  // Collective: the optimizer's whole state, to save as a shared checkpoint item; sharded, it is
  // gathered from every rank (Note [Sharded state in checkpoints]). Unsharded, it is the
  // optimizer's own state, as saving the optimizer itself would be.
  //   checkpoint.save(progress, {{"model", *model}, {"optimizer", opt.gather_state()}});
  //   resumed->load("model", *model); opt.load_state(resumed->get<dtrain::OptimizerState>(...));
  OptimizerState gather_state() {
    if (shards_) return shards_->gather_state();
    OptimizerState out;
    out.whole = detail::optimizer_state_bytes(*optimizer_);
    return out;
  }

  // Not collective: this rank's part of a gathered state, whatever world size gathered it.
  void load_state(const OptimizerState& state) {
    if (shards_) return shards_->load_state(state);
    if (state.sharded)
      throw InvalidArgumentError(
          "dtrain: DistributedOptimizer::load_state: the state was gathered from a "
          "sharded DistributedOptimizer; this one is unsharded");
    detail::load_optimizer_state(*optimizer_, state.whole);
  }

  Opt& optimizer() noexcept { return *optimizer_; }
  const DistributedOptimizerOptions& options() const noexcept { return options_; }

 private:
  struct Slot {
    torch::Tensor param;
    std::string name;
    bool hooked = false;
    std::mutex mutex;  // the hook runs on autograd's thread
    int passes = 0;
    bool held = false;       // in the bucket, not yet submitted
    bool submitted = false;  // handed to the gradient hook this step
  };

  // Note [Gradient hooks]
  class Hook final : public torch::autograd::PostAccumulateGradHook {
   public:
    Hook(DistributedOptimizer* owner, Slot* slot) : owner_(owner), slot_(slot) {}
    void operator()(const torch::autograd::Variable&) override { owner_->on_gradient(*slot_); }

   private:
    DistributedOptimizer* owner_;
    Slot* slot_;
  };

  // A parameter listed twice would get two hooks that reduce the same gradient twice, concurrently.
  // One that already has a post-accumulate hook belongs to someone else (Note [Gradient hooks]).
  static void check_each_parameter_once(
      const std::vector<std::pair<torch::Tensor*, std::string>>& params) {
    std::map<const void*, const std::string*> first;
    for (const auto& [p, name] : params) {
      if (p->requires_grad() && torch::autograd::impl::post_acc_grad_hooks(*p))
        throw InvalidArgumentError(fmt::format(
            "dtrain: DistributedOptimizer: parameter '{}' (shape [{}]) already has a "
            "post-accumulate-grad hook, set by another DistributedOptimizer over the same "
            "parameters or by other code: wrap each parameter in one DistributedOptimizer",
            name, fmt::join(p->sizes(), ", ")));
      auto [it, inserted] = first.emplace(p->unsafeGetTensorImpl(), &name);
      if (!inserted)
        throw InvalidArgumentError(fmt::format(
            "dtrain: DistributedOptimizer: parameter '{}' (shape [{}]) appears more than once in "
            "the optimizer's parameter groups (also as '{}'): list each parameter once",
            name, fmt::join(p->sizes(), ", "), *it->second));
    }
  }

  // Collective in every mode: the sharded layout checks the parameters, the unsharded the hook.
  // Sharded, the hooks post each unit's reduce-scatter (Note [Sharded optimizer state]).
  void adopt(std::vector<std::pair<torch::Tensor*, std::string>>& resolved) {
    // The tensors themselves (they share the parameters' storage and autograd metadata): laying
    // out the shards replaces the optimizer's parameter lists the pointers point into.
    std::vector<std::pair<torch::Tensor, std::string>> params;
    for (auto& [p, name] : resolved) params.emplace_back(*p, name);
    if (options_.shard != Shard::none) {
      std::vector<std::string> names;
      bool on_device = false;
      for (auto& [p, name] : resolved) {
        names.push_back(name);
        on_device = on_device || !p->is_cpu();
      }
      const std::int64_t unit_bytes = options_.bucket_bytes.value_or(
          options_.shard == Shard::gradients || on_device ? kBucketBytes : host_bucket_bytes_);
      shards_ = std::make_unique<detail::OptimizerShards>(*optimizer_, names, options_, prefix_,
                                                          unit_bytes);
    } else {
      detail::check_same_hook_everywhere(*hook_, prefix_);
    }
    for (auto& [p, name] : params) add_parameter(p, std::move(name));
  }

  void add_parameter(torch::Tensor& p, std::string name) {
    auto slot = std::make_unique<Slot>();
    slot->param = p;
    slot->name = std::move(name);
    if (p.requires_grad()) {
      torch::autograd::impl::set_post_acc_grad_hooks(p, std::make_unique<Hook>(this, slot.get()));
      slot->hooked = true;
    }
    slots_.push_back(std::move(slot));
  }

  void on_gradient(Slot& s) {
    if (shards_) {
      shards_->on_gradient(s.param);
      return;
    }
    std::int64_t bytes = 0, capacity = 0;
    {
      std::lock_guard lock(s.mutex);
      if (++s.passes < options_.backward_passes_per_step || s.submitted || s.held) return;
      const auto& grad = s.param.grad();
      capacity = options_.bucket_bytes.value_or(
          grad.defined() && !grad.is_cpu() ? kBucketBytes : host_bucket_bytes_);
      s.held = true;  // with capacity 0, the bucket below is full at once
      if (grad.defined()) bytes = grad.numel() * static_cast<std::int64_t>(grad.element_size());
    }
    std::vector<Slot*> full;
    {
      std::lock_guard lock(bucket_mutex_);
      bucket_.push_back(&s);
      bucket_fill_ += bytes;
      if (bucket_fill_ < capacity) return;
      full.swap(bucket_);
      bucket_fill_ = 0;
    }
    submit_unsubmitted(full);
  }

  // Submits every gradient not yet submitted this step: the held ones first, in the order their
  // hooks fired (backward order), then those whose hook never fired.
  void flush() {
    submit_held();
    submit_unsubmitted(slots_);
  }

  void submit_held() {
    std::vector<Slot*> held;
    {
      std::lock_guard lock(bucket_mutex_);
      held.swap(bucket_);
      bucket_fill_ = 0;
    }
    submit_unsubmitted(held);
  }

  // Hands the gradients of `slots` not yet submitted this step to the hook, as one bucket.
  template <class Slots>
  void submit_unsubmitted(const Slots& slots) {
    GradientBucket bucket;
    bucket.options = detail::gradient_allreduce_options(options_, "");
    torch::NoGradGuard no_grad;
    for (const auto& s : slots) {
      std::lock_guard lock(s->mutex);
      if (s->submitted) continue;
      s->submitted = true;
      s->held = false;
      auto& grad = s->param.mutable_grad();
      if (!grad.defined()) grad = torch::zeros_like(s->param);
      if (!grad.is_contiguous()) grad = grad.contiguous();
      bucket.gradients.push_back(detail::mutable_view_of(grad));
      bucket.names.push_back(fmt::format("{}.{}", prefix_, s->name));
    }
    if (bucket.gradients.empty()) return;
    bucket.step = synchronizations_.load();
    auto work = hook_->start(std::move(bucket));
    std::lock_guard lock(pending_mutex_);
    pending_.push_back(std::move(work));
  }

  void wait_pending() {
    std::vector<std::unique_ptr<PendingGradients>> pending;
    {
      std::lock_guard lock(pending_mutex_);
      pending.swap(pending_);
    }
    std::exception_ptr first;
    for (auto& work : pending) {
      try {
        work->wait();
      } catch (...) {
        if (!first) first = std::current_exception();
      }
    }
    for (auto& s : slots_) {
      std::lock_guard lock(s->mutex);
      s->submitted = false;
    }
    if (first) std::rethrow_exception(first);
  }

  // Note [Gradient buckets]
  static constexpr std::int64_t kBucketBytes = std::int64_t{25} << 20;
  static constexpr std::int64_t kWholeBackward = std::numeric_limits<std::int64_t>::max();
  static std::int64_t host_default_bucket_bytes() {
    const bool spans_hosts = dtrain::is_initialized() && dtrain::local_size() < dtrain::size();
    return spans_hosts ? kBucketBytes : kWholeBackward;
  }

  Opt* optimizer_;
  DistributedOptimizerOptions options_;
  std::string prefix_;
  detail::StepGate gate_;
  std::vector<std::unique_ptr<Slot>> slots_;
  std::mutex bucket_mutex_;
  std::vector<Slot*> bucket_;  // held gradients, in the order their hooks fired
  std::int64_t bucket_fill_ = 0;
  std::int64_t host_bucket_bytes_ = host_default_bucket_bytes();  // CPU gradients' default
  std::unique_ptr<detail::OptimizerShards> shards_;  // Shard::optimizer_state or gradients
  std::shared_ptr<GradientHook> hook_ = detail::gradient_hook(options_);
  std::atomic<std::int64_t> synchronizations_{0};
  std::mutex pending_mutex_;
  std::vector<std::unique_ptr<PendingGradients>> pending_;  // started buckets
};

// Class template argument deduction does not see a partial specialization's constructors.
template <class Opt>
  requires std::derived_from<Opt, torch::optim::Optimizer>
DistributedOptimizer(Opt&, const torch::OrderedDict<std::string, torch::Tensor>&,
                     DistributedOptimizerOptions = {}) -> DistributedOptimizer<Opt>;

}  // namespace dtrain
