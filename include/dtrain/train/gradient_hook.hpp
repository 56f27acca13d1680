#pragma once
// Gradient communication hooks: what a DistributedOptimizer does with its gradients.
//
// Note [Gradient communication hooks]
// A DistributedOptimizer does not call allreduce itself: it hands its gradients, a bucket at a
// time, to a GradientHook, and the hook decides how they travel. start() begins the
// communication and returns the pending work; once wait() returns, every gradient of the bucket
// holds the combined value (for the built-in hooks: what allreduce with the bucket's options
// gives). The libtorch optimizer starts a bucket as soon as backward has filled it (Note [Gradient
// buckets] in torch/optimizer.hpp) and waits for all of them in step(); the generic one starts one
// bucket with every gradient in synchronize().
//
// The same seam carries every way of moving gradients: the plain allreduce (allreduce_hook()),
// the 16-bit wire formats (compression_hook(Compression::fp16 / bf16): float32/float64 gradients
// are narrowed into buffers the hook keeps, reduced, and widened back; on CUDA with the device
// kernels of <dtrain/cuda.hpp>, on the gradient's stream), and hooks of your own: PowerSGD
// (train/powersgd.hpp) is one. c10d's communication hooks and Horovod's Compressor are the
// models; unlike Horovod's, a hook sees a whole bucket, so it can batch its communication.
//
// Rules a hook follows:
//  - Each gradient has its own op name (bucket.names), the same on every rank whatever the bucket
//    it travels in: the engine meets the ranks by name, so buckets may be cut differently on
//    different ranks. A hook names every op it submits after the gradient it serves (or, where
//    bucket.group is set, the bucket as a whole after the group).
//  - start() may run on autograd's threads while another bucket's work is in flight; a hook that
//    keeps state guards it.
//  - Buffers belong to the optimizer until wait() returns; destroying pending work that was never
//    waited for waits for it first.
//  - settings() describes the hook's kind and settings. The optimizer compares it across ranks
//    before the first bucket and fails on every rank if they differ: mixed hooks would combine
//    numbers that do not mean the same thing.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dtrain/core/build_mode.hpp"
#include "dtrain/runtime/collective_options.hpp"
#include "dtrain/tensor/traits.hpp"
#include "dtrain/tensor/view.hpp"
#include "dtrain/train/compression.hpp"

namespace dtrain {

// Gradients to combine, in place.
struct GradientBucket {
  std::vector<TensorView> gradients;
  std::vector<std::string> names;  // one op name per gradient, as above
  AllreduceOptions options;        // op, prescale and postscale the optimizer asks for (name unused)
  std::int64_t step = 0;           // synchronizations the optimizer completed before this one
  // Set when every rank hands this same bucket under this name (the generic optimizer's one
  // bucket): a hook may then submit it as one grouped op, fused the same way every step, which
  // keeps the sums' rounding, and so the results, the same from run to run.
  std::string group = {};
};

class PendingGradients {
 public:
  virtual ~PendingGradients() = default;
  // Blocks until the bucket's gradients hold their combined values; rethrows the first error.
  virtual void wait() = 0;
};

class GradientHook {
 public:
  virtual ~GradientHook() = default;
  virtual std::unique_ptr<PendingGradients> start(GradientBucket bucket) = 0;
  virtual std::string settings() const = 0;
};

// Each gradient allreduced as it is.
DTRAIN_API std::shared_ptr<GradientHook> allreduce_hook();
// float32 and float64 gradients travel as float16 (fp16) or bfloat16 (bf16); other dtypes as
// they are. Compression::none gives allreduce_hook().
DTRAIN_API std::shared_ptr<GradientHook> compression_hook(Compression c);

namespace detail {

template <class T>
TensorView mutable_view_of(T& t) {
  return TensorView(traits_of<T>::mutable_data(t), traits_of<T>::numel(t), traits_of<T>::dtype(t),
                    traits_of<T>::device(t), shape_of(t), stream_of(t));
}

// Collective: throws on every rank, naming the ranks, unless `hook` has the same settings()
// everywhere. `owner` names the optimizer in the error.
DTRAIN_API void check_same_hook_everywhere(const GradientHook& hook, const std::string& owner);

}  // namespace detail
}  // namespace dtrain

#ifdef DTRAIN_HEADER_ONLY
#include "dtrain/train/gradient_hook_impl.hpp"
#endif
