// dtrain::SyncBatchNorm and convert_sync_batchnorm (include/dtrain/torch/sync_batch_norm.hpp,
// convert_sync_batchnorm.hpp). N ranks, each with its rows of a global batch, must give the
// outputs, running statistics and gradients that libtorch's BatchNorm gives one process with the
// whole batch; every rank computes that reference itself from the same data. float64 throughout,
// so "equal" means equal to float64 rounding.
#include "dtrain/torch/convert_sync_batchnorm.hpp"
#include "dtrain/torch/sync_batch_norm.hpp"

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dtrain/torch.hpp"
#include "train/train_test_util.hpp"

namespace {

using namespace train_test;
using dtrain::SyncBatchNorm;
using dtrain::SyncBatchNormOptions;

constexpr double kTolerance = 1e-10;
constexpr std::int64_t kChannels = 3;

// Largest |a - b| / max(1, |b|); infinity when the shapes differ.
double max_error(const torch::Tensor& a, const torch::Tensor& b) {
  if (a.sizes() != b.sizes()) return INFINITY;
  if (a.numel() == 0) return 0;
  const auto a64 = a.to(torch::kDouble), b64 = b.to(torch::kDouble);
  return ((a64 - b64).abs() / b64.abs().clamp_min(1.0)).max().item<double>();
}

void check_tensor_close(const torch::Tensor& got, const torch::Tensor& want, double tolerance,
                 const std::string& what) {
  const double e = max_error(got, want);
  CHECK_MESSAGE(e <= tolerance, fmt::format("rank {}: {}: error {:.3e}", world_rank(), what, e));
}

// How the global batch's rows are split over the ranks.
enum class Split { even, uneven, empty_last_rank };

std::vector<std::int64_t> rows_per_rank(Split split) {
  std::vector<std::int64_t> rows;
  for (int k = 0; k < world_size(); ++k) {
    if (split == Split::even) rows.push_back(3);
    if (split == Split::uneven) rows.push_back(k + 2);
    if (split == Split::empty_last_rank) rows.push_back(k + 1 == world_size() ? 0 : k + 2);
  }
  return rows;
}

std::int64_t first_row(const std::vector<std::int64_t>& rows, int rank) {
  std::int64_t first = 0;
  for (int k = 0; k < rank; ++k) first += rows[static_cast<std::size_t>(k)];
  return first;
}

// libtorch's BatchNorm of the dimension that takes inputs of `input_dim` dimensions.
torch::nn::AnyModule reference_batch_norm(std::int64_t input_dim,
                                          const torch::nn::BatchNormOptions& options) {
  if (input_dim <= 3) return torch::nn::AnyModule(torch::nn::BatchNorm1d(options));
  if (input_dim == 4) return torch::nn::AnyModule(torch::nn::BatchNorm2d(options));
  return torch::nn::AnyModule(torch::nn::BatchNorm3d(options));
}

std::vector<std::int64_t> input_shape(std::int64_t input_dim, std::int64_t rows) {
  std::vector<std::int64_t> shape{rows, kChannels};
  const std::vector<std::int64_t> spatial{4, 3, 2};
  for (std::int64_t d = 2; d < input_dim; ++d)
    shape.push_back(spatial[static_cast<std::size_t>(d - 2)]);
  return shape;
}

torch::Tensor sum_over_ranks(torch::Tensor t) {
  t = t.clone();
  dtrain::allreduce(t, {.op = dtrain::ReduceOp::Sum});
  return t;
}

bool same_on_all_ranks(const torch::Tensor& t) {
  const auto c = t.contiguous();
  return train_test::same_on_all_ranks(c.data_ptr(), c.nbytes());
}

struct Variant {
  std::optional<double> momentum;
  bool affine;
  bool track;
};

}  // namespace

TEST_CASE("SyncBatchNorm: N ranks give the outputs, statistics and gradients of one process") {
  dtrain::init();
  const std::vector<Variant> variants = {
      {0.1, true, true}, {std::nullopt, true, true}, {0.3, false, false}};
  int config = 0;
  for (const std::int64_t dim : {2, 3, 4, 5}) {
    for (const Split split : {Split::even, Split::uneven, Split::empty_last_rank}) {
      if (split == Split::empty_last_rank && world_size() == 1) continue;  // nothing at all
      const Variant v = variants[static_cast<std::size_t>(config++) % variants.size()];
      CAPTURE(dim);
      CAPTURE(static_cast<int>(split));
      CAPTURE(v.affine);
      const auto rows = rows_per_rank(split);
      const auto me = world_rank();
      const auto first = first_row(rows, me), mine = rows[static_cast<std::size_t>(me)];
      const auto total = first_row(rows, world_size());

      auto ref = reference_batch_norm(dim, torch::nn::BatchNormOptions(kChannels)
                                               .momentum(v.momentum)
                                               .affine(v.affine)
                                               .track_running_stats(v.track));
      ref.ptr()->to(torch::kDouble);
      SyncBatchNorm sync(SyncBatchNormOptions(kChannels)
                             .momentum(v.momentum)
                             .affine(v.affine)
                             .track_running_stats(v.track)
                             .name("test.sync_bn"));
      sync->to(torch::kDouble);
      auto ref_params = ref.ptr()->named_parameters();
      auto ref_buffers = ref.ptr()->named_buffers();
      if (v.affine) {
        torch::NoGradGuard no_grad;
        torch::manual_seed(7);
        sync->weight.copy_(torch::randn({kChannels}, torch::kDouble));
        sync->bias.copy_(torch::randn({kChannels}, torch::kDouble));
        ref_params["weight"].copy_(sync->weight);
        ref_params["bias"].copy_(sync->bias);
      }

      for (int step = 0; step < 2; ++step) {
        CAPTURE(step);
        // The same global batch on every rank: a large mean against the spread, which a plain
        // sum of squares in float64 would already blur at this tolerance.
        torch::manual_seed(100 + step);
        const auto x = torch::randn(input_shape(dim, total), torch::kDouble) * 2 + 30;
        const auto upstream = torch::randn_like(x);

        auto x_ref = x.clone().requires_grad_();
        const auto y_ref = ref.forward<torch::Tensor>(x_ref);
        (y_ref * upstream).sum().backward();

        auto x_mine = x.narrow(0, first, mine).clone().requires_grad_();
        const auto y = sync(x_mine);
        (y * upstream.narrow(0, first, mine)).sum().backward();

        check_tensor_close(y, y_ref.narrow(0, first, mine), kTolerance, "output");
        check_tensor_close(x_mine.grad(), x_ref.grad().narrow(0, first, mine), kTolerance,
                           "input grad");
        if (v.affine) {
          // Each rank's own sums: the optimizer's allreduce adds them up.
          check_tensor_close(sum_over_ranks(sync->weight.grad()), ref_params["weight"].grad(),
                             kTolerance, "weight grad");
          check_tensor_close(sum_over_ranks(sync->bias.grad()), ref_params["bias"].grad(),
                             kTolerance, "bias grad");
          sync->zero_grad();
          ref.ptr()->zero_grad();
        }
        if (v.track) {
          check_tensor_close(sync->running_mean, ref_buffers["running_mean"], kTolerance,
                             "running mean");
          check_tensor_close(sync->running_var, ref_buffers["running_var"], kTolerance,
                             "running var");
          CHECK(sync->num_batches_tracked.item<std::int64_t>() == step + 1);
          CHECK(same_on_all_ranks(sync->running_mean));
          CHECK(same_on_all_ranks(sync->running_var));
        } else {
          CHECK_FALSE(sync->running_mean.defined());
        }
      }
    }
  }
}

TEST_CASE("SyncBatchNorm: bfloat16 inputs are normalized in float and returned as bfloat16") {
  dtrain::init();
  const auto rows = rows_per_rank(Split::uneven);
  const auto first = first_row(rows, world_rank());
  const auto mine = rows[static_cast<std::size_t>(world_rank())];
  torch::manual_seed(11);
  const auto x = (torch::randn(input_shape(4, first_row(rows, world_size()))) * 3 + 1)
                     .to(torch::kBFloat16);
  torch::nn::BatchNorm2d ref(kChannels);
  const auto y_ref = ref(x.to(torch::kFloat));
  SyncBatchNorm sync(kChannels);
  auto x_mine = x.narrow(0, first, mine).clone().requires_grad_();
  const auto y = sync(x_mine);
  CHECK((y.scalar_type() == torch::kBFloat16));
  // One rounding to bfloat16 (8 significant bits) of the float result.
  check_tensor_close(y, y_ref.narrow(0, first, mine), std::ldexp(1.0, -8), "bfloat16 output");
  y.sum().backward();
  CHECK((x_mine.grad().scalar_type() == torch::kBFloat16));
  check_tensor_close(sync->running_mean, ref->running_mean, 1e-6, "running mean");
}

TEST_CASE("SyncBatchNorm in eval mode uses the running statistics and communicates nothing") {
  dtrain::init();
  torch::manual_seed(21);
  SyncBatchNorm sync(SyncBatchNormOptions(kChannels).momentum(0.5));
  sync(torch::randn({4, kChannels, 3, 3}) * 2 + 5);  // running statistics that are not the defaults
  sync->eval();
  torch::nn::BatchNorm2d ref(kChannels);
  {
    torch::NoGradGuard no_grad;
    ref->running_mean.copy_(sync->running_mean);
    ref->running_var.copy_(sync->running_var);
  }
  ref->eval();
  const auto tracked = sync->num_batches_tracked.item<std::int64_t>();
  const auto requests = dtrain::engine_stats().requests_sent;
  torch::manual_seed(22 + world_rank());  // each rank its own batch, of its own size
  const auto x = torch::randn({1 + world_rank(), kChannels, 3, 3});
  CHECK(torch::equal(sync(x), ref(x)));

  // Without running statistics, eval normalizes with this rank's own batch, also alone.
  SyncBatchNorm untracked(SyncBatchNormOptions(kChannels).track_running_stats(false));
  untracked->eval();
  torch::nn::BatchNorm2d untracked_ref(
      torch::nn::BatchNormOptions(kChannels).track_running_stats(false));
  untracked_ref->eval();
  const auto x2 = torch::randn({2 + world_rank(), kChannels, 3, 3});
  check_tensor_close(untracked(x2), untracked_ref(x2), 1e-6, "eval without running statistics");

  CHECK(dtrain::engine_stats().requests_sent == requests);
  CHECK(sync->num_batches_tracked.item<std::int64_t>() == tracked);

  // clone(): the same options (name included) and values, in tensors of its own.
  const auto copy = std::dynamic_pointer_cast<dtrain::SyncBatchNormImpl>(sync->clone());
  CHECK(copy != nullptr);
  if (copy != nullptr) {
    CHECK(copy->options.name() == sync->options.name());
    CHECK(copy->options.momentum() == 0.5);
    CHECK(torch::equal(copy->running_var, sync->running_var));
    CHECK(copy->running_var.data_ptr() != sync->running_var.data_ptr());
    CHECK(copy->weight.requires_grad());
    CHECK(torch::equal(copy->forward(x), sync(x)));
  }
}

TEST_CASE("SyncBatchNorm: bad input fails on every rank with an error naming it, never a hang") {
  dtrain::init();
  using dtrain::InvalidArgumentError;
  const int last = world_size() - 1;
  SyncBatchNorm sync(SyncBatchNormOptions(kChannels).name("test.errors"));

  SUBCASE("wrong channel count on one rank: that rank names it, the others name that rank") {
    const auto channels = world_rank() == last ? kChannels + 1 : kChannels;
    const auto x = torch::randn({2, channels, 2});
    if (world_rank() == last) {
      CHECK_THROWS_WITH_AS(sync(x), doctest::Contains("expected 3 channels (dim 1), got sizes "
                                                      "[2, 4, 2]"),
                           InvalidArgumentError);
    } else {
      const auto expected = fmt::format("rejected on rank {}", last);
      CHECK_THROWS_WITH_AS(sync(x), doctest::Contains(expected.c_str()), InvalidArgumentError);
    }
    // The module works again at the next step.
    const auto y = sync(torch::randn({2, kChannels, 2}));
    CHECK(y.sizes().vec() == std::vector<std::int64_t>{2, kChannels, 2});
  }
  SUBCASE("one value per channel over all ranks: the variance is undefined") {
    const auto x = torch::randn({world_rank() == 0 ? 1 : 0, kChannels});
    CHECK_THROWS_WITH_AS(sync(x), doctest::Contains("expected more than 1 value per channel over "
                                                    "all ranks"),
                         InvalidArgumentError);
  }
  SUBCASE("an empty global batch: empty output, running averages untouched") {
    auto x = torch::randn({0, kChannels, 2, 2}).requires_grad_();
    const auto y = sync(x);
    CHECK(y.sizes() == x.sizes());
    y.sum().backward();
    CHECK(x.grad().sizes() == x.sizes());
    CHECK(torch::equal(sync->running_mean, torch::zeros({kChannels})));
    CHECK(sync->num_batches_tracked.item<std::int64_t>() == 1);  // as libtorch's BatchNorm
  }
  SUBCASE("integer and one-dimensional inputs, on every rank") {
    CHECK_THROWS_WITH_AS(sync(torch::ones({2, kChannels}, torch::kLong)),
                         doctest::Contains("expected a floating-point input, got Long"),
                         InvalidArgumentError);
    CHECK_THROWS_WITH_AS(sync(torch::ones({kChannels})),
                         doctest::Contains("expected an input [N, C] or [N, C, *], got sizes [3]"),
                         InvalidArgumentError);
  }
  SUBCASE("options") {
    CHECK_THROWS_WITH_AS(SyncBatchNorm(SyncBatchNormOptions(0)),
                         doctest::Contains("num_features = 0"), InvalidArgumentError);
    CHECK_THROWS_WITH_AS(SyncBatchNorm(SyncBatchNormOptions(2).eps(0)),
                         doctest::Contains("eps = 0"), InvalidArgumentError);
    CHECK_THROWS_WITH_AS(SyncBatchNorm(SyncBatchNormOptions(2).momentum(1.5)),
                         doctest::Contains("momentum = 1.5"), InvalidArgumentError);
  }
}

namespace {

// A residual block whose norms live in a Sequential, as examples/resnet holds them.
struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(std::int64_t c)
      : body(register_module(
            "body",
            torch::nn::Sequential(
                torch::nn::Conv2d(torch::nn::Conv2dOptions(c, c, 3).padding(1).bias(false)),
                torch::nn::BatchNorm2d(c), torch::nn::ReLU(),
                torch::nn::Conv2d(torch::nn::Conv2dOptions(c, c, 3).padding(1).bias(false)),
                torch::nn::BatchNorm2d(torch::nn::BatchNormOptions(c).momentum(0.2).eps(1e-3))))) {}
  torch::Tensor forward(const torch::Tensor& x) { return torch::relu(body->forward(x) + x); }
  torch::nn::Sequential body;
};
TORCH_MODULE(Block);

struct TinyResNetImpl : torch::nn::Module {
  TinyResNetImpl()
      : stem(register_module(
            "stem", torch::nn::Sequential(torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 4, 3)),
                                          torch::nn::BatchNorm2d(4), torch::nn::ReLU()))),
        blocks(register_module("blocks", torch::nn::ModuleList(Block(4), Block(4)))),
        head(register_module(
            "head", torch::nn::Sequential(torch::nn::AdaptiveAvgPool2d(1), torch::nn::Flatten(),
                                          torch::nn::Linear(4, 6), torch::nn::BatchNorm1d(6),
                                          torch::nn::Linear(6, 2)))) {}
  torch::Tensor forward(torch::Tensor x) {
    x = stem->forward(x);
    for (const auto& block : *blocks) x = block->as<Block>()->forward(x);
    return head->forward(x);
  }
  torch::nn::Sequential stem;
  torch::nn::ModuleList blocks;
  torch::nn::Sequential head;
};
TORCH_MODULE(TinyResNet);

TinyResNet make_tiny_resnet() {
  torch::manual_seed(5);  // the same weights on every rank and for the reference
  TinyResNet model;
  model->to(torch::kDouble);
  return model;
}

std::int64_t count_batch_norms(torch::nn::Module& m) {
  std::int64_t n = 0;
  for (const auto& child : m.modules(/*include_self=*/false))
    n += child->as<torch::nn::BatchNorm1d>() || child->as<torch::nn::BatchNorm2d>() ? 1 : 0;
  return n;
}

double max_named_error(const torch::OrderedDict<std::string, torch::Tensor>& got,
                       const torch::OrderedDict<std::string, torch::Tensor>& want) {
  double worst = got.size() == want.size() ? 0 : INFINITY;
  for (const auto& item : got) {
    const auto* w = want.find(item.key());
    worst = std::max(worst, w == nullptr ? INFINITY : max_error(item.value(), *w));
  }
  return worst;
}

}  // namespace

TEST_CASE("convert_sync_batchnorm keeps parameters, buffers and options, and trains as one "
          "process with the whole batch") {
  dtrain::init();
  auto model = make_tiny_resnet();
  auto ref = make_tiny_resnet();
  model->blocks[1]->as<Block>()->body[4]->eval();  // a training flag that must survive
  const auto params_before = model->named_parameters();
  const auto buffers_before = model->named_buffers();
  // Built before the conversion: the new modules must own the very tensors it updates.
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));

  CHECK(dtrain::convert_sync_batchnorm(model, {.name_prefix = "tiny"}) == 6);
  CHECK(count_batch_norms(*model) == 0);
  auto params = model->named_parameters();
  auto buffers = model->named_buffers();
  CHECK(params.keys() == params_before.keys());
  CHECK(buffers.keys() == buffers_before.keys());
  auto same_tensor = [](const torch::OrderedDict<std::string, torch::Tensor>& before,
                        const std::string& key, const torch::Tensor& now) {
    const auto* old = before.find(key);
    return old != nullptr && old->unsafeGetTensorImpl() == now.unsafeGetTensorImpl();
  };
  for (const auto& item : params) CHECK(same_tensor(params_before, item.key(), item.value()));
  for (const auto& item : buffers) CHECK(same_tensor(buffers_before, item.key(), item.value()));
  auto* converted = model->blocks[1]->as<Block>()->body[4]->as<dtrain::SyncBatchNorm>();
  CHECK(converted != nullptr);
  if (converted != nullptr) {
    CHECK(converted->options.momentum() == 0.2);
    CHECK(converted->options.eps() == 1e-3);
    CHECK(converted->options.name() == "tiny.blocks.1.body.4");
    CHECK_FALSE(converted->is_training());
  }
  model->blocks[1]->as<Block>()->body[4]->train();

  // Eval: the running statistics, exactly as before.
  torch::manual_seed(31);
  const auto probe = torch::randn({2, 3, 6, 6}, torch::kDouble);
  model->eval();
  ref->eval();
  CHECK(torch::equal(model->forward(probe), ref->forward(probe)));
  model->train();
  ref->train();

  // Training: each rank its rows of the global batch; the reference, libtorch's BatchNorm over
  // all of them.
  dtrain::DistributedOptimizer dist(sgd, model->named_parameters());
  torch::optim::SGD ref_sgd(ref->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  const std::int64_t per_rank = 2, total = per_rank * world_size();
  for (int step = 0; step < 3; ++step) {
    torch::manual_seed(40 + step);
    const auto x = torch::randn({total, 3, 6, 6}, torch::kDouble);
    const auto target = torch::randn({total, 2}, torch::kDouble);
    dist.zero_grad();
    const auto mine = world_rank() * per_rank;
    torch::mse_loss(model->forward(x.narrow(0, mine, per_rank)), target.narrow(0, mine, per_rank))
        .backward();
    CHECK(dist.step());
    ref_sgd.zero_grad();
    torch::mse_loss(ref->forward(x), target).backward();
    ref_sgd.step();
  }
  const double param_error = max_named_error(model->named_parameters(), ref->named_parameters());
  const double buffer_error = max_named_error(model->named_buffers(), ref->named_buffers());
  CHECK_MESSAGE(param_error <= 1e-9, fmt::format("parameters: error {:.3e}", param_error));
  CHECK_MESSAGE(buffer_error <= 1e-9, fmt::format("buffers: error {:.3e}", buffer_error));
  for (const auto& item : model->named_buffers()) CHECK(same_on_all_ranks(item.value()));
}

namespace {

// A norm held by a typed member that forward calls: the registry can be rewritten, the member
// cannot.
struct TypedMemberImpl : torch::nn::Module {
  TypedMemberImpl()
      : features(register_module("features", torch::nn::Sequential(torch::nn::BatchNorm2d(2)))),
        bn(register_module("bn", torch::nn::BatchNorm2d(2))) {}
  torch::Tensor forward(const torch::Tensor& x) { return bn(features->forward(x)); }
  torch::nn::Sequential features;
  torch::nn::BatchNorm2d bn;
};
TORCH_MODULE(TypedMember);

}  // namespace

TEST_CASE("convert_sync_batchnorm: containers are rewritten; a norm it cannot redirect is "
          "refused and nothing is replaced") {
  using dtrain::InvalidArgumentError;

  SUBCASE("ModuleList and ModuleDict entries") {
    torch::nn::ModuleList list(torch::nn::BatchNorm1d(2), torch::nn::Linear(2, 2));
    using Named = std::pair<std::string, std::shared_ptr<torch::nn::Module>>;
    torch::nn::ModuleDict dict(std::vector<Named>{{"norm", torch::nn::BatchNorm3d(2).ptr()}});
    torch::nn::Module outer;
    outer.register_module("list", list);
    outer.register_module("dict", dict);
    CHECK(dtrain::convert_sync_batchnorm(outer) == 2);
    CHECK(list[0]->as<dtrain::SyncBatchNorm>() != nullptr);
    CHECK(list->named_children()["0"].get() == list[0].get());
    CHECK(dict["norm"]->as<dtrain::SyncBatchNorm>() != nullptr);
    CHECK(dict->named_children()["norm"].get() == dict["norm"].get());
    const auto* norm = dict["norm"]->as<dtrain::SyncBatchNorm>();
    CHECK((norm != nullptr && norm->options.name() == "sync_batch_norm.dict.norm"));
  }
  SUBCASE("a typed member") {
    TypedMember model;
    CHECK_THROWS_WITH_AS(dtrain::convert_sync_batchnorm(model),
                         doctest::Contains("BatchNorm module 'bn' (1 more reference) is "
                                           "referenced from outside the module tree"),
                         InvalidArgumentError);
    // The error gives the one-line fix, for the dimension of the norm it names.
    CHECK_THROWS_WITH_AS(dtrain::convert_sync_batchnorm(model),
                         doctest::Contains("The fix: in the model, write "
                                           "dtrain::SyncBatchNorm2d where it says "
                                           "torch::nn::BatchNorm2d (the member's type and its "
                                           "construction"),
                         InvalidArgumentError);
    CHECK(model->features[0]->as<torch::nn::BatchNorm2d>() != nullptr);  // untouched
    CHECK(model->named_children()["bn"]->as<torch::nn::BatchNorm2d>() != nullptr);
  }
  SUBCASE("a handle the caller still holds, then released") {
    torch::nn::BatchNorm2d norm(2);
    torch::nn::Sequential seq(norm);
    CHECK_THROWS_WITH_AS(dtrain::convert_sync_batchnorm(seq), doctest::Contains("'0'"),
                         InvalidArgumentError);
    norm = nullptr;
    CHECK(dtrain::convert_sync_batchnorm(seq) == 1);
    CHECK(seq[0]->as<dtrain::SyncBatchNorm>() != nullptr);
  }
  SUBCASE("the module itself") {
    torch::nn::BatchNorm2d norm(2);
    CHECK_THROWS_WITH_AS(dtrain::convert_sync_batchnorm(norm),
                         doctest::Contains("the module itself is a BatchNorm"),
                         InvalidArgumentError);
  }
}

namespace {

// The shape convert_sync_batchnorm refuses, written once for either norm: a member that forward()
// calls. With Norm = dtrain::SyncBatchNorm2d it is the user's fix (one type changed where the
// member is declared and where it is constructed); with torch::nn::BatchNorm2d, the reference.
template <class Norm>
struct MemberNormImpl : torch::nn::Module {
  MemberNormImpl()
      : conv(register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(kChannels,
                                                                                kChannels, 3)
                                                           .padding(1)
                                                           .bias(false)))),
        bn(register_module(
            "bn", Norm(torch::nn::BatchNorm2dOptions(kChannels).momentum(0.2).eps(1e-3)))) {}
  torch::Tensor forward(const torch::Tensor& x) { return bn(conv(x)); }
  torch::nn::Conv2d conv;
  Norm bn;
};

template <class Norm>
std::shared_ptr<MemberNormImpl<Norm>> make_member_norm() {
  torch::manual_seed(6);  // the same convolution on every rank and for the reference
  auto model = std::make_shared<MemberNormImpl<Norm>>();
  model->to(torch::kDouble);
  return model;
}

}  // namespace

TEST_CASE("SyncBatchNorm2d stands where a model declares torch::nn::BatchNorm2d: its options, "
          "names, and training as one process with the whole batch") {
  dtrain::init();
  auto model = make_member_norm<dtrain::SyncBatchNorm2d>();
  auto ref = make_member_norm<torch::nn::BatchNorm2d>();
  CHECK(model->bn->as<dtrain::SyncBatchNorm>() != nullptr);
  CHECK(model->bn->options.num_features() == kChannels);
  CHECK(model->bn->options.momentum() == 0.2);
  CHECK(model->bn->options.eps() == 1e-3);
  CHECK(model->bn->options.affine());
  CHECK(model->bn->options.track_running_stats());
  // libtorch's names: a BatchNorm2d model's state loads into this one.
  CHECK(model->named_parameters().keys() == ref->named_parameters().keys());
  CHECK(model->named_buffers().keys() == ref->named_buffers().keys());
  // Nothing left to convert, and nothing refused.
  CHECK(dtrain::convert_sync_batchnorm(*model) == 0);
  // The other dimensions and a plain number of features construct the same way.
  CHECK(dtrain::SyncBatchNorm1d(torch::nn::BatchNorm1dOptions(4))->options.num_features() == 4);
  CHECK(dtrain::SyncBatchNorm3d(5)->options.num_features() == 5);
  const dtrain::SyncBatchNorm2d unset{nullptr};
  CHECK(unset.is_empty());

  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  dtrain::DistributedOptimizer dist(sgd, model->named_parameters());
  torch::optim::SGD ref_sgd(ref->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  const std::int64_t per_rank = 2, total = per_rank * world_size();
  for (int step = 0; step < 3; ++step) {
    torch::manual_seed(60 + step);
    const auto x = torch::randn({total, kChannels, 5, 5}, torch::kDouble);
    const auto target = torch::randn({total, kChannels, 5, 5}, torch::kDouble);
    dist.zero_grad();
    const auto mine = world_rank() * per_rank;
    torch::mse_loss(model->forward(x.narrow(0, mine, per_rank)), target.narrow(0, mine, per_rank))
        .backward();
    CHECK(dist.step());
    ref_sgd.zero_grad();
    torch::mse_loss(ref->forward(x), target).backward();
    ref_sgd.step();
  }
  // Unsynchronized, each rank's statistics would come from its own two rows: far from these.
  const double param_error = max_named_error(model->named_parameters(), ref->named_parameters());
  const double buffer_error = max_named_error(model->named_buffers(), ref->named_buffers());
  CHECK_MESSAGE(param_error <= 1e-9, fmt::format("parameters: error {:.3e}", param_error));
  CHECK_MESSAGE(buffer_error <= 1e-9, fmt::format("buffers: error {:.3e}", buffer_error));
  for (const auto& item : model->named_buffers()) CHECK(same_on_all_ranks(item.value()));
}
