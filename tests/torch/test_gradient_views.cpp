// GradientViews: libtorch gradients as views into fusion memory (include/dtrain/torch/
// gradient_views.hpp). Training with the views gives bitwise the parameters training without them
// gives, and the fused syncs of the views allocate no fusion buffer (they pack nothing).
#include <cstdint>
#include <string>
#include <vector>

#include "dtrain/torch.hpp"
#include "train/train_test_util.hpp"

namespace {

using namespace train_test;
using dtrain::DistributedOptimizer;
using dtrain::GradientLayout;
using dtrain::GradientViews;

// Layers without biases: each backward node accumulates one gradient, so the hooks fire in
// exactly the reverse of the parameters' order, the order the views are laid out in.
torch::nn::Sequential make_chain() {
  torch::manual_seed(99);  // the same weights on every rank
  return torch::nn::Sequential(torch::nn::Linear(torch::nn::LinearOptions(6, 16).bias(false)),
                               torch::nn::Tanh(),
                               torch::nn::Linear(torch::nn::LinearOptions(16, 12).bias(false)),
                               torch::nn::Tanh(),
                               torch::nn::Linear(torch::nn::LinearOptions(12, 3).bias(false)));
}

// A rank's own data: the gradients differ across ranks, so the allreduce matters.
std::vector<torch::Tensor> batches(int steps) {
  torch::manual_seed(500 + world_rank());
  std::vector<torch::Tensor> out;
  for (int i = 0; i < steps; ++i) out.push_back(torch::randn({5, 6}));
  return out;
}

void train_step(torch::nn::Sequential& net, const torch::Tensor& x) {
  net->forward(x).pow(2).mean().backward();
}

bool same_parameters(torch::nn::Sequential& a, torch::nn::Sequential& b) {
  auto pa = a->parameters(), pb = b->parameters();
  for (std::size_t i = 0; i < pa.size(); ++i)
    if (!torch::equal(pa[i], pb[i])) return false;
  return pa.size() == pb.size();
}

TEST_CASE("GradientViews: each gradient is a view into one buffer, in backward order") {
  dtrain::init();
  auto net = make_chain();
  auto params = net->parameters();
  GradientViews views(params, GradientLayout::in_order);
  CHECK(views.size() == 3);
  CHECK(views.buffers() == 1);
  CHECK(views.attached() == 3);
  std::int64_t bytes = 0;
  for (const auto& p : params) bytes += p.numel() * 4;
  CHECK(views.total_bytes() == bytes);
  // Backward order: the last layer's gradient first, the first layer's last.
  const auto* base = static_cast<const char*>(params[2].grad().data_ptr());
  CHECK(static_cast<const char*>(params[1].grad().data_ptr()) == base + params[2].numel() * 4);
  CHECK(static_cast<const char*>(params[0].grad().data_ptr()) ==
        base + (params[2].numel() + params[1].numel()) * 4);
  for (const auto& p : params) CHECK(p.grad().abs().sum().item<float>() == 0.0f);

  // The optimizer's zero_grad() clears gradients (libtorch's default); zero_grad() here puts the
  // views back and zeroes them.
  torch::optim::SGD sgd(params, 0.1);
  train_step(net, torch::ones({2, 6}));
  CHECK(views.attached() == 3);  // backward accumulated into the views
  CHECK(params[0].grad().abs().sum().item<float>() > 0.0f);
  sgd.zero_grad();
  CHECK(views.attached() == 0);
  views.zero_grad();
  CHECK(views.attached() == 3);
  for (const auto& p : params) CHECK(p.grad().abs().sum().item<float>() == 0.0f);
  CHECK(static_cast<const char*>(params[2].grad().data_ptr()) == base);
}

TEST_CASE("GradientViews: a gradient outlives the views object") {
  auto net = make_chain();
  auto params = net->parameters();
  {
    GradientViews views(params, GradientLayout::in_order);
  }
  params[0].mutable_grad().fill_(2.0f);
  CHECK(params[0].grad().sum().item<float>() == 2.0f * params[0].numel());
}

TEST_CASE("GradientViews: parameters it cannot view are refused by name") {
  auto transposed = torch::randn({4, 3}).t().set_requires_grad(true);
  CHECK_THROWS_WITH_AS(GradientViews({transposed}, GradientLayout::in_order),
                       doctest::Contains("parameter #0 (shape [3, 4], Float) is not contiguous"),
                       dtrain::InvalidArgumentError);
  auto complex = torch::randn({3}, torch::kComplexFloat).set_requires_grad(true);
  CHECK_THROWS_WITH_AS(GradientViews({torch::randn({2}).set_requires_grad(true), complex},
                                     GradientLayout::in_order),
                       doctest::Contains("is not supported"), dtrain::InvalidArgumentError);
  // Parameters without gradients are left alone; two dtypes make two buffers.
  auto frozen = torch::randn({5});
  auto wide = torch::randn({7}, torch::kDouble).set_requires_grad(true);
  GradientViews views({frozen, torch::randn({2}).set_requires_grad(true), wide},
                      GradientLayout::in_order);
  CHECK(views.size() == 2);
  CHECK(views.buffers() == 2);
  CHECK_FALSE(frozen.grad().defined());
}

TEST_CASE("GradientViews: the same training, bitwise, and fused syncs that pack nothing") {
  // A fresh runtime, so that no fusion buffer exists yet.
  dtrain::shutdown();
  dtrain::init();
  constexpr int kSteps = 6;
  const auto data = batches(kSteps);

  auto with_views = make_chain();
  GradientViews views(with_views->parameters());
  torch::optim::SGD sgd_views(with_views->parameters(), 0.05);
  DistributedOptimizer opt_views(sgd_views, with_views->named_parameters(), {.name = "views"});
  const auto before = dtrain::engine_stats();
  for (const auto& x : data) {
    views.zero_grad();
    train_step(with_views, x);
    opt_views.step();
  }
  const auto after = dtrain::engine_stats();
  CHECK(views.attached() == 3);
  if (world_size() > 1) CHECK(after.fused_collectives > before.fused_collectives);  // 1: no MPI
  CHECK_MESSAGE(after.buffer_allocations == before.buffer_allocations,
                "fused syncs of gradient views allocated a fusion buffer: they were packed");

  auto plain = make_chain();
  torch::optim::SGD sgd_plain(plain->parameters(), 0.05);
  DistributedOptimizer opt_plain(sgd_plain, plain->named_parameters(), {.name = "plain"});
  for (const auto& x : data) {
    opt_plain.zero_grad();
    train_step(plain, x);
    opt_plain.step();
  }
  CHECK(same_parameters(with_views, plain));
  CHECK(same_on_all_ranks(with_views->parameters()[0].data_ptr(),
                          with_views->parameters()[0].numel() * 4));
}

}  // namespace
