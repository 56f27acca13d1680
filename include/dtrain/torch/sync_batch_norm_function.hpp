#pragma once
// The autograd function behind dtrain::SyncBatchNorm (torch/sync_batch_norm.hpp): batch
// normalization whose statistics, and the gradient sums that flow back through them, are reduced
// across the ranks.
//
// Note [Synchronized batch norm]
// N ranks with batches x_1 .. x_N must normalize as one process would with their concatenation.
// Forward: each rank computes, per channel, the sum and the sum of squares of its values and its
// count of values per channel; one allreduce (Sum) of the flat tensor
//   [sum (C values), sum of squares (C values), count]
// gives every rank the global mean and biased variance. The count travels with the sums, so ranks
// may hold different batch sizes, and a rank with an empty batch contributes zeros and still takes
// part: every rank submits the same op, so none waits for another. Backward: with
// x^ = (x - mean) * invstd, the gradient of the input is
//   dx = w * invstd * (dy - sum(dy) / n - x^ * sum(dy * x^) / n)
// where the sums and n run over the global batch, so one more allreduce of the flat tensor
// [sum(dy) (C values), sum(dy * x^) (C values)] gives every rank its rows of what one process
// would compute. The gradients of weight and bias are this rank's own sums: the optimizer's
// gradient allreduce adds them up like every other parameter's (as PyTorch's SyncBatchNorm does),
// so N ranks with batch b and a loss averaged over the rank's batch get the gradients one process
// gets with batch N*b and the loss averaged over it.
//
// Numerics: the sum of squares cancels badly when the mean is large against the spread (var =
// E[x^2] - mean^2). Each rank therefore takes its mean and variance from libtorch's batch-norm
// statistics kernel (accurate, in the input's precision, float at least), and the sums are rebuilt
// from them in float64: sum = n*mean, sum of squares = n*(var + mean^2). The allreduce and the
// global mean and variance are float64, so the cancellation costs float64 rounding, not float32's.
// The per-element work runs in libtorch's fused batch-norm kernels, in float (double for double
// inputs; float16 and bfloat16 inputs are normalized in float and returned in their dtype): the
// output through the inference kernel fed the global statistics, this rank's two gradient sums
// through the backward reduction fed them too, and dx, per channel an affine function of dy and
// x, in two fused passes. What SyncBatchNorm adds to libtorch's BatchNorm is then the two
// allreduces and a few per-channel operations (docs/performance.md, "SyncBatchNorm").
//
// The global count is read on the host after the allreduce (a device synchronization for CUDA
// tensors, as in PyTorch's SyncBatchNorm): one value per channel over every rank is an error on
// every rank (the variance is undefined, as libtorch's BatchNorm says), and an empty global batch
// returns an empty output without statistics. Backward always takes part in its allreduce, even
// where the input needs no gradient, so that no rank depends on another's autograd graph to know
// whether to communicate. Backward's collectives run in autograd's order, which is the same on
// every rank that ran the same forward.
#include <torch/torch.h>

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dtrain/runtime/collectives.hpp"
#include "dtrain/torch/tensor.hpp"

namespace dtrain::detail {

// What one synchronized forward needs besides its tensors, and what it reports back to the module
// (the statistics its running averages are updated from).
struct SyncBatchNormStep {
  double eps = 1e-5;
  std::string name;  // the ops are "<name>.statistics" and "<name>.gradients"
  // Set by forward: the global statistics (float64, one value per channel) and value count.
  torch::Tensor mean;
  torch::Tensor unbiased_var;
  double count = 0;
};

// A per-channel vector shaped to broadcast against an input of `input_dim` dimensions.
inline torch::Tensor per_channel(const torch::Tensor& v, std::int64_t input_dim) {
  std::vector<std::int64_t> shape(static_cast<std::size_t>(input_dim), 1);
  shape[1] = v.size(0);
  return v.view(shape);
}

// float for 16- and 32-bit inputs, double for double.
inline torch::ScalarType compute_type(torch::ScalarType input) {
  return input == torch::kDouble ? torch::kDouble : torch::kFloat;
}

// The one place the module's collectives are described (Note [SyncBatchNorm and process sets] in
// torch/sync_batch_norm.hpp).
inline void allreduce_flat(torch::Tensor& flat, const std::string& name, const char* suffix) {
  allreduce(flat, AllreduceOptions{.op = ReduceOp::Sum, .name = name + suffix});
}

class SyncBatchNormFunction : public torch::autograd::Function<SyncBatchNormFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& input,
                               const std::optional<torch::Tensor>& weight,
                               const std::optional<torch::Tensor>& bias, SyncBatchNormStep& step) {
    const auto channels = input.size(1);
    const auto compute = compute_type(input.scalar_type());
    const auto x = input.to(compute);
    const auto local_count = input.numel() / channels;

    // Note [Synchronized batch norm]: [sum, sum of squares, count], float64.
    auto flat = torch::zeros({2 * channels + 1}, input.options().dtype(torch::kDouble));
    if (local_count > 0) {
      // libtorch's batch-norm statistics kernel: the batch's mean and biased variance.
      const auto [mean, var] = at::batch_norm_update_stats(x, {}, {}, 0.0);
      const auto n = static_cast<double>(local_count);
      const auto mean64 = mean.to(torch::kDouble);
      flat.narrow(0, 0, channels).copy_(mean64 * n);
      flat.narrow(0, channels, channels).copy_((var.to(torch::kDouble) + mean64 * mean64) * n);
      flat.narrow(0, 2 * channels, 1).fill_(n);
    }
    allreduce_flat(flat, step.name, ".statistics");
    const double count = flat[2 * channels].item<double>();
    if (count == 1)
      throw InvalidArgumentError(fmt::format(
          "dtrain::SyncBatchNorm '{}': expected more than 1 value per channel over all ranks "
          "when training, got 1 (input sizes [{}] on this rank): the variance of one value is "
          "undefined; use a larger batch or eval()",
          step.name, fmt::join(input.sizes(), ", ")));
    step.count = count;
    ctx->saved_data["count"] = count;
    ctx->saved_data["name"] = step.name;
    ctx->saved_data["eps"] = step.eps;
    if (count == 0) {  // every rank's batch is empty: nothing to normalize
      ctx->save_for_backward({input, weight.value_or(torch::Tensor()), torch::Tensor(),
                              torch::Tensor()});
      return input.clone();
    }

    const auto mean = flat.narrow(0, 0, channels) / count;
    const auto var = (flat.narrow(0, channels, channels) / count - mean * mean).clamp_min(0.0);
    step.mean = mean;
    step.unbiased_var = var * (count / (count - 1));
    const auto mean_c = mean.to(compute), var_c = var.to(compute);
    // The global statistics through libtorch's own (fused) inference kernel: x * scale + shift.
    auto output = torch::batch_norm(x, weight ? weight->to(compute) : torch::Tensor(),
                                    bias ? bias->to(compute) : torch::Tensor(), mean_c, var_c,
                                    /*training=*/false, /*momentum=*/0.0, step.eps,
                                    /*cudnn_enabled=*/true);
    ctx->save_for_backward({input, weight.value_or(torch::Tensor()), mean_c,
                            (var_c + step.eps).rsqrt()});
    return output.to(input.scalar_type());
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const auto& input = saved[0];
    const auto& weight = saved[1];
    const double count = ctx->saved_data["count"].toDouble();
    const bool affine = weight.defined();
    // The forward inputs that are variables: input, then weight and bias when affine.
    const bool want_input = ctx->needs_input_grad(0);
    const bool want_weight = affine && ctx->needs_input_grad(1);
    const bool want_bias = affine && ctx->needs_input_grad(2);
    if (count == 0) {  // every rank's batch was empty: every gradient is empty or zero
      return {want_input ? torch::zeros_like(input) : torch::Tensor(),
              want_weight ? torch::zeros_like(weight) : torch::Tensor(),
              want_bias ? torch::zeros_like(weight) : torch::Tensor(), torch::Tensor()};
    }

    const auto& mean = saved[2];  // the compute dtype, as x and dy below
    const auto& invstd = saved[3];
    const auto dim = input.dim();
    const auto channels = input.size(1);
    const auto compute = compute_type(input.scalar_type());
    const auto x = input.to(compute);
    const auto dy = grad_outputs[0].to(compute);
    // This rank's sum(dy) and sum(dy * x^), by libtorch's fused batch-norm backward reduction.
    torch::Tensor sum_dy_x_hat, sum_dy;
    if (input.numel() > 0) {
      std::tie(std::ignore, sum_dy_x_hat, sum_dy) = at::native_batch_norm_backward(
          dy, x, {}, {}, {}, mean, invstd, /*train=*/true, ctx->saved_data["eps"].toDouble(),
          {false, true, true});
    } else {
      sum_dy_x_hat = torch::zeros({channels}, mean.options());
      sum_dy = torch::zeros({channels}, mean.options());
    }

    auto flat = torch::cat({sum_dy, sum_dy_x_hat}).to(torch::kDouble);
    allreduce_flat(flat, ctx->saved_data["name"].toStringRef(), ".gradients");

    torch::Tensor grad_input;
    if (want_input) {
      // dx = a * (dy - sum(dy)/n - x^ * sum(dy x^)/n) with a = w * invstd, per channel an affine
      // function of dy and x: a * dy + c * x + d, two fused passes.
      const auto mean64 = mean.to(torch::kDouble), invstd64 = invstd.to(torch::kDouble);
      const auto a = affine ? invstd64 * weight.to(torch::kDouble) : invstd64;
      const auto k = flat.narrow(0, channels, channels) / count * invstd64;
      const auto c = -a * k;
      const auto d = a * (mean64 * k - flat.narrow(0, 0, channels) / count);
      grad_input = torch::addcmul(per_channel(d.to(compute), dim), x,
                                  per_channel(c.to(compute), dim))
                       .addcmul_(dy, per_channel(a.to(compute), dim))
                       .to(input.scalar_type());
    }
    return {grad_input, want_weight ? sum_dy_x_hat.to(weight.scalar_type()) : torch::Tensor(),
            want_bias ? sum_dy.to(weight.scalar_type()) : torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace dtrain::detail
