#pragma once
// dtrain::SyncBatchNorm: batch normalization whose batch statistics are computed over every rank's
// batch, so that N ranks with batch b normalize, train and track running statistics as one process
// with batch N*b (Note [Synchronized batch norm] in torch/sync_batch_norm_function.hpp). A
// torch::nn module like libtorch's BatchNorm1d/2d/3d, for inputs [N, C] or [N, C, *]:
//
//   dtrain::SyncBatchNorm bn(dtrain::SyncBatchNormOptions(64).momentum(0.01));
//   auto y = bn(x);                           // training: two small allreduces per step
//   bn->eval(); auto z = bn(x);               // the running statistics, no communication
//
// or convert an existing model's BatchNorm layers (torch/convert_sync_batchnorm.hpp), or, where a
// model declares its norms as members (which no conversion can redirect), write
// dtrain::SyncBatchNorm2d where it says torch::nn::BatchNorm2d (below). Its parameters and buffers
// carry libtorch's names (weight, bias, running_mean, running_var, num_batches_tracked), so state
// saved from a BatchNorm model loads into the synchronized one.
//
// Note [SyncBatchNorm op names]
// Every rank must submit the same ops under the same names. A module's collectives are named
// "<name>.statistics" (forward) and "<name>.gradients" (backward), the same every step, so the
// engine's response cache recognizes them. `name` defaults to "sync_batch_norm.<k>", k counting
// the modules this process has constructed: equal on every rank that builds the same model in the
// same order. convert_sync_batchnorm names each module by its path in the model, which does not
// depend on what else a rank has built. clone() keeps the name: a clone and its original may both
// be used, one after the other, as every op of theirs completes before forward or backward
// returns.
//
// Note [SyncBatchNorm and process sets]
// The statistics are reduced over the world. Process sets (SPEC §12) will add one field,
// `process_set`, to SyncBatchNormOptions; it reaches the collectives through
// detail::allreduce_flat, the one function that describes them, and backward finds it next to
// the op name in the autograd context.
#include <torch/torch.h>

#include <atomic>
#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dtrain/runtime/collectives.hpp"
#include "dtrain/torch/sync_batch_norm_function.hpp"

namespace dtrain {

struct SyncBatchNormOptions {
  /* implicit */ SyncBatchNormOptions(std::int64_t num_features) : num_features_(num_features) {}
  // Channels: the size of dim 1 of the input.
  TORCH_ARG(std::int64_t, num_features);
  TORCH_ARG(double, eps) = 1e-5;
  // Weight of the current batch in the running statistics; unset: their cumulative average.
  TORCH_ARG(std::optional<double>, momentum) = 0.1;
  TORCH_ARG(bool, affine) = true;  // a learned scale (weight) and shift (bias) per channel
  TORCH_ARG(bool, track_running_stats) = true;
  // Prefix of the module's op names (Note [SyncBatchNorm op names]); empty: generated.
  TORCH_ARG(std::string, name) = {};
};

// Tensors a SyncBatchNorm takes over instead of creating its own (convert_sync_batchnorm hands it
// a BatchNorm's, so an optimizer built over the old module still updates the new one).
struct SyncBatchNormState {
  torch::Tensor weight, bias, running_mean, running_var, num_batches_tracked;
};

namespace detail {

inline std::string generated_sync_batch_norm_name() {
  static std::atomic<std::int64_t> constructed{0};
  return fmt::format("sync_batch_norm.{}", constructed.fetch_add(1));
}

// The options of a libtorch BatchNorm of any dimension, as SyncBatchNormOptions (name generated).
inline SyncBatchNormOptions sync_batch_norm_options(const torch::nn::BatchNormOptions& o) {
  return SyncBatchNormOptions(o.num_features())
      .eps(o.eps())
      .momentum(o.momentum())
      .affine(o.affine())
      .track_running_stats(o.track_running_stats());
}

}  // namespace detail

class SyncBatchNormImpl : public torch::nn::Cloneable<SyncBatchNormImpl> {
 public:
  explicit SyncBatchNormImpl(SyncBatchNormOptions options) : options(std::move(options)) {
    validate_options();
    reset();
  }
  explicit SyncBatchNormImpl(std::int64_t num_features)
      : SyncBatchNormImpl(SyncBatchNormOptions(num_features)) {}
  // libtorch's BatchNorm options (BatchNorm1dOptions, BatchNorm2dOptions, BatchNorm3dOptions are
  // all this type): what lets SyncBatchNorm2d stand where a model constructs a BatchNorm2d.
  explicit SyncBatchNormImpl(const torch::nn::BatchNormOptions& options)
      : SyncBatchNormImpl(detail::sync_batch_norm_options(options)) {}
  // Takes over `state`'s tensors; each must fit the options (undefined where they have none).
  SyncBatchNormImpl(SyncBatchNormOptions options, SyncBatchNormState state)
      : options(std::move(options)) {
    validate_options();
    adopt(std::move(state));
  }

  // New parameters and buffers (libtorch's reset, which clone() calls).
  void reset() override {
    const auto c = options.num_features();
    SyncBatchNormState fresh;
    if (options.affine()) {
      fresh.weight = torch::ones({c}).requires_grad_();
      fresh.bias = torch::zeros({c}).requires_grad_();
    }
    if (options.track_running_stats()) {
      fresh.running_mean = torch::zeros({c});
      fresh.running_var = torch::ones({c});
      fresh.num_batches_tracked = torch::tensor(0, torch::kLong);
    }
    adopt(std::move(fresh));
  }

  void reset_running_stats() {
    if (!options.track_running_stats()) return;
    torch::NoGradGuard no_grad;
    running_mean.zero_();
    running_var.fill_(1);
    num_batches_tracked.zero_();
  }

  void reset_parameters() {
    reset_running_stats();
    if (!options.affine()) return;
    torch::NoGradGuard no_grad;
    weight.fill_(1);
    bias.zero_();
  }

  // input: [N, C] or [N, C, *]. Training: normalized with the statistics of every rank's batch
  // (collective: every rank calls it, in the same order as its other SyncBatchNorms). Eval: with
  // the running statistics (or, without them, this rank's batch), communicating nothing.
  torch::Tensor forward(const torch::Tensor& input) {
    if (!is_training()) {
      check_input(input);
      const bool running = options.track_running_stats();
      return torch::batch_norm(input, weight, bias, running ? running_mean : torch::Tensor(),
                               running ? running_var : torch::Tensor(), /*training=*/!running,
                               /*momentum=*/0.0, options.eps(), /*cudnn_enabled=*/true);
    }
    checked_or_rejected(input);
    detail::SyncBatchNormStep step;
    step.eps = options.eps();
    step.name = options.name();
    auto output = detail::SyncBatchNormFunction::apply(
        input, options.affine() ? std::optional<torch::Tensor>(weight) : std::nullopt,
        options.affine() ? std::optional<torch::Tensor>(bias) : std::nullopt, step);
    if (options.track_running_stats()) update_running_stats(step);
    return output;
  }

  void pretty_print(std::ostream& stream) const override {
    stream << std::boolalpha << "dtrain::SyncBatchNorm(" << options.num_features()
           << ", eps=" << options.eps() << ", momentum=";
    if (options.momentum())
      stream << *options.momentum();
    else
      stream << "None";
    stream << ", affine=" << options.affine()
           << ", track_running_stats=" << options.track_running_stats() << ", name='"
           << options.name() << "')";
  }

  SyncBatchNormOptions options;
  torch::Tensor weight, bias;  // undefined without affine
  torch::Tensor running_mean, running_var, num_batches_tracked;  // undefined without tracking

 private:
  void validate_options() {
    if (options.num_features() < 1)
      throw InvalidArgumentError(fmt::format(
          "dtrain::SyncBatchNormOptions::num_features = {}: must be at least 1",
          options.num_features()));
    if (!(options.eps() > 0))
      throw InvalidArgumentError(fmt::format(
          "dtrain::SyncBatchNormOptions::eps = {}: must be positive", options.eps()));
    if (options.momentum() && !(*options.momentum() >= 0 && *options.momentum() <= 1))
      throw InvalidArgumentError(fmt::format(
          "dtrain::SyncBatchNormOptions::momentum = {}: must lie in [0, 1] (unset: a cumulative "
          "average)", *options.momentum()));
    if (options.name().empty()) options.name(detail::generated_sync_batch_norm_name());
  }

  // Registers the state under libtorch's BatchNorm names, undefined where the options have none.
  void adopt(SyncBatchNormState s) {
    const auto c = options.num_features();
    auto fits = [&](const torch::Tensor& t, bool wanted, const char* what,
                    std::int64_t numel) {
      if (t.defined() != wanted || (wanted && t.numel() != numel))
        throw InvalidArgumentError(fmt::format(
            "dtrain::SyncBatchNorm '{}': {} must be {} (num_features {}, affine {}, "
            "track_running_stats {}), got {}",
            options.name(), what, wanted ? fmt::format("{} values", numel) : "undefined", c,
            options.affine(), options.track_running_stats(),
            t.defined() ? fmt::format("[{}]", fmt::join(t.sizes(), ", ")) : "undefined"));
    };
    fits(s.weight, options.affine(), "weight", c);
    fits(s.bias, options.affine(), "bias", c);
    fits(s.running_mean, options.track_running_stats(), "running_mean", c);
    fits(s.running_var, options.track_running_stats(), "running_var", c);
    fits(s.num_batches_tracked, options.track_running_stats(), "num_batches_tracked", 1);
    weight = register_parameter("weight", s.weight,
                                options.affine() ? s.weight.requires_grad() : false);
    bias = register_parameter("bias", s.bias, options.affine() ? s.bias.requires_grad() : false);
    running_mean = register_buffer("running_mean", s.running_mean);
    running_var = register_buffer("running_var", s.running_var);
    num_batches_tracked = register_buffer("num_batches_tracked", s.num_batches_tracked);
  }

  // Local checks. In training the peers are waiting for this rank's statistics: a failure submits
  // the op as rejected, so their forward fails too instead of waiting (Note [Failed ops]).
  void checked_or_rejected(const torch::Tensor& input) {
    std::string why;
    try {
      check_input(input);
    } catch (const InvalidArgumentError& e) {
      why = e.what();
    }
    if (why.empty()) return;
    detail::reject_allreduce(options.name() + ".statistics", why, "dtrain::SyncBatchNorm");
    throw InvalidArgumentError(why);
  }

  void check_input(const torch::Tensor& input) const {
    auto fail = [&](const std::string& what) {
      throw InvalidArgumentError(fmt::format("dtrain::SyncBatchNorm '{}' ({} features): {}",
                                             options.name(), options.num_features(), what));
    };
    if (!input.defined()) fail("the input is an undefined tensor");
    if (input.dim() < 2)
      fail(fmt::format("expected an input [N, C] or [N, C, *], got sizes [{}]",
                       fmt::join(input.sizes(), ", ")));
    if (input.size(1) != options.num_features())
      fail(fmt::format("expected {} channels (dim 1), got sizes [{}]", options.num_features(),
                       fmt::join(input.sizes(), ", ")));
    if (!input.is_floating_point())
      fail(fmt::format("expected a floating-point input, got {}",
                       std::string(c10::toString(input.scalar_type()))));
    for (const auto* t : {&weight, &running_mean})
      if (t->defined() && t->device() != input.device())
        fail(fmt::format("the input is on {} and the module on {}: move one of them",
                         input.device().str(), t->device().str()));
  }

  // libtorch's BatchNorm update: every training step counts; the statistics of an empty global
  // batch leave the averages alone.
  void update_running_stats(const detail::SyncBatchNormStep& step) {
    torch::NoGradGuard no_grad;
    num_batches_tracked += 1;
    if (step.count == 0) return;
    const double factor = options.momentum()
                              ? *options.momentum()
                              : 1.0 / num_batches_tracked.item<double>();
    running_mean.copy_(running_mean.to(torch::kDouble) * (1 - factor) + step.mean * factor);
    running_var.copy_(running_var.to(torch::kDouble) * (1 - factor) +
                      step.unbiased_var * factor);
  }
};

TORCH_MODULE(SyncBatchNorm);

// Drop-ins for a model that declares its norms as members, the shape convert_sync_batchnorm must
// refuse (Note [Replacing modules in libtorch]): replace libtorch's type by dtrain's where the
// model declares the member and where it constructs it, and change nothing else:
//
//   torch::nn::BatchNorm2d bn{nullptr};   ->   dtrain::SyncBatchNorm2d bn{nullptr};
//   bn = register_module("bn", torch::nn::BatchNorm2d(torch::nn::BatchNorm2dOptions(64)));
//     ->   bn = register_module("bn", dtrain::SyncBatchNorm2d(torch::nn::BatchNorm2dOptions(64)));
//
// They are SyncBatchNorm, under the names a model already uses: the same options (or a number of
// features), forward, parameter and buffer names (a BatchNorm2d model's state loads), and
// as<dtrain::SyncBatchNorm>() finds them. Like SyncBatchNorm they take inputs [N, C, *] of any
// rank, where libtorch's check the rank (2 or 3 for 1d, 4 for 2d, 5 for 3d).
using SyncBatchNorm1d = SyncBatchNorm;
using SyncBatchNorm2d = SyncBatchNorm;
using SyncBatchNorm3d = SyncBatchNorm;

}  // namespace dtrain
