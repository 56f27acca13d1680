// libtorch objects through dtrain's object serialization (<dtrain/torch/serialize.hpp>): tensors,
// modules, optimizers and generators restore bitwise, in place, and refuse data that does not fit
// with an error naming what; through dtrain::Checkpoint on every rank, a restored model and
// optimizer continue training exactly like the ones that were saved.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_test_util.hpp"
#include "dtrain/torch.hpp"
#include <doctest/doctest.h>

namespace {

using checkpoint_test::SharedTempDir;
using checkpoint_test::world_rank;

// Same dtype, shape and bytes.
bool bitwise_equal(const torch::Tensor& a, const torch::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  const auto x = a.detach().contiguous(), y = b.detach().contiguous();
  return std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) == 0;
}

template <class T>
T round_trip(const T& value) {
  const auto bytes = dtrain::serialize_object(value);
  return dtrain::deserialize_object<T>(bytes.data(), bytes.size());
}

// A small convolutional net with batch norm: parameters, float buffers (running statistics) and an
// int64 buffer (num_batches_tracked), nested modules with dotted names.
struct NetImpl : torch::nn::Module {
  explicit NetImpl(std::int64_t width = 4)
      : conv(register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, width, 3)))),
        norm(register_module("norm", torch::nn::BatchNorm2d(width))),
        fc(register_module("fc", torch::nn::Linear(width, 3))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = torch::relu(norm(conv(x)));
    return fc(h.mean({2, 3}));
  }
  torch::nn::Conv2d conv;
  torch::nn::BatchNorm2d norm;
  torch::nn::Linear fc;
};
TORCH_MODULE(Net);

struct Data {
  torch::Tensor x, y;
};
Data batch(std::int64_t i) {
  auto g = at::detail::createCPUGenerator(static_cast<std::uint64_t>(100 + i));
  return {torch::randn({6, 1, 6, 6}, g), torch::randint(0, 3, {6}, g)};
}

template <class Opt>
void train_steps(Net& net, Opt& opt, std::int64_t first, std::int64_t count) {
  net->train();
  for (std::int64_t i = first; i < first + count; ++i) {
    const auto d = batch(i);
    opt.zero_grad();
    torch::nn::functional::cross_entropy(net->forward(d.x), d.y).backward();
    opt.step();
  }
}

void check_same_model(Net& a, Net& b) {
  const auto pa = a->named_parameters(), pb = b->named_parameters();
  for (const auto& item : pa) {
    CAPTURE(item.key());
    CHECK(bitwise_equal(item.value(), pb[item.key()]));
  }
  const auto ba = a->named_buffers(), bb = b->named_buffers();
  for (const auto& item : ba) {
    CAPTURE(item.key());
    CHECK(bitwise_equal(item.value(), bb[item.key()]));
  }
}

TEST_CASE("tensors: dtype, shape and bytes round trip; in place into a defined tensor") {
  torch::manual_seed(7);
  const std::vector<torch::Tensor> cases = {
      torch::randn({3, 5}),
      torch::randn({4}, torch::kDouble),
      torch::randint(-1000, 1000, {2, 3, 2}, torch::kLong),
      torch::randn({7}).to(torch::kBFloat16),
      torch::randn({6}).to(torch::kHalf),
      torch::tensor(3.5),                  // 0-d
      torch::empty({0, 4}),                // no elements
      torch::randn({4, 6}).t(),            // not contiguous
      torch::tensor({true, false, true}),  // bool
  };
  for (const auto& t : cases) {
    CAPTURE(t.sizes());
    CAPTURE(t.scalar_type());
    const auto back = round_trip(t);
    CHECK(back.device().is_cpu());
    CHECK(bitwise_equal(back, t));
  }
  CHECK_FALSE(round_trip(torch::Tensor()).defined());

  // Into a defined tensor: its own storage is written (views of it see the new values).
  const auto source = torch::randn({2, 3});
  auto target = torch::zeros({2, 3});
  const auto* storage = target.data_ptr();
  const auto bytes = dtrain::serialize_object(source);
  dtrain::ObjectReader reader(bytes.data(), bytes.size());
  reader.read(target);
  CHECK(target.data_ptr() == storage);
  CHECK(bitwise_equal(target, source));

  auto wrong = torch::zeros({3, 2});
  dtrain::ObjectReader again(bytes.data(), bytes.size());
  CHECK_THROWS_WITH_AS(again.read(wrong), doctest::Contains("Float [3, 2] here but Float [2, 3]"),
                       dtrain::InvalidArgumentError);
}

TEST_CASE("modules: parameters and buffers restore bitwise and in place, also through a holder") {
  torch::manual_seed(1);
  Net trained;
  torch::optim::SGD sgd(trained->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  train_steps(trained, sgd, 0, 3);  // moves the parameters and the running statistics

  torch::manual_seed(2);
  Net fresh;
  const auto* weight = fresh->conv->weight.data_ptr();
  const auto bytes = dtrain::serialize_object(*trained);  // the module itself
  dtrain::ObjectReader reader(bytes.data(), bytes.size());
  reader.read(*fresh);
  CHECK(reader.done());
  check_same_model(fresh, trained);
  CHECK(fresh->conv->weight.data_ptr() == weight);  // in place: an optimizer's references hold
  CHECK(fresh->norm->num_batches_tracked.item<std::int64_t>() == 3);

  torch::manual_seed(3);
  Net held;
  const auto holder_bytes = dtrain::serialize_object(trained);  // the holder
  CHECK(holder_bytes == bytes);
  dtrain::ObjectReader holder_reader(holder_bytes.data(), holder_bytes.size());
  holder_reader.read(held);
  check_same_model(held, trained);
}

TEST_CASE("modules: another architecture is refused, naming the tensors, and left untouched") {
  torch::manual_seed(1);
  Net four(4);
  const auto bytes = dtrain::serialize_object(*four);

  torch::manual_seed(2);
  Net eight(8);
  const auto before = eight->conv->weight.clone();
  dtrain::ObjectReader reader(bytes.data(), bytes.size());
  CHECK_THROWS_WITH_AS(reader.read(*eight),
                       doctest::Contains("parameter 'conv.weight' is Float [8, 1, 3, 3] here but "
                                         "Float [4, 1, 3, 3] in the serialized data"),
                       dtrain::InvalidArgumentError);
  CHECK(bitwise_equal(eight->conv->weight, before));

  // A module without the batch norm: its buffers are in the data but not in the module.
  struct Plain : torch::nn::Module {
    Plain() {
      register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 4, 3)));
      register_module("fc", torch::nn::Linear(4, 3));
    }
  } plain;
  dtrain::ObjectReader plain_reader(bytes.data(), bytes.size());
  CHECK_THROWS_WITH_AS(plain_reader.read(plain),
                       doctest::Contains("in the data but not in the module: [norm.bias, norm.weight]"),
                       dtrain::InvalidArgumentError);
}

TEST_CASE("optimizers: SGD momentum and Adam state restore, and training continues bitwise") {
  auto check = [](auto make_optimizer) {
    torch::manual_seed(11);
    Net a;
    auto opt_a = make_optimizer(a);
    train_steps(a, opt_a, 0, 4);
    for (auto& group : opt_a.param_groups()) group.options().set_lr(0.0123);  // an option too
    const auto model_bytes = dtrain::serialize_object(*a);
    const auto optimizer_bytes = dtrain::serialize_object(opt_a);

    torch::manual_seed(12);
    Net b;
    auto opt_b = make_optimizer(b);
    dtrain::ObjectReader model_reader(model_bytes.data(), model_bytes.size());
    model_reader.read(*b);
    dtrain::ObjectReader optimizer_reader(optimizer_bytes.data(), optimizer_bytes.size());
    optimizer_reader.read(opt_b);
    CHECK(optimizer_reader.done());
    CHECK(opt_b.param_groups()[0].options().get_lr() == 0.0123);

    // Without the state (momentum, Adam's moments and step count) b would take other steps.
    train_steps(a, opt_a, 4, 3);
    train_steps(b, opt_b, 4, 3);
    check_same_model(b, a);

    // The control: the same weights with a fresh optimizer do not end up the same.
    torch::manual_seed(13);
    Net c;
    auto opt_c = make_optimizer(c);
    dtrain::ObjectReader control_reader(model_bytes.data(), model_bytes.size());
    control_reader.read(*c);
    train_steps(c, opt_c, 4, 3);
    CHECK_FALSE(bitwise_equal(c->fc->weight, a->fc->weight));
  };
  SUBCASE("SGD") {
    check([](Net& n) {
      return torch::optim::SGD(n->parameters(),
                               torch::optim::SGDOptions(0.05).momentum(0.9).weight_decay(1e-3));
    });
  }
  SUBCASE("Adam") {
    check([](Net& n) { return torch::optim::Adam(n->parameters(), torch::optim::AdamOptions(0.01)); });
  }
}

TEST_CASE("optimizers: state for other parameter groups is refused with the reason") {
  torch::manual_seed(1);
  Net net;
  torch::optim::SGD two_groups(
      {torch::optim::OptimizerParamGroup(net->conv->parameters()),
       torch::optim::OptimizerParamGroup(net->fc->parameters())},
      torch::optim::SGDOptions(0.1).momentum(0.9));
  train_steps(net, two_groups, 0, 1);
  const auto bytes = dtrain::serialize_object(two_groups);
  torch::optim::SGD one_group(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  dtrain::ObjectReader reader(bytes.data(), bytes.size());
  CHECK_THROWS_WITH_AS(reader.read(one_group),
                       doctest::Contains("the serialized optimizer state does not fit this optimizer"),
                       dtrain::InvalidArgumentError);
}

TEST_CASE("generators: a generator and libtorch's default ones continue their streams") {
  auto g = at::detail::createCPUGenerator(99);
  torch::rand({10}, g);
  const auto bytes = dtrain::serialize_object(g);
  const auto expected = torch::rand({8}, g);

  auto other = at::detail::createCPUGenerator(5);
  dtrain::ObjectReader reader(bytes.data(), bytes.size());
  reader.read(other);
  CHECK(bitwise_equal(torch::rand({8}, other), expected));

  torch::Generator undefined;
  dtrain::ObjectReader undefined_reader(bytes.data(), bytes.size());
  CHECK_THROWS_WITH_AS(undefined_reader.read(undefined), doctest::Contains("undefined torch::Generator"),
                       dtrain::InvalidArgumentError);

  torch::manual_seed(4);
  torch::randn({3});
  const auto state = round_trip(dtrain::torch_rng_state());
  const auto next = torch::randn({5});
  torch::manual_seed(1000);  // elsewhere in the stream
  dtrain::set_torch_rng_state(state);
  CHECK(bitwise_equal(torch::randn({5}), next));

  dtrain::TorchRngState empty;
  CHECK_THROWS_WITH_AS(dtrain::set_torch_rng_state(empty), doctest::Contains("no CPU generator"),
                       dtrain::InvalidArgumentError);
}

TEST_CASE("through dtrain::Checkpoint on every rank: shared model and optimizer, per-rank generator") {
  dtrain::init();
  SharedTempDir dir;
  torch::manual_seed(21);
  Net net;
  dtrain::broadcast_module(*net);
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  dtrain::DistributedOptimizer optimizer(sgd, net->named_parameters());
  auto rank_rng = at::detail::createCPUGenerator(static_cast<std::uint64_t>(500 + world_rank()));
  // The same batches on every rank, so batch norm's running statistics, which are each rank's own,
  // are the same on every rank too: the shared item holds rank 0's.
  train_steps(net, optimizer, 0, 2);
  torch::rand({3}, rank_rng);
  {
    dtrain::Checkpoint checkpoint({.directory = dir.path()});
    checkpoint.save({.step = 2, .epoch = 0},
                    {{"model", *net}, {"optimizer", sgd}, {"torch_rng", dtrain::torch_rng_state()}},
                    {{"rank_rng", rank_rng}});
    checkpoint.wait();
  }
  const auto expected_rng = torch::rand({4}, rank_rng);
  const auto expected_default = torch::rand({4});
  train_steps(net, optimizer, 10, 2);

  torch::manual_seed(22);
  Net restored_net;
  torch::optim::SGD restored_sgd(restored_net->parameters(),
                                 torch::optim::SGDOptions(0.05).momentum(0.9));
  dtrain::DistributedOptimizer restored_optimizer(restored_sgd, restored_net->named_parameters(),
                                                  {.name = "restored"});
  auto restored_rng = at::detail::createCPUGenerator(1);
  dtrain::Checkpoint checkpoint({.directory = dir.path()});
  const auto restored = checkpoint.restore();
  REQUIRE(restored.has_value());
  CHECK(restored->step() == 2);
  restored->load("model", *restored_net);
  restored->load("optimizer", restored_sgd);
  restored->load("rank_rng", restored_rng);
  dtrain::set_torch_rng_state(restored->get<dtrain::TorchRngState>("torch_rng"));
  CHECK(bitwise_equal(torch::rand({4}, restored_rng), expected_rng));  // this rank's own
  CHECK(bitwise_equal(torch::rand({4}), expected_default));
  train_steps(restored_net, restored_optimizer, 10, 2);
  check_same_model(restored_net, net);

  // A model of another width: the checkpoint's error names the item and the tensor.
  Net wide(8);
  CHECK_THROWS_WITH_AS(restored->load("model", *wide),
                       doctest::Contains("item 'model' of checkpoint"), dtrain::CheckpointError);
  CHECK_THROWS_WITH_AS(restored->load("model", *wide), doctest::Contains("'conv.weight'"),
                       dtrain::CheckpointError);
}

}  // namespace
