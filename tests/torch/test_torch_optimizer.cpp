// The libtorch path: DistributedOptimizer over torch::optim optimizers (gradients submitted from
// autograd hooks), broadcast_module and broadcast_optimizer_state. Every distributed run is
// compared with a single-process reference computed on every rank from the same data.
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dtrain/torch.hpp"
#include "support/temp_dir.hpp"
#include "train/train_test_util.hpp"

namespace {

using namespace train_test;
using dtrain::DistributedOptimizer;
using dtrain::DistributedOptimizerOptions;

constexpr std::int64_t kDatasetSize = 97;  // not a multiple of 2, 3 or 4: padded shards
constexpr std::int64_t kBatch = 3;         // per rank
constexpr int kIn = 4, kHidden = 8, kOut = 3;
// float32 parameters; the distributed and reference runs differ only in summation order.
constexpr double kTolerance = 1e-5;

// A 2-layer MLP with an auxiliary head that some steps do not use, and a buffer.
struct NetImpl : torch::nn::Module {
  NetImpl()
      : fc1(register_module("fc1", torch::nn::Linear(kIn, kHidden))),
        fc2(register_module("fc2", torch::nn::Linear(kHidden, kOut))),
        aux(register_module("aux", torch::nn::Linear(kHidden, kOut))) {
    running = register_buffer("running", torch::rand({5}));
  }
  torch::Tensor forward(const torch::Tensor& x, bool use_aux = false) {
    auto h = torch::tanh(fc1(x));
    auto y = fc2(h);
    return use_aux ? y + aux(h) : y;
  }
  torch::nn::Linear fc1, fc2, aux;
  torch::Tensor running;
};
TORCH_MODULE(Net);

// Different weights on every rank until something makes them equal.
Net make_net() {
  torch::manual_seed(1234 + world_rank());
  return Net();
}

// A copy of `src` with the same weights: the single-process reference.
Net clone_net(Net& src) {
  Net dst;
  torch::NoGradGuard no_grad;
  auto from = src->named_parameters();
  for (auto& item : dst->named_parameters()) item.value().copy_(from[item.key()]);
  return dst;
}

struct Batch {
  torch::Tensor x, y;
};
Batch samples(const std::vector<std::int64_t>& idx) {
  auto x = torch::empty({static_cast<std::int64_t>(idx.size()), kIn});
  auto y = torch::empty({static_cast<std::int64_t>(idx.size()), kOut});
  auto xa = x.accessor<float, 2>();
  auto ya = y.accessor<float, 2>();
  for (std::size_t r = 0; r < idx.size(); ++r) {
    const double i = static_cast<double>(idx[r]);
    for (int j = 0; j < kIn; ++j) xa[r][j] = static_cast<float>(std::sin(0.37 * i + 1.3 * j));
    for (int j = 0; j < kOut; ++j) ya[r][j] = static_cast<float>(std::cos(0.5 * i + j));
  }
  return {x, y};
}

// DistributedSampler(shuffle = false) shards of every rank, so the reference sees their union.
struct Shards {
  std::vector<std::vector<std::int64_t>> of_rank;
  Shards() {
    for (int k = 0; k < world_size(); ++k)
      of_rank.push_back(dtrain::DistributedSampler(kDatasetSize, world_size(), k, false).indices());
  }
  std::vector<std::int64_t> rank_batch(int k, std::int64_t t) const {
    return {of_rank[k].begin() + t * kBatch, of_rank[k].begin() + (t + 1) * kBatch};
  }
  // One process with batch passes·N·kBatch at step t.
  std::vector<std::int64_t> global_batch(std::int64_t t, int passes = 1) const {
    std::vector<std::int64_t> out;
    for (int k = 0; k < world_size(); ++k)
      for (int j = 0; j < passes; ++j) {
        auto b = rank_batch(k, t * passes + j);
        out.insert(out.end(), b.begin(), b.end());
      }
    return out;
  }
};

torch::Tensor mse(Net& net, const std::vector<std::int64_t>& idx, bool use_aux = false) {
  const Batch b = samples(idx);
  return torch::mse_loss(net->forward(b.x, use_aux), b.y);
}

// Largest relative difference (floored at 1 in magnitude) between same-named parameters.
double max_param_error(Net& a, Net& b) {
  double worst = 0;
  auto pb = b->named_parameters();
  for (auto& item : a->named_parameters()) {
    const auto diff = (item.value() - pb[item.key()]).abs() / pb[item.key()].abs().clamp_min(1.0);
    worst = std::max(worst, diff.max().item<double>());
  }
  return worst;
}

bool parameters_identical_on_all_ranks(torch::nn::Module& m) {
  bool all = true;
  for (auto& t : m.parameters())
    all = same_on_all_ranks(t.data_ptr(), t.numel() * t.element_size()) && all;
  for (auto& t : m.buffers())
    all = same_on_all_ranks(t.data_ptr(), t.numel() * t.element_size()) && all;
  return all;
}

torch::optim::SGDOptions sgd_options() { return torch::optim::SGDOptions(0.05).momentum(0.9); }

struct Started {
  Started() { dtrain::init(); }
};

// A model made equal on every rank by broadcast_module, and `ref`: the single-process reference,
// from the same weights, that sees every rank's batch.
struct SameStart : Started {
  SameStart() {
    dtrain::broadcast_module(*model, 0);
    ref = clone_net(model);
  }

  // Step t of both runs with SGD: the model on this rank's batch, the reference on every rank's.
  template <class Distributed>
  void step_both(Distributed& dist, torch::optim::SGD& ref_opt, std::int64_t t) {
    dist.zero_grad();
    mse(model, shards.rank_batch(world_rank(), t)).backward();
    CHECK(dist.step());
    ref_opt.zero_grad();
    mse(ref, shards.global_batch(t)).backward();
    ref_opt.step();
  }

  void check_matches_reference() {
    const double err = max_param_error(model, ref);
    CHECK_MESSAGE(err <= kTolerance, fmt::format("relative error {:.3e}", err));
  }

  const Shards shards;
  Net model = make_net();
  Net ref{nullptr};
};

}  // namespace

// The bucket sizes that submit gradients at different points: all by step() (the default for
// CPU gradients), each from its hook, and some during backward with the rest held for step().
DistributedOptimizerOptions bucket_variant() {
  DistributedOptimizerOptions options;
  SUBCASE("default buckets (one per backward on the CPU)") {}
  SUBCASE("bucket_bytes = 0: each gradient from its hook") { options.bucket_bytes = 0; }
  SUBCASE("bucket_bytes = 100: some during backward, the rest by step()") {
    options.bucket_bytes = 100;
  }
  return options;
}

TEST_CASE_FIXTURE(SameStart,
                  "SGD with momentum: N ranks with batch b equal one process with batch N*b") {
  CHECK(parameters_identical_on_all_ranks(*model));
  Net start = clone_net(model);

  torch::optim::SGD opt(model->parameters(), sgd_options());
  DistributedOptimizer dist(opt, model->named_parameters(), bucket_variant());
  torch::optim::SGD ref_opt(ref->parameters(), sgd_options());
  const int steps = 6;
  for (int t = 0; t < steps; ++t) step_both(dist, ref_opt, t);
  check_matches_reference();
  CHECK(max_param_error(model, start) > 1e-3);  // the weights moved: the check can fail
  CHECK(parameters_identical_on_all_ranks(*model));
}

TEST_CASE_FIXTURE(SameStart,
                  "backward_passes_per_step = 2 through the hooks equals a 2 times larger batch") {
  torch::optim::SGD opt(model->parameters(), sgd_options());
  DistributedOptimizerOptions options = bucket_variant();
  options.backward_passes_per_step = 2;
  DistributedOptimizer dist(opt, model->named_parameters(), options);
  torch::optim::SGD ref_opt(ref->parameters(), sgd_options());
  const int steps = 4;
  int pass = 0;
  for (int t = 0; t < steps; ++t) {
    dist.zero_grad();
    for (int j = 0; j < 2; ++j) {
      // The passes are summed (Horovod semantics): halve each pass's loss for the mean.
      (mse(model, shards.rank_batch(world_rank(), pass++)) / 2).backward();
      CHECK(dist.step() == (j == 1));
    }
    ref_opt.zero_grad();
    mse(ref, shards.global_batch(t, 2)).backward();
    ref_opt.step();
  }
  check_matches_reference();
}

TEST_CASE_FIXTURE(SameStart,
                  "a parameter without a gradient on some ranks or steps is averaged with zeros") {
  const int n = world_size(), me = world_rank();
  Net start = clone_net(model);
  torch::optim::SGD opt(model->parameters(), sgd_options());
  DistributedOptimizer dist(opt, model->named_parameters(), bucket_variant());
  torch::optim::SGD ref_opt(ref->parameters(), sgd_options());
  // Step 0: nobody uses the aux head (its gradient is undefined everywhere). Steps 1 and 2: only
  // odd ranks use it. Step 3: everybody does.
  auto uses_aux = [](int step, int rank) { return step == 3 || (step > 0 && rank % 2 == 1); };
  const int steps = 4;
  for (int t = 0; t < steps; ++t) {
    dist.zero_grad();
    mse(model, shards.rank_batch(me, t), uses_aux(t, me)).backward();
    CHECK(dist.step());
    // The reference: the mean over ranks of each rank's loss, in one backward pass.
    ref_opt.zero_grad();
    torch::Tensor loss = torch::zeros({});
    for (int k = 0; k < n; ++k) loss = loss + mse(ref, shards.rank_batch(k, t), uses_aux(t, k));
    (loss / n).backward();
    ref_opt.step();
    if (t == 0) {
      // Nobody had a gradient for aux: it must not have moved.
      CHECK(torch::equal(model->aux->weight, start->aux->weight));
    }
  }
  check_matches_reference();
  CHECK(parameters_identical_on_all_ranks(*model));
}

TEST_CASE_FIXTURE(SameStart,
                  "zero_grad() submits what backward left held, waits for it, then zeros") {
  torch::optim::SGD opt(model->parameters(), sgd_options());
  DistributedOptimizer dist(opt, model->named_parameters(), bucket_variant());
  torch::optim::SGD ref_opt(ref->parameters(), sgd_options());

  // A backward whose gradients are thrown away: the hooks have submitted their allreduces, which
  // may still be in flight and would write into the gradients after a plain zero_grad, or hold
  // them in a bucket that zero_grad submits, so no rank waits for another's.
  mse(model, shards.rank_batch(world_rank(), 0)).backward();
  dist.zero_grad();
  for (auto& p : model->parameters()) {
    if (p.grad().defined()) CHECK(p.grad().abs().max().item<double>() == 0.0);
  }

  // Training continues normally: the same names are submitted again.
  for (int t = 1; t <= 3; ++t) step_both(dist, ref_opt, t);
  check_matches_reference();
}

namespace {

// Requests this rank's engine has sent, once it has sent at least `expected` more than `base`
// (or 10 s have passed) and a little longer, so that one too many would have shown.
std::uint64_t requests_after(std::uint64_t base, std::uint64_t expected) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (dtrain::engine_stats().requests_sent < base + expected &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  return dtrain::engine_stats().requests_sent - base;
}

// Three bias-free layers, one parameter each, whose gradients backward produces in a known order:
// fc3 (96 bytes), fc2 (256), fc1 (128).
torch::nn::Linear unbiased(std::int64_t in, std::int64_t out) {
  return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false));
}
struct ChainImpl : torch::nn::Module {
  ChainImpl()
      : fc1(register_module("fc1", unbiased(4, 8))),
        fc2(register_module("fc2", unbiased(8, 8))),
        fc3(register_module("fc3", unbiased(8, 3))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    return fc3(torch::tanh(fc2(torch::tanh(fc1(x)))));
  }
  torch::nn::Linear fc1, fc2, fc3;
};
TORCH_MODULE(Chain);

// Three bias-free layers of 10 MiB of gradients each: 25 MiB buckets fill when fc1's arrives.
struct WideChainImpl : torch::nn::Module {
  WideChainImpl()
      : fc1(register_module("fc1", unbiased(1600, 1600))),
        fc2(register_module("fc2", unbiased(1600, 1600))),
        fc3(register_module("fc3", unbiased(1600, 1600))) {}
  torch::Tensor forward(const torch::Tensor& x) { return fc3(torch::tanh(fc2(torch::tanh(fc1(x))))); }
  torch::nn::Linear fc1, fc2, fc3;
};
TORCH_MODULE(WideChain);

}  // namespace

TEST_CASE("CPU gradients of a job across hosts go in 25 MiB buckets during backward by default") {
  // Every rank a host of its own (DTRAIN_HOST_ID emulation), so the job spans hosts from 2 ranks.
  dtrain::shutdown();
  dtrain::Config config = dtrain::Config::from_env();
  config.host_id = fmt::format("emulated-host-{}", world_rank());
  dtrain::init(config);
  const bool spans_hosts = dtrain::size() > 1;
  REQUIRE(dtrain::local_size() == 1);
  {
    WideChain chain;
    dtrain::broadcast_module(*chain, 0);
    torch::optim::SGD opt(chain->parameters(), sgd_options());
    DistributedOptimizer dist(opt, chain->named_parameters());
    dist.zero_grad();
    const auto base = dtrain::engine_stats().requests_sent;
    const torch::Tensor x = torch::ones({2, 1600});
    torch::mse_loss(chain->forward(x), torch::zeros({2, 1600})).backward();
    // fc3 (10 MiB) and fc2 (20 MiB) are held; fc1 fills the bucket and all three go.
    const std::uint64_t during = spans_hosts ? 3 : 0;
    CHECK(requests_after(base, during) == during);
    CHECK(dist.step());
    CHECK(requests_after(base, 3) == 3);
  }
  dtrain::shutdown();
  dtrain::init();  // the other tests' job: every rank on this host
}

TEST_CASE("bucket_bytes decides which gradients backward submits and which wait for step()") {
  dtrain::init();
  Chain chain;
  dtrain::broadcast_module(*chain, 0);
  torch::optim::SGD opt(chain->parameters(), sgd_options());
  const Batch b = samples(std::vector<std::int64_t>{world_rank(), world_rank() + 5});
  auto backward = [&] { torch::mse_loss(chain->forward(b.x), b.y).backward(); };

  // How many allreduces backward submitted, and how many step() added.
  auto submitted = [&](DistributedOptimizerOptions options, std::uint64_t during,
                       std::uint64_t by_step) {
    DistributedOptimizer dist(opt, chain->named_parameters(), options);
    dist.zero_grad();
    const auto base = dtrain::engine_stats().requests_sent;
    backward();
    CHECK(requests_after(base, during) == during);
    CHECK(dist.step());
    CHECK(requests_after(base, during + by_step) == during + by_step);
  };
  SUBCASE("CPU gradients by default: one bucket, submitted by step()") {
    submitted({}, 0, 3);
  }
  SUBCASE("0: each from its hook") {
    DistributedOptimizerOptions options;
    options.bucket_bytes = 0;
    submitted(options, 3, 0);
  }
  SUBCASE("300 bytes: fc3 and fc2 fill a bucket; fc1 is held for step()") {
    DistributedOptimizerOptions options;
    options.bucket_bytes = 300;
    submitted(options, 2, 1);
  }
  SUBCASE("zero_grad() submits what is held and waits for it") {
    DistributedOptimizer dist(opt, chain->named_parameters());
    dist.zero_grad();
    const auto base = dtrain::engine_stats().requests_sent;
    backward();
    CHECK(requests_after(base, 0) == 0);
    dist.zero_grad();
    CHECK(dtrain::engine_stats().requests_sent - base == 3);
    for (auto& p : chain->parameters())  // libtorch's zero_grad undefines gradients by default
      CHECK((!p.grad().defined() || p.grad().abs().max().item<double>() == 0.0));
  }
  SUBCASE("a negative size is refused by name") {
    DistributedOptimizerOptions options;
    options.bucket_bytes = -1;
    CHECK_THROWS_WITH_AS(DistributedOptimizer(opt, chain->named_parameters(), options),
                         doctest::Contains("DistributedOptimizerOptions::bucket_bytes = -1"),
                         dtrain::InvalidArgumentError);
  }
}

namespace {

// Note [Gradient communication hooks]: a hook of one's own, handed the optimizer's buckets. It
// averages through the built-in allreduce hook and records the buckets it saw.
class RecordingHook final : public dtrain::GradientHook {
 public:
  std::unique_ptr<dtrain::PendingGradients> start(dtrain::GradientBucket bucket) override {
    {
      std::lock_guard lock(mutex);
      buckets.push_back(bucket.names);
      steps.push_back(bucket.step);
    }
    return inner->start(std::move(bucket));
  }
  std::string settings() const override { return "recording"; }

  std::shared_ptr<dtrain::GradientHook> inner = dtrain::allreduce_hook();
  std::mutex mutex;
  std::vector<std::vector<std::string>> buckets;
  std::vector<std::int64_t> steps;
};

}  // namespace

TEST_CASE("the gradient hook gets each bucket as backward fills it, with its names and step") {
  dtrain::init();
  Chain chain;
  dtrain::broadcast_module(*chain, 0);
  torch::optim::SGD opt(chain->parameters(), sgd_options());
  const Batch b = samples(std::vector<std::int64_t>{world_rank(), world_rank() + 5});
  auto hook = std::make_shared<RecordingHook>();
  DistributedOptimizerOptions options;
  options.bucket_bytes = 300;  // fc3 and fc2 fill a bucket during backward; fc1 goes by step()
  options.hook = hook;
  options.name = "recorded";
  DistributedOptimizer dist(opt, chain->named_parameters(), options);
  for (int t = 0; t < 2; ++t) {
    dist.zero_grad();
    torch::mse_loss(chain->forward(b.x), b.y).backward();
    CHECK(dist.step());
  }
  using Names = std::vector<std::string>;
  const std::vector<Names> want{{"recorded.fc3.weight", "recorded.fc2.weight"},
                                {"recorded.fc1.weight"}};
  REQUIRE(hook->buckets.size() == 4);
  CHECK(Names(hook->buckets[0]) == want[0]);
  CHECK(Names(hook->buckets[1]) == want[1]);
  CHECK(hook->steps == std::vector<std::int64_t>{0, 0, 1, 1});
  CHECK(parameters_identical_on_all_ranks(*chain));
}

TEST_CASE("fp16 and bf16 compression of torch gradients stay within 16-bit rounding of the "
          "average") {
  dtrain::init();
  // Significand bits of the wire format, and its smallest subnormal.
  auto compression = dtrain::Compression::fp16;
  auto wire = torch::kHalf;
  int bits = 11;
  double tiny = std::ldexp(1.0, -24);
  SUBCASE("fp16") {}
  SUBCASE("bf16") {
    compression = dtrain::Compression::bf16;
    wire = torch::kBFloat16;
    bits = 8;
    tiny = std::ldexp(1.0, -133);
  }
  const Shards shards;
  const int n = world_size();
  Net model = make_net();
  dtrain::broadcast_module(*model, 0);
  torch::optim::SGD opt(model->parameters(), sgd_options());
  DistributedOptimizerOptions options;
  options.compression = compression;
  DistributedOptimizer dist(opt, model->named_parameters(), options);

  // Every rank's exact gradient, from a copy of the model.
  Net probe = clone_net(model);
  std::vector<std::vector<torch::Tensor>> per_rank;
  for (int k = 0; k < n; ++k) {
    probe->zero_grad();
    mse(probe, shards.rank_batch(k, 0)).backward();
    std::vector<torch::Tensor> g;
    for (auto& p : probe->parameters())
      g.push_back(p.grad().defined() ? p.grad().clone() : torch::zeros_like(p));
    per_rank.push_back(g);
  }
  dist.zero_grad();
  mse(model, shards.rank_batch(world_rank(), 0)).backward();
  dist.synchronize();
  // n + 2 roundings at most in the wire format (compression, n - 1 additions, the division by n),
  // each within 2^-bits of the partial result's magnitude, plus the smallest subnormal.
  const double u = std::ldexp(1.0, -bits);
  auto params = model->parameters();
  for (std::size_t i = 0; i < params.size(); ++i) {
    CAPTURE(i);
    auto mean = torch::zeros_like(params[i]);
    auto magnitude = torch::zeros_like(params[i]);
    for (int k = 0; k < n; ++k) {
      mean += per_rank[k][i] / n;
      magnitude += per_rank[k][i].abs() / n;
    }
    const auto bound = (n + 2) * (u * magnitude + tiny);
    const auto g = params[i].grad();
    CHECK(((g - mean).abs() <= bound).all().item<bool>());
    // The values travelled in the wire format: each one is such a value, widened.
    CHECK(torch::equal(g, g.to(wire).to(torch::kFloat)));
  }
  {
    auto scope = dist.skip_synchronize();
    CHECK(dist.step());
  }
  CHECK(parameters_identical_on_all_ranks(*model));
}

TEST_CASE_FIXTURE(SameStart,
                  "gradient_predivide_factor: the same average, summed over gradients divided "
                  "by f") {
  torch::optim::SGD opt(model->parameters(), sgd_options());
  DistributedOptimizerOptions options = bucket_variant();
  options.gradient_predivide_factor = 2.5;
  DistributedOptimizer dist(opt, model->named_parameters(), options);
  torch::optim::SGD ref_opt(ref->parameters(), sgd_options());
  for (int t = 0; t < 3; ++t) step_both(dist, ref_opt, t);
  check_matches_reference();
}

TEST_CASE("gradient_predivide_factor keeps an fp16-compressed sum of large gradients finite") {
  dtrain::init();
  const int n = world_size();
  // One weight whose gradient is 40000 on every rank: an fp16 value whose sum over 2 or more
  // ranks is not (fp16 ends at 65504). Divided by n first, the sum stays in range.
  auto reduced_gradient = [&](double factor) {
    torch::nn::Linear one(torch::nn::LinearOptions(1, 1).bias(false));
    torch::optim::SGD opt(one->parameters(), torch::optim::SGDOptions(0.0));
    DistributedOptimizerOptions options;
    options.compression = dtrain::Compression::fp16;
    options.gradient_predivide_factor = factor;
    DistributedOptimizer dist(opt, one->named_parameters(), options);
    dist.zero_grad();
    (one(torch::ones({1, 1})).sum() * 40000).backward();
    dist.synchronize();
    return one->weight.grad().item<double>();
  };
  const double g = reduced_gradient(n);
  CHECK_MESSAGE(std::abs(g - 40000) <= 40000 * n * std::ldexp(1.0, -10), fmt::format("{}", g));
  if (n > 1) CHECK(std::isinf(reduced_gradient(1.0)));  // what the factor is for
}

TEST_CASE("broadcast_module + broadcast_optimizer_state make Adam identical on every rank") {
  dtrain::init();
  const Shards shards;
  const int n = world_size(), me = world_rank();
  const int root = n - 1;
  Net model = make_net();
  torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(0.001));
  if (me == root) {
    // Root trains alone for a few steps: only it has Adam state, and its lr differs. The aux head
    // is used so that every parameter gets a gradient, and with it Adam state.
    dtrain::set_learning_rate(adam, 0.003);
    for (int t = 0; t < 3; ++t) {
      adam.zero_grad();
      mse(model, shards.rank_batch(me, t), /*use_aux=*/true).backward();
      adam.step();
    }
  }
  {
    torch::NoGradGuard no_grad;
    model->running.fill_(static_cast<float>(me));  // a buffer that differs too
  }
  CHECK(adam.state().size() == (me == root ? model->parameters().size() : 0));

  dtrain::broadcast_module(*model, root);
  dtrain::broadcast_optimizer_state(adam, root);

  CHECK(parameters_identical_on_all_ranks(*model));
  CHECK(model->running[0].item<float>() == static_cast<float>(root));
  CHECK(adam.state().size() == model->parameters().size());
  for (auto& group : adam.param_groups()) {
    CHECK(group.options().get_lr() == 0.003);
    for (auto& p : group.params()) {
      auto it = adam.state().find(p.unsafeGetTensorImpl());
      CHECK(it != adam.state().end());
      if (it == adam.state().end()) continue;  // (every rank has the same parameters)
      auto& s = static_cast<torch::optim::AdamParamState&>(*it->second);
      CHECK(s.step() == 3);
      CHECK(same_on_all_ranks(s.exp_avg().data_ptr(), s.exp_avg().nbytes()));
      CHECK(same_on_all_ranks(s.exp_avg_sq().data_ptr(), s.exp_avg_sq().nbytes()));
    }
  }
  // The state is live: one more step on the same data keeps every rank bitwise identical. (Every
  // parameter gets a gradient on every rank: root's zero_grad left defined zeros where the others
  // have none, and Adam moves a parameter with a zero gradient but skips one without.)
  adam.zero_grad();
  mse(model, shards.rank_batch(0, 5), /*use_aux=*/true).backward();
  adam.step();
  CHECK(parameters_identical_on_all_ranks(*model));
}

TEST_CASE_FIXTURE(SameStart,
                  "named_parameters that miss a parameter, empty names, duplicates: clear errors") {
  torch::optim::SGD opt(model->parameters(), sgd_options());
  using dtrain::InvalidArgumentError;

  // fc2.weight comes third in the optimizer: the first two parameters were already resolved
  // when the constructor throws, and must not be left with hooks into the dead object.
  torch::OrderedDict<std::string, torch::Tensor> missing;
  for (auto& item : model->named_parameters())
    if (item.key() != "fc2.weight") missing.insert(item.key(), item.value());
  CHECK_THROWS_WITH_AS(DistributedOptimizer(opt, missing),
                       doctest::Contains("not in named_parameters"), InvalidArgumentError);
  CHECK_THROWS_WITH_AS(DistributedOptimizer(opt, missing),
                       doctest::Contains("[3, 8]"), InvalidArgumentError);  // fc2.weight's shape

  torch::OrderedDict<std::string, torch::Tensor> unnamed;
  for (auto& item : model->named_parameters())
    unnamed.insert(item.key() == "fc1.bias" ? std::string() : item.key(), item.value());
  CHECK_THROWS_WITH_AS(DistributedOptimizer(opt, unnamed), doctest::Contains("empty name"),
                       InvalidArgumentError);

  // Another module's parameters under the right names do not count.
  Net other = make_net();
  CHECK_THROWS_AS(DistributedOptimizer(opt, other->named_parameters()), InvalidArgumentError);

  // torch::OrderedDict rejects a duplicate key itself; a parameter the optimizer lists twice
  // would be reduced twice per step.
  CHECK_THROWS(missing.insert("fc1.weight", model->fc1->weight));
  torch::optim::SGD twice(std::vector<torch::Tensor>{model->fc1->weight, model->fc1->bias,
                                                     model->fc1->weight},
                          sgd_options());
  CHECK_THROWS_WITH_AS(DistributedOptimizer(twice, model->named_parameters()),
                       doctest::Contains("'fc1.weight' (shape [8, 4]) appears more than once"),
                       InvalidArgumentError);
  CHECK_THROWS_WITH_AS(DistributedOptimizer<torch::optim::SGD>{twice},
                       doctest::Contains("appears more than once"), InvalidArgumentError);

  // After all these failures the model trains normally with a correct wrapper.
  torch::optim::SGD ref_opt(ref->parameters(), sgd_options());
  DistributedOptimizer dist(opt, model->named_parameters());
  for (int t = 0; t < 2; ++t) step_both(dist, ref_opt, t);
  check_matches_reference();
}

TEST_CASE_FIXTURE(SameStart,
                  "one DistributedOptimizer per parameter; its hooks go with it") {
  torch::optim::SGD opt(model->parameters(), sgd_options());
  using dtrain::InvalidArgumentError;

  {
    DistributedOptimizer first(opt, model->named_parameters());
    // A second wrapper would take over the first one's gradient hooks (one per parameter).
    torch::optim::SGD fc2_only(model->fc2->parameters(), sgd_options());
    CHECK_THROWS_WITH_AS(DistributedOptimizer(fc2_only, model->named_parameters()),
                         doctest::Contains("'fc2.weight' (shape [3, 8]) already has a "
                                           "post-accumulate-grad hook"),
                         InvalidArgumentError);
    // The failed constructor left the first wrapper's hooks alone: it still averages.
    first.zero_grad();
    mse(model, shards.rank_batch(world_rank(), 0)).backward();
    CHECK(first.step());
  }
  torch::optim::SGD ref_opt(ref->parameters(), sgd_options());
  ref_opt.zero_grad();
  mse(ref, shards.global_batch(0)).backward();
  ref_opt.step();
  CHECK(max_param_error(model, ref) <= kTolerance);

  // The destroyed wrapper removed its hooks: a plain backward submits nothing (a hook into the
  // dead object would crash), and a new wrapper can hook the same parameters.
  opt.zero_grad();
  mse(model, shards.rank_batch(world_rank(), 1)).backward();
  for (auto& p : model->parameters())
    CHECK_FALSE(static_cast<bool>(torch::autograd::impl::post_acc_grad_hooks(p)));
  DistributedOptimizer second(opt, model->named_parameters());
  second.zero_grad();
  mse(model, shards.rank_batch(world_rank(), 1)).backward();
  CHECK(second.step());
  CHECK(parameters_identical_on_all_ranks(*model));
}

TEST_CASE("under DTRAIN_PROFILE each update ends a step whose wait on the hooks' allreduces is its "
          "communication wait") {
  dtrain::shutdown();  // started again below with the job profiled (Note [Zero-code profiling])
  const dtrain::test::TempDir dir;  // one per rank: each writes only its own file
  dtrain::Config config = dtrain::Config::from_env();
  config.profile_dir = dir.path().string();
  dtrain::init(config);
  {
    Net model = make_net();
    dtrain::broadcast_module(*model, 0);
    torch::optim::SGD opt(model->parameters(), sgd_options());
    DistributedOptimizer dist(opt, model->named_parameters());
    const Shards shards;
    for (int t = 0; t < 4; ++t) {
      dist.zero_grad();
      mse(model, shards.rank_batch(world_rank(), t)).backward();
      CHECK(dist.step());
    }
  }
  dtrain::shutdown();
  // The rank's file, in the run's own folder inside the profile folder (Note [Profile layout]).
  std::filesystem::path file;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir.path()))
    if (e.path().filename() == fmt::format("rank-{}.jsonl", world_rank())) file = e.path();
  REQUIRE(!file.empty());
  std::ifstream in(file);
  // Every parameter's gradient, aux's too (zeros: unused), in float32.
  const std::string gradient_bytes = fmt::format(
      "\"bytes_reduced\":{},", 4 * ((kIn + 1) * kHidden + 2 * (kHidden + 1) * kOut));
  int steps = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.find("\"type\":\"step\"") == std::string::npos) continue;
    CAPTURE(line);
    ++steps;
    CHECK(line.find("\"phases_ms\":{\"communication_wait\":") != std::string::npos);
    CHECK(line.find(gradient_bytes) != std::string::npos);
  }
  CHECK(steps == 3);  // from the end of each update to the end of the next
}
