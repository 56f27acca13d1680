// DistributedOptimizer over a framework-free model (std::vector weights and gradients, hand-written
// SGD): every distributed run is compared with a single-process reference computed on every rank
// from the same data, so each check has a closed-form expectation.
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dtrain/dtrain.hpp"
#include "train/plain_model.hpp"
#include "train/train_test_util.hpp"

namespace {

using namespace train_test;
using dtrain::Compression;
using dtrain::DistributedOptimizer;
using dtrain::DistributedOptimizerOptions;
using dtrain::ReduceOp;

constexpr std::int64_t kDatasetSize = 101;  // not a multiple of 2, 3 or 4 ranks: padded shards
constexpr std::int64_t kBatch = 2;          // per rank
constexpr double kLr = 0.05;
constexpr double kMomentum = 0.9;
// Distributed and reference runs differ only in the order of float64 sums (a few ulps per step).
constexpr double kExactTolerance = 1e-12;

// Every rank's shard of the dataset, as DistributedSampler(shuffle = false) hands them out, so
// the single-process reference can see the union of all ranks' batches.
struct Shards {
  std::vector<std::vector<std::int64_t>> of_rank;

  Shards() {
    for (int k = 0; k < world_size(); ++k)
      of_rank.push_back(dtrain::DistributedSampler(kDatasetSize, world_size(), k, false).indices());
  }
  // Rank k's batch number t (per-rank batch size kBatch).
  std::span<const std::int64_t> batch(int k, std::int64_t t) const {
    return std::span<const std::int64_t>(of_rank[k]).subspan(t * kBatch, kBatch);
  }
  // What one process with batch passes·N·kBatch sees at step t: every rank's batches
  // t·passes … t·passes + passes - 1.
  std::vector<std::int64_t> global_batch(std::int64_t t, int passes = 1) const {
    std::vector<std::int64_t> out;
    for (int k = 0; k < world_size(); ++k)
      for (int j = 0; j < passes; ++j) {
        auto b = batch(k, t * passes + j);
        out.insert(out.end(), b.begin(), b.end());
      }
    return out;
  }
  std::int64_t batches_per_rank() const {
    return static_cast<std::int64_t>(of_rank[0].size()) / kBatch;
  }
};

// Scales the gradients to global L2 norm `max_norm` if it is larger; returns the norm before.
double clip_grad_norm(Params& grads, double max_norm) {
  double sq = 0;
  for (const auto& g : grads)
    for (double v : g) sq += v * v;
  const double norm = std::sqrt(sq);
  if (norm > max_norm)
    for (auto& g : grads)
      for (double& v : g) v *= max_norm / norm;
  return norm;
}

// One process, batch passes·N·kBatch per step (the mean loss over it), optional clipping.
Params reference_run(const Shards& shards, int steps, int passes = 1, double clip = 0,
                     double lr = kLr) {
  Sgd ref(init_params(0), lr, kMomentum);
  for (int t = 0; t < steps; ++t) {
    ref.zero_grad();
    const auto batch = shards.global_batch(t, passes);
    accumulate_gradients(ref.params, ref.grads, batch, 1.0 / static_cast<double>(batch.size()));
    if (clip > 0) clip_grad_norm(ref.grads, clip);
    ref.step();
  }
  return ref.params;
}

// Each rank starts from its own weights; broadcast_parameters makes them root 0's (init_params(0)),
// the reference's starting point.
Sgd make_local_model(double lr = kLr) {
  Sgd sgd(init_params(world_rank()), lr, kMomentum);
  dtrain::broadcast_parameters(sgd.params, 0);
  return sgd;
}

// N ranks, batch kBatch each, `steps` steps of DistributedOptimizer with `options`.
Params distributed_run(const Shards& shards, int steps, DistributedOptimizerOptions options,
                       double lr = kLr) {
  Sgd sgd = make_local_model(lr);
  DistributedOptimizer<Sgd> opt(sgd, options);
  for (int t = 0; t < steps; ++t) {
    sgd.zero_grad();
    accumulate_gradients(sgd.params, sgd.grads, shards.batch(world_rank(), t), 1.0 / kBatch);
    CHECK(opt.step());
  }
  CHECK(sgd.steps == steps);
  return sgd.params;
}

// Every element of every gradient is a value of the 16-bit wire type, widened.
bool all_representable(const Params& grads, Compression c) {
  for (const auto& g : grads)
    for (double v : g) {
      const float f = static_cast<float>(v);
      const float back = c == Compression::fp16 ? static_cast<float>(dtrain::float16_t(f))
                                                : static_cast<float>(dtrain::bfloat16_t(f));
      if (static_cast<double>(back) != v) return false;
    }
  return true;
}

}  // namespace

TEST_CASE("N ranks with batch b step to the same weights as one process with batch N*b") {
  dtrain::init();
  const Shards shards;
  const int steps = 5;
  REQUIRE(shards.batches_per_rank() >= steps);
  const Params want = reference_run(shards, steps);
  const Params got = distributed_run(shards, steps, {});
  check_close(got, want, kExactTolerance, "weights after 5 averaged steps");
  // The check can fail: training moved the weights far beyond the tolerance.
  CHECK(max_rel_error(want, init_params(0)) > 1e-3);
  for (const auto& t : got) CHECK(same_on_all_ranks(t.data(), t.size() * sizeof(double)));
}

TEST_CASE("ReduceOp::Sum adds the per-rank gradients: lr/N with Sum equals lr with Average") {
  dtrain::init();
  const Shards shards;
  const int steps = 4;
  const Params want = reference_run(shards, steps);
  DistributedOptimizerOptions sum;
  sum.op = ReduceOp::Sum;
  const Params got = distributed_run(shards, steps, sum, kLr / world_size());
  check_close(got, want, kExactTolerance, "weights after 4 summed steps at lr/N");
}

TEST_CASE("backward_passes_per_step = k equals a k times larger batch") {
  dtrain::init();
  const Shards shards;
  const int k = 3, steps = 4;
  REQUIRE(shards.batches_per_rank() >= k * steps);
  const Params want = reference_run(shards, steps, k);

  Sgd sgd = make_local_model();
  DistributedOptimizerOptions options;
  options.backward_passes_per_step = k;
  DistributedOptimizer<Sgd> opt(sgd, options);
  int pass = 0;
  for (int t = 0; t < steps; ++t) {
    sgd.zero_grad();
    for (int j = 0; j < k; ++j) {
      // Horovod semantics: the k passes are summed, so each pass's loss is divided by k.
      accumulate_gradients(sgd.params, sgd.grads, shards.batch(world_rank(), pass++),
                           1.0 / (k * kBatch));
      const bool stepped = opt.step();
      CHECK(stepped == (j == k - 1));
    }
  }
  CHECK(sgd.steps == steps);
  check_close(sgd.params, want, kExactTolerance, "weights after 4 steps of 3 accumulated passes");
}

TEST_CASE("gradient_predivide_factor gives the same result as without") {
  dtrain::init();
  const Shards shards;
  const int steps = 4;
  const Params plain = distributed_run(shards, steps, {});
  for (double f : {2.0, static_cast<double>(world_size()), 0.25}) {
    CAPTURE(f);
    DistributedOptimizerOptions options;
    options.gradient_predivide_factor = f;
    check_close(distributed_run(shards, steps, options), plain, kExactTolerance,
                "weights with a predivide factor");
  }
}

// The test above cannot fail: pre- and postscaling by f cancel, so a factor that is ignored gives
// the same weights. What the factor changes is the range of the values summed on the wire: here a
// gradient of 40000 on every rank, an fp16 value whose sum over 2 or more ranks is not (fp16 ends
// at 65504). Divided by n first, the sum stays in range (as tests/torch checks for libtorch).
TEST_CASE("gradient_predivide_factor keeps an fp16-compressed sum of large gradients finite") {
  dtrain::init();
  const int n = world_size();
  auto reduced_gradient = [&](double factor) {
    Sgd sgd(Params{std::vector<double>{0.0}}, 0.0, 0.0);
    DistributedOptimizerOptions options;
    options.compression = Compression::fp16;
    options.gradient_predivide_factor = factor;
    DistributedOptimizer<Sgd> opt(sgd, options);
    sgd.grads[0][0] = 40000;
    opt.synchronize();
    return sgd.grads[0][0];
  };
  const double g = reduced_gradient(n);
  // 40000 is an fp16 value; 40000 / n and the sum of n of them round at most n + 1 times.
  CHECK_MESSAGE(std::abs(g - 40000) <= 40000 * (n + 1) * std::ldexp(1.0, -11),
                fmt::format("rank {}: {}", world_rank(), g));
  // What the factor is for: ignored (a factor of 1), the sum overflows.
  if (n > 1) CHECK(std::isinf(reduced_gradient(1.0)));
}

TEST_CASE("fp16 and bf16 compression stay within the 16-bit rounding of the exact average") {
  dtrain::init();
  const Shards shards;
  const int n = world_size();
  for (Compression c : {Compression::fp16, Compression::bf16}) {
    CAPTURE(static_cast<int>(c));
    // Unit roundoff of the wire type; the compressed gradient went through at most n + 2
    // roundings in it (compression, n - 1 additions, the division by n), each at most u times
    // the magnitude of the partial result, and fp16 subnormals add an absolute 2^-24 each.
    const double u = c == Compression::fp16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
    const double absolute = c == Compression::fp16 ? std::ldexp(1.0, -24) : 0.0;

    // One step, gradient by gradient, against every rank's exact gradient.
    Sgd sgd = make_local_model();
    DistributedOptimizerOptions options;
    options.compression = c;
    DistributedOptimizer<Sgd> opt(sgd, options);
    accumulate_gradients(sgd.params, sgd.grads, shards.batch(world_rank(), 0), 1.0 / kBatch);
    opt.synchronize();
    std::vector<Params> per_rank;
    for (int k = 0; k < n; ++k) {
      per_rank.push_back(zeros_like(sgd.params));
      accumulate_gradients(sgd.params, per_rank.back(), shards.batch(k, 0), 1.0 / kBatch);
    }
    std::int64_t bad = 0;
    double worst = 0;
    for (std::size_t t = 0; t < sgd.grads.size(); ++t)
      for (std::size_t i = 0; i < sgd.grads[t].size(); ++i) {
        double mean = 0, magnitude = 0;
        for (int k = 0; k < n; ++k) {
          mean += per_rank[k][t][i] / n;
          magnitude += std::abs(per_rank[k][t][i]) / n;
        }
        const double bound = (n + 2) * (u * magnitude + absolute);
        const double err = std::abs(sgd.grads[t][i] - mean);
        worst = std::max(worst, err / bound);
        if (err > bound) ++bad;
      }
    CHECK_MESSAGE(bad == 0, fmt::format("rank {}: {} gradient elements beyond the 16-bit bound "
                                        "(worst at {:.2f} times the bound)", world_rank(), bad, worst));
    // The gradients really travelled as 16-bit values: widened wire values, not float64 sums.
    CHECK(all_representable(sgd.grads, c));

    // Whole runs: the weights stay close to the uncompressed reference (1e-3 relative for fp16's
    // 11-bit, 1e-2 for bf16's 8-bit significand after 5 momentum steps).
    const int steps = 5;
    options.compression = c;
    const Params got = distributed_run(shards, steps, options);
    const Params want = reference_run(shards, steps);
    check_close(got, want, c == Compression::fp16 ? 1e-3 : 1e-2, "weights after compressed steps");
  }
}

TEST_CASE("synchronize() then clipping inside skip_synchronize() steps on the clipped average") {
  dtrain::init();
  const Shards shards;
  const int steps = 4;
  const double clip = 0.05;
  const Params unclipped = reference_run(shards, steps);
  const Params want = reference_run(shards, steps, 1, clip);

  Sgd sgd = make_local_model();
  DistributedOptimizer<Sgd> opt(sgd);
  for (int t = 0; t < steps; ++t) {
    sgd.zero_grad();
    accumulate_gradients(sgd.params, sgd.grads, shards.batch(world_rank(), t), 1.0 / kBatch);
    opt.synchronize();
    const double norm = clip_grad_norm(sgd.grads, clip);
    CHECK(norm > clip);  // clipping is active on every step, so the two references differ
    auto scope = opt.skip_synchronize();
    CHECK(opt.step());
  }
  check_close(sgd.params, want, kExactTolerance, "weights after clipped steps");
  CHECK(max_rel_error(want, unclipped) > 1e-3);
}

TEST_CASE("step() inside skip_synchronize() does not reduce again; outside it does") {
  dtrain::init();
  const int n = world_size();
  // With Sum a second reduction would multiply the already summed gradient by n.
  Sgd sgd(init_params(0), 1.0, 0.0);
  DistributedOptimizerOptions options;
  options.op = ReduceOp::Sum;
  DistributedOptimizer<Sgd> opt(sgd, options);
  const auto before = sgd.params;

  sgd.zero_grad();
  for (auto& g : sgd.grads) std::fill(g.begin(), g.end(), 1.0);
  opt.synchronize();
  CHECK(sgd.grads[0][0] == n);
  {
    auto scope = opt.skip_synchronize();
    CHECK(opt.step());
  }
  CHECK(sgd.params[3][0] == before[3][0] - n);  // stepped once on the n-fold sum, lr 1

  // The scope ended: the next step reduces again.
  sgd.zero_grad();
  for (auto& g : sgd.grads) std::fill(g.begin(), g.end(), 1.0);
  CHECK(opt.step());
  CHECK(sgd.grads[0][0] == n);
  CHECK(sgd.params[3][0] == before[3][0] - 2 * n);
  CHECK(sgd.steps == 2);
}

TEST_CASE("invalid DistributedOptimizer options are InvalidArgumentError naming the option") {
  dtrain::init();
  Sgd sgd(init_params(0), kLr, kMomentum);
  auto make = [&](DistributedOptimizerOptions o) { DistributedOptimizer<Sgd> opt(sgd, o); };
  using dtrain::InvalidArgumentError;

  for (ReduceOp op : {ReduceOp::Min, ReduceOp::Max, ReduceOp::Product}) {
    DistributedOptimizerOptions o;
    o.op = op;
    CHECK_THROWS_WITH_AS(make(o), doctest::Contains("DistributedOptimizerOptions::op"),
                         InvalidArgumentError);
  }
  for (int k : {0, -1}) {
    DistributedOptimizerOptions o;
    o.backward_passes_per_step = k;
    CHECK_THROWS_WITH_AS(make(o), doctest::Contains("backward_passes_per_step"),
                         InvalidArgumentError);
  }
  for (double f : {0.0, -2.0, std::numeric_limits<double>::infinity(),
                   std::numeric_limits<double>::quiet_NaN()}) {
    DistributedOptimizerOptions o;
    o.gradient_predivide_factor = f;
    CHECK_THROWS_WITH_AS(make(o), doctest::Contains("gradient_predivide_factor"),
                         InvalidArgumentError);
  }
  {
    DistributedOptimizerOptions o;
    o.op = ReduceOp::Sum;
    o.gradient_predivide_factor = 2.0;
    CHECK_THROWS_WITH_AS(make(o), doctest::Contains("gradient_predivide_factor"),
                         InvalidArgumentError);
  }
  {
    DistributedOptimizerOptions o;
    o.compression = static_cast<Compression>(7);
    CHECK_THROWS_WITH_AS(make(o), doctest::Contains("DistributedOptimizerOptions::compression"),
                         InvalidArgumentError);
  }
  {
    DistributedOptimizerOptions o;
    o.hook = dtrain::allreduce_hook();
    o.compression = Compression::fp16;
    CHECK_THROWS_WITH_AS(make(o), doctest::Contains("both hook and compression"),
                         InvalidArgumentError);
  }
  DistributedOptimizerOptions ok;
  ok.backward_passes_per_step = 4;
  ok.gradient_predivide_factor = 8.0;
  CHECK_NOTHROW(make(ok));
}

namespace {

// A hook of a user's own (Note [Gradient communication hooks]): allreduces with Sum whatever the
// optimizer asks, then scales by `factor`, and records what it was handed.
class ScaledSumHook final : public dtrain::GradientHook {
 public:
  explicit ScaledSumHook(double factor) : factor_(factor) {}

  std::unique_ptr<dtrain::PendingGradients> start(dtrain::GradientBucket bucket) override {
    ++buckets;
    steps.push_back(bucket.step);
    names = bucket.names;
    std::vector<dtrain::Handle> handles;
    for (std::size_t i = 0; i < bucket.gradients.size(); ++i)
      handles.push_back(dtrain::allreduce_async(
          bucket.gradients[i], {.op = ReduceOp::Sum, .name = bucket.names[i] + ".scaled_sum"}));
    return std::make_unique<Pending>(std::move(bucket), std::move(handles), factor_);
  }
  std::string settings() const override { return "scaled sum " + std::to_string(factor_); }

  int buckets = 0;
  std::vector<std::int64_t> steps;
  std::vector<std::string> names;

 private:
  struct Pending final : dtrain::PendingGradients {
    Pending(dtrain::GradientBucket b, std::vector<dtrain::Handle> h, double f)
        : bucket(std::move(b)), handles(std::move(h)), factor(f) {}
    void wait() override {
      for (auto& h : handles) h.wait();
      for (auto& g : bucket.gradients)
        for (std::int64_t i = 0; i < g.numel; ++i) static_cast<double*>(g.data)[i] *= factor;
    }
    dtrain::GradientBucket bucket;
    std::vector<dtrain::Handle> handles;
    double factor;
  };
  double factor_;
};

}  // namespace

TEST_CASE("a hook of one's own decides how gradients travel: Sum scaled by 1/N is the average") {
  dtrain::init();
  const Shards shards;
  const int steps = 3;
  auto hook = std::make_shared<ScaledSumHook>(1.0 / world_size());
  DistributedOptimizerOptions options;
  options.op = ReduceOp::Sum;  // the hook ignores it: the result is still the average
  options.hook = hook;
  options.name = "custom_hook";
  const Params got = distributed_run(shards, steps, options);
  check_close(got, reference_run(shards, steps), kExactTolerance, "weights after hooked steps");
  CHECK(hook->buckets == steps);  // one bucket per synchronization
  CHECK(hook->steps == std::vector<std::int64_t>{0, 1, 2});
  REQUIRE(hook->names.size() == init_params(0).size());
  CHECK(hook->names[0] == "custom_hook.0");
}

TEST_CASE("compression_hook(fp16) is what Compression::fp16 does: the same weights, bit for bit") {
  dtrain::init();
  const Shards shards;
  DistributedOptimizerOptions by_enum;
  by_enum.compression = Compression::fp16;
  DistributedOptimizerOptions by_hook;
  by_hook.hook = dtrain::compression_hook(Compression::fp16);
  const Params a = distributed_run(shards, 3, by_enum);
  const Params b = distributed_run(shards, 3, by_hook);
  CHECK(a == b);
  // And fp16 did round: uncompressed steps differ.
  CHECK(distributed_run(shards, 3, {}) != a);
  CHECK_THROWS_AS(dtrain::compression_hook(static_cast<Compression>(9)),
                  dtrain::InvalidArgumentError);
}

TEST_CASE("different hooks on different ranks fail on every rank, naming the ranks") {
  dtrain::init();
  if (world_size() < 2) return;
  Sgd sgd = make_local_model();
  DistributedOptimizerOptions options;
  options.name = "mixed_hooks";
  if (world_rank() == world_size() - 1) options.compression = Compression::bf16;
  const std::string want = "rank(s) " + std::to_string(world_size() - 1) + " differ from rank 0";
  auto make = [&] { DistributedOptimizer<Sgd> opt(sgd, options); };
  CHECK_THROWS_WITH_AS(make(), doctest::Contains(want.c_str()), dtrain::InvalidArgumentError);
}
