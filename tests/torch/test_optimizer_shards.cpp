// DistributedOptimizer with Shard::optimizer_state and Shard::gradients (Note [Sharded optimizer
// state]): the same parameters as the unsharded DistributedOptimizer after every step, with 1/size
// of the optimizer state on each rank, reduce-scatters that start during backward, no gradient
// left in the model with Shard::gradients; and the inputs it refuses.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <optional>
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
using dtrain::Shard;

// Relative agreement of the sharded and unsharded runs: they differ only in the summation order of
// the reduction (a reduce-scatter against an allreduce).
constexpr double kTolerance = 1e-6;

// Sizes that no world size of 2, 3 or 4 divides, two layers the second group holds, a float64
// parameter (a flat buffer of its own) and a head that only some steps use.
struct ShardNetImpl : torch::nn::Module {
  ShardNetImpl()
      : fc1(register_module("fc1", torch::nn::Linear(7, 5))),
        fc2(register_module("fc2", torch::nn::Linear(5, 3))),
        aux(register_module("aux", torch::nn::Linear(5, 3))) {
    scale = register_parameter("scale", torch::ones({3}, torch::kFloat64));
  }
  torch::Tensor forward(const torch::Tensor& x, bool use_aux) {
    auto h = torch::tanh(fc1(x));
    auto y = fc2(h) * scale.to(torch::kFloat32);
    return use_aux ? y + aux(h) : y;
  }
  torch::nn::Linear fc1, fc2, aux;
  torch::Tensor scale;
};
TORCH_MODULE(ShardNet);

// The same weights on every rank, from one seed.
ShardNet make_model() {
  torch::manual_seed(77);
  return ShardNet();
}

// This rank's batch of step t: different on every rank, the same in both runs.
std::pair<torch::Tensor, torch::Tensor> batch(std::int64_t t) {
  torch::manual_seed(1000 + 17 * t + world_rank());
  return {torch::randn({4, 7}), torch::randn({4, 3})};
}

torch::Tensor loss_of(ShardNet& model, std::int64_t t) {
  auto [x, y] = batch(t);
  return torch::mse_loss(model->forward(x, t % 2 == 1), y) * 5.0;
}

// Two parameter groups with different options: fc1 in the first, everything else in the second.
template <class Opt, class Options>
Opt make_optimizer(ShardNet& model, Options first, Options second) {
  std::vector<torch::Tensor> rest;
  for (auto& item : model->named_parameters())
    if (item.key().rfind("fc1.", 0) != 0) rest.push_back(item.value());
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(model->fc1->parameters(), std::make_unique<Options>(first));
  groups.emplace_back(rest, std::make_unique<Options>(second));
  return Opt(std::move(groups), first);
}

double max_relative_difference(ShardNet& a, ShardNet& b) {
  double worst = 0;
  auto pb = b->named_parameters();
  for (auto& item : a->named_parameters()) {
    const auto& other = pb[item.key()];
    const auto diff = (item.value() - other).abs() / other.abs().clamp_min(1.0);
    worst = std::max(worst, diff.max().item<double>());
  }
  return worst;
}

bool identical_on_all_ranks(torch::nn::Module& m) {
  bool all = true;
  for (auto& t : m.parameters())
    all = same_on_all_ranks(t.data_ptr(), t.numel() * t.element_size()) && all;
  return all;
}

// Elements of every tensor in the optimizer's state (step counts are not tensors in libtorch 2).
std::int64_t state_elements(torch::optim::Optimizer& optimizer) {
  std::int64_t n = 0;
  for (auto& [key, state] : optimizer.state()) {
    if (auto* s = dynamic_cast<torch::optim::AdamParamState*>(state.get()))
      n += s->exp_avg().numel() + s->exp_avg_sq().numel();
    if (auto* s = dynamic_cast<torch::optim::SGDParamState*>(state.get()))
      n += s->momentum_buffer().numel();
  }
  return n;
}

enum class Clip { no, yes };

// The shard tensors the optimizer steps: one per unit.
std::size_t shard_tensors(torch::optim::Optimizer& optimizer) {
  std::size_t n = 0;
  for (auto& group : optimizer.param_groups()) n += group.params().size();
  return n;
}

// `except`: a name prefix not looked at.
bool model_holds_gradients(ShardNet& model, const std::string& except = "-") {
  for (auto& p : model->named_parameters())
    if (p.key().rfind(except, 0) != 0 && p.value().grad().defined()) return true;
  return false;
}

struct ShardSetting {
  Shard shard = Shard::optimizer_state;
  std::optional<std::int64_t> unit_bytes = std::nullopt;  // DistributedOptimizerOptions::bucket_bytes
};

// `steps` updates of the unsharded and the sharded optimizer over two copies of one model.
template <class Opt, class Options>
void check_sharded_equals_unsharded(Options first, Options second, int passes, Clip clip,
                                    dtrain::Compression compression = dtrain::Compression::none,
                                    ShardSetting setting = {}) {
  dtrain::init();
  ShardNet plain_model = make_model(), sharded_model = make_model();
  auto plain_opt = make_optimizer<Opt>(plain_model, first, second);
  auto sharded_opt = make_optimizer<Opt>(sharded_model, first, second);
  DistributedOptimizerOptions options;
  options.backward_passes_per_step = passes;
  options.compression = compression;
  DistributedOptimizer plain(plain_opt, plain_model->named_parameters(), options);
  options.shard = setting.shard;
  options.bucket_bytes = setting.unit_bytes;
  DistributedOptimizer sharded(sharded_opt, sharded_model->named_parameters(), options);
  const bool stage2 = setting.shard == Shard::gradients;

  ShardNet start = make_model();
  const int steps = 5;
  for (int t = 0; t < steps; ++t) {
    plain.zero_grad();
    sharded.zero_grad();
    for (int j = 0; j < passes; ++j) {
      loss_of(plain_model, t * passes + j).backward();
      loss_of(sharded_model, t * passes + j).backward();
      // The last pass's hooks took every gradient out of the model; earlier passes accumulate.
      // The head that only some passes use does not count its passes to the last one when
      // passes > 1: step() takes its gradient.
      if (stage2)
        CHECK(model_holds_gradients(sharded_model, passes > 1 ? "aux." : "-") == (j + 1 < passes));
      if (j + 1 < passes || clip == Clip::no) {
        CHECK(plain.step() == (j + 1 == passes));
        CHECK(sharded.step() == (j + 1 == passes));
      }
    }
    if (clip == Clip::yes) {
      plain.synchronize();
      sharded.synchronize();
      const double norm = plain.clip_grad_norm(0.5);
      const double sharded_norm = sharded.clip_grad_norm(0.5);
      CHECK(norm > 0.5);  // the clip did scale: the comparison can fail
      CHECK(std::abs(norm - sharded_norm) <= 1e-6 * norm);
      auto skip_plain = plain.skip_synchronize();
      auto skip_sharded = sharded.skip_synchronize();
      CHECK(plain.step());
      CHECK(sharded.step());
    }
    if (stage2) CHECK_FALSE(model_holds_gradients(sharded_model));
  }
  // 16-bit wire values are summed in 16 bits, in another order: rounding of that size.
  const double tolerance = compression == dtrain::Compression::none ? kTolerance : 1e-3;
  const double err = max_relative_difference(sharded_model, plain_model);
  CHECK_MESSAGE(err <= tolerance, fmt::format("relative difference {:.3e}", err));
  CHECK(max_relative_difference(plain_model, start) > 1e-3);  // the weights moved
  CHECK(identical_on_all_ranks(*sharded_model));

  // 1/size of the state, plus at most one padding element per unit and state tensor (by
  // default three units: fc1's floats; the second group's floats and its float64 parameter).
  const double whole = static_cast<double>(state_elements(plain_opt));
  const double mine = static_cast<double>(state_elements(sharded_opt));
  const int tensors_per_parameter = std::is_same_v<Opt, torch::optim::Adam> ? 2 : 1;
  const auto units = static_cast<double>(shard_tensors(sharded_opt));
  CHECK(units == (setting.unit_bytes == 0 ? 7 : 3));
  CHECK(whole > 0);
  CHECK(mine >= whole / world_size());
  CHECK(mine < whole / world_size() + units * tensors_per_parameter);
}

}  // namespace

TEST_CASE("Shard::optimizer_state: SGD with momentum and weight decay equals the unsharded run") {
  auto first = torch::optim::SGDOptions(0.05).momentum(0.9).weight_decay(1e-2);
  auto second = torch::optim::SGDOptions(0.02).momentum(0.5).nesterov(true).dampening(0);
  SUBCASE("one backward pass per step") {
    check_sharded_equals_unsharded<torch::optim::SGD>(first, second, 1, Clip::no);
  }
  SUBCASE("backward_passes_per_step = 2") {
    check_sharded_equals_unsharded<torch::optim::SGD>(first, second, 2, Clip::no);
  }
  SUBCASE("clip_grad_norm between synchronize() and step()") {
    check_sharded_equals_unsharded<torch::optim::SGD>(first, second, 1, Clip::yes);
  }
  SUBCASE("fp16 compression") {
    check_sharded_equals_unsharded<torch::optim::SGD>(first, second, 1, Clip::no,
                                                      dtrain::Compression::fp16);
  }
  SUBCASE("a unit per parameter") {
    check_sharded_equals_unsharded<torch::optim::SGD>(first, second, 2, Clip::no,
                                                      dtrain::Compression::none,
                                                      {Shard::optimizer_state, 0});
  }
}

TEST_CASE("Shard::gradients: SGD with momentum and weight decay equals the unsharded run") {
  auto first = torch::optim::SGDOptions(0.05).momentum(0.9).weight_decay(1e-2);
  auto second = torch::optim::SGDOptions(0.02).momentum(0.5).nesterov(true).dampening(0);
  const auto none = dtrain::Compression::none;
  SUBCASE("one unit per family") {
    check_sharded_equals_unsharded<torch::optim::SGD>(first, second, 1, Clip::no, none,
                                                      {Shard::gradients});
  }
  SUBCASE("a unit per parameter, backward_passes_per_step = 2") {
    check_sharded_equals_unsharded<torch::optim::SGD>(first, second, 2, Clip::no, none,
                                                      {Shard::gradients, 0});
  }
  SUBCASE("a unit per parameter, clip_grad_norm") {
    check_sharded_equals_unsharded<torch::optim::SGD>(first, second, 1, Clip::yes, none,
                                                      {Shard::gradients, 0});
  }
  SUBCASE("a unit per parameter, fp16 compression") {
    check_sharded_equals_unsharded<torch::optim::SGD>(first, second, 1, Clip::no,
                                                      dtrain::Compression::fp16,
                                                      {Shard::gradients, 0});
  }
}

TEST_CASE("Shard::optimizer_state: Adam equals the unsharded run") {
  auto first = torch::optim::AdamOptions(1e-2).weight_decay(1e-3);
  auto second = torch::optim::AdamOptions(3e-3).betas({0.8, 0.99}).amsgrad(false);
  SUBCASE("one backward pass per step") {
    check_sharded_equals_unsharded<torch::optim::Adam>(first, second, 1, Clip::no);
  }
  SUBCASE("backward_passes_per_step = 3 and clip_grad_norm") {
    check_sharded_equals_unsharded<torch::optim::Adam>(first, second, 3, Clip::yes);
  }
  SUBCASE("Shard::gradients, a unit per parameter, backward_passes_per_step = 3 and clip") {
    check_sharded_equals_unsharded<torch::optim::Adam>(first, second, 3, Clip::yes,
                                                       dtrain::Compression::none,
                                                       {Shard::gradients, 0});
  }
}

TEST_CASE("a sharded optimizer's reduce-scatters start during backward, before step()") {
  dtrain::init();
  for (auto shard : {Shard::optimizer_state, Shard::gradients}) {
    CAPTURE(static_cast<int>(shard));
    ShardNet model = make_model();
    torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
    DistributedOptimizer sharded(sgd, model->named_parameters(),
                                 {.bucket_bytes = 0, .shard = shard});
    sharded.zero_grad();
    const auto before = dtrain::engine_stats().reducescatter_bytes;
    loss_of(model, 1).backward();
    // Every rank's hooks posted every unit: they complete without step(). Waiting up to a minute
    // only bounds a failure; a pass takes milliseconds.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (dtrain::engine_stats().reducescatter_bytes == before &&
           std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    CHECK(dtrain::engine_stats().reducescatter_bytes > before);
    CHECK(model_holds_gradients(model) == (shard == Shard::optimizer_state));
    CHECK(sharded.step());
    CHECK(identical_on_all_ranks(*model));
  }
}

TEST_CASE("a sharded optimizer refuses what would make its state wrong, on every rank") {
  dtrain::init();
  DistributedOptimizerOptions options;
  options.shard = Shard::optimizer_state;

  SUBCASE("LBFGS") {
    ShardNet model = make_model();
    torch::optim::LBFGS lbfgs(model->parameters());
    CHECK_THROWS_WITH_AS(DistributedOptimizer(lbfgs, model->named_parameters(), options),
                         doctest::Contains("cannot shard LBFGS"), dtrain::InvalidArgumentError);
  }
  SUBCASE("an optimizer that already holds state") {
    ShardNet model = make_model();
    torch::optim::Adam adam(model->parameters());
    loss_of(model, 0).backward();
    adam.step();
    CHECK_THROWS_WITH_AS(DistributedOptimizer(adam, model->named_parameters(), options),
                         doctest::Contains("holds state for 5 parameter(s)"),
                         dtrain::InvalidArgumentError);
  }
  SUBCASE("parameters that differ across ranks") {
    ShardNet model = make_model();
    std::vector<torch::Tensor> params = model->parameters();
    if (world_rank() == world_size() - 1 && world_size() > 1) params.pop_back();
    torch::optim::SGD sgd(params, torch::optim::SGDOptions(0.1));
    if (world_size() > 1)
      CHECK_THROWS_WITH_AS(
          DistributedOptimizer(sgd, model->named_parameters(), options),
          doctest::Contains(fmt::format("needs the same parameters and sharding options on every "
                                        "rank, but rank {} has",
                                        world_size() - 1).c_str()),
          dtrain::InvalidArgumentError);
  }
  SUBCASE("unit sizes that differ across ranks") {
    ShardNet model = make_model();
    torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
    options.bucket_bytes = world_rank() == 0 ? 0 : 64;
    if (world_size() > 1)
      CHECK_THROWS_WITH_AS(DistributedOptimizer(sgd, model->named_parameters(), options),
                           doctest::Contains("units of 64 bytes\" where rank 0 has \""
                                             "Shard::optimizer_state, units of 0 bytes"),
                           dtrain::InvalidArgumentError);
  }
  SUBCASE("saving or broadcasting the sharded state") {
    ShardNet model = make_model();
    torch::optim::Adam adam(model->parameters());
    DistributedOptimizer sharded(adam, model->named_parameters(), options);
    CHECK_THROWS_WITH_AS(dtrain::broadcast_optimizer_state(adam), doctest::Contains("is not built"),
                         dtrain::InvalidArgumentError);
    dtrain::ObjectWriter w;
    CHECK_THROWS_WITH_AS(dtrain_serialize(w, static_cast<const torch::optim::Optimizer&>(adam)),
                         doctest::Contains("saving the state"), dtrain::InvalidArgumentError);
  }
  SUBCASE("clip_grad_norm's arguments") {
    ShardNet model = make_model();
    torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
    DistributedOptimizer sharded(sgd, model->named_parameters(), options);
    CHECK_THROWS_WITH_AS(sharded.clip_grad_norm(0), doctest::Contains("max_norm = 0"),
                         dtrain::InvalidArgumentError);
    CHECK_THROWS_WITH_AS(sharded.clip_grad_norm(1, 1), doctest::Contains("norm_type = 1"),
                         dtrain::InvalidArgumentError);
  }
  SUBCASE("a Shard that is not one") {
    ShardNet model = make_model();
    torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
    options.shard = static_cast<Shard>(7);
    CHECK_THROWS_WITH_AS(DistributedOptimizer(sgd, model->named_parameters(), options),
                         doctest::Contains("shard = 7"), dtrain::InvalidArgumentError);
  }
}

namespace {

// A model and its sharded (or unsharded) Adam, resumable from a checkpoint.
struct Trainer {
  explicit Trainer(Shard shard, std::optional<std::int64_t> unit_bytes = std::nullopt)
      : model(make_model()),
        adam(make_optimizer<torch::optim::Adam>(
            model, torch::optim::AdamOptions(1e-2),
            torch::optim::AdamOptions(3e-3).weight_decay(1e-2))),
        dist(adam, model->named_parameters(),
             DistributedOptimizerOptions{.bucket_bytes = unit_bytes, .shard = shard}) {}

  void train(std::int64_t from, std::int64_t to) {
    for (std::int64_t t = from; t < to; ++t) {
      dist.zero_grad();
      loss_of(model, t).backward();
      CHECK(dist.step());
    }
  }

  ShardNet model;
  torch::optim::Adam adam;
  DistributedOptimizer<torch::optim::Adam> dist;
};

bool bitwise_equal(ShardNet& a, ShardNet& b) {
  auto pb = b->named_parameters();
  for (auto& item : a->named_parameters())
    if (!torch::equal(item.value(), pb[item.key()])) return false;
  return true;
}

}  // namespace

TEST_CASE("a sharded optimizer's gathered state resumes it bitwise, through a checkpoint") {
  dtrain::init();
  dtrain::test::TempDir dir;
  Trainer uninterrupted(Shard::optimizer_state);
  uninterrupted.train(0, 3);
  {
    dtrain::Checkpoint checkpoint({.directory = dir.path().string(), .name = "shard-resume"});
    const auto state = uninterrupted.dist.gather_state();
    checkpoint.save({.step = 3}, {{"model", *uninterrupted.model}, {"optimizer", state}});
  }
  uninterrupted.train(3, 6);

  Trainer resumed(Shard::optimizer_state), without_state(Shard::optimizer_state);
  dtrain::Checkpoint checkpoint({.directory = dir.path().string(), .name = "shard-resume"});
  auto saved = checkpoint.restore();
  REQUIRE(saved.has_value());
  saved->load("model", *resumed.model);
  resumed.dist.load_state(saved->get<dtrain::OptimizerState>("optimizer"));
  saved->load("model", *without_state.model);
  resumed.train(3, 6);
  without_state.train(3, 6);
  CHECK(bitwise_equal(resumed.model, uninterrupted.model));
  CHECK_FALSE(bitwise_equal(without_state.model, uninterrupted.model));  // the state mattered

  SUBCASE("into Shard::gradients with a unit per parameter") {
    // The state describes each family whole, whatever the units that gathered it; other units
    // reduce in other pieces, so the runs agree to rounding, not bitwise.
    Trainer other_units(Shard::gradients, 0);
    saved->load("model", *other_units.model);
    other_units.dist.load_state(saved->get<dtrain::OptimizerState>("optimizer"));
    other_units.train(3, 6);
    const double err = max_relative_difference(other_units.model, uninterrupted.model);
    CHECK_MESSAGE(err <= kTolerance, fmt::format("relative difference {:.3e}", err));
  }

  SUBCASE("the state of one mode is refused by the other, and by other parameters") {
    Trainer unsharded(Shard::none);
    auto state = saved->get<dtrain::OptimizerState>("optimizer");
    CHECK_THROWS_WITH_AS(unsharded.dist.load_state(state),
                         doctest::Contains("this one is unsharded"), dtrain::InvalidArgumentError);
    CHECK_THROWS_WITH_AS(resumed.dist.load_state(unsharded.dist.gather_state()),
                         doctest::Contains("gathered from an unsharded"),
                         dtrain::InvalidArgumentError);
    state.layout.replace(state.layout.find("[5, 7]"), 6, "[5, 8]");
    CHECK_THROWS_WITH_AS(resumed.dist.load_state(state),
                         doctest::Contains("'fc1.weight': Float [5, 8]\" where the other has "
                                           "\"group 0 'fc1.weight': Float [5, 7]"),
                         dtrain::InvalidArgumentError);
  }
}

// Run by ctest in two parts (tests/torch/CMakeLists.txt): one world size saves, others resume.
// The sharded and the unsharded optimizer are saved at the same step, resumed on a different
// number of ranks, and must go on to the same parameters; sharded runs never equal unsharded ones
// bitwise, as a reduce-scatter sums in another order than an allreduce.
TEST_CASE("sharded state saved on one world size resumes on another" * doctest::skip()) {
  dtrain::init();
  const char* dir = std::getenv("DTRAIN_TEST_SHARD_CHECKPOINT_DIR");
  const char* mode = std::getenv("DTRAIN_TEST_SHARD_CHECKPOINT_MODE");
  REQUIRE(dir != nullptr);
  REQUIRE(mode != nullptr);
  const bool save = std::string(mode) == "save";
  if (save && world_rank() == 0) std::filesystem::remove_all(dir);  // a previous run's
  dtrain::barrier();
  Trainer sharded(Shard::optimizer_state), plain(Shard::none), stage2(Shard::gradients, 0);
  dtrain::Checkpoint checkpoint({.directory = dir, .keep_last = 1});
  if (save) {
    sharded.train(0, 4);
    plain.train(0, 4);
    stage2.train(0, 4);
    checkpoint.save({.step = 4}, {{"sharded.model", *sharded.model},
                                  {"sharded.optimizer", sharded.dist.gather_state()},
                                  {"plain.model", *plain.model},
                                  {"plain.optimizer", plain.dist.gather_state()},
                                  {"stage2.model", *stage2.model},
                                  {"stage2.optimizer", stage2.dist.gather_state()}});
    checkpoint.wait();
    return;
  }
  auto saved = checkpoint.restore();
  REQUIRE(saved.has_value());
  CHECK(saved->world_size() != world_size());
  Trainer without_state(Shard::optimizer_state);
  saved->load("sharded.model", *sharded.model);
  sharded.dist.load_state(saved->get<dtrain::OptimizerState>("sharded.optimizer"));
  saved->load("plain.model", *plain.model);
  plain.dist.load_state(saved->get<dtrain::OptimizerState>("plain.optimizer"));
  saved->load("stage2.model", *stage2.model);
  stage2.dist.load_state(saved->get<dtrain::OptimizerState>("stage2.optimizer"));
  saved->load("sharded.model", *without_state.model);
  for (auto* t : {&sharded, &plain, &stage2, &without_state}) t->train(4, 8);
  const double err = max_relative_difference(sharded.model, plain.model);
  CHECK_MESSAGE(err <= kTolerance, fmt::format("relative difference {:.3e}", err));
  const double stage2_err = max_relative_difference(stage2.model, plain.model);
  CHECK_MESSAGE(stage2_err <= kTolerance, fmt::format("Shard::gradients: {:.3e}", stage2_err));
  CHECK(max_relative_difference(without_state.model, plain.model) > 1e-4);  // the state mattered
  CHECK(identical_on_all_ranks(*sharded.model));
  CHECK(identical_on_all_ranks(*stage2.model));
}
