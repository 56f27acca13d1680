#pragma once
// What the README's example leaves to the user's program: a model, a dataset size and a number of
// epochs, batches of a dataset, and a loss. A small regression problem, so the example trains for
// real on every rank.
//
// The snippet itself checks nothing, so the prelude checks what it promises: at the first loss
// (after broadcast_module) and at the last one (after every step but the last), the weights are
// the same on every rank, and the loss over the whole dataset at the last one is under a quarter
// of the first. Both verdicts are agreed over the ranks with collectives, so every rank reaches
// the same one; a failed or missing check makes every rank exit 1 once the program has ended.
#include <torch/torch.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <dtrain/torch.hpp>

namespace readme {

struct ModelImpl : torch::nn::Module {
  ModelImpl() : fc(register_module("fc", torch::nn::Linear(4, 1))) {}
  torch::Tensor forward(const torch::Tensor& x) { return fc->forward(x); }
  torch::nn::Linear fc;
};

struct Batch {
  torch::Tensor inputs, targets;
};

}  // namespace readme

inline constexpr std::int64_t dataset_size = 96;
inline constexpr int epochs = 2;

// Different weights on every rank: broadcast_module must make them equal.
inline std::shared_ptr<readme::ModelImpl> make_model() {
  torch::manual_seed(7 + dtrain::rank());
  return std::make_shared<readme::ModelImpl>();
}

namespace readme {

// Batches of 8 samples of y = x . (1, 2, 3, 4), taken by index.
inline std::vector<Batch> make_batches(const std::vector<std::int64_t>& indices) {
  const auto weights = torch::tensor({1.0f, 2.0f, 3.0f, 4.0f});
  std::vector<Batch> out;
  for (std::size_t at = 0; at < indices.size(); at += 8) {
    std::vector<torch::Tensor> rows;
    for (std::size_t i = at; i < std::min(indices.size(), at + 8); ++i)
      rows.push_back(torch::arange(4, torch::kFloat32) * 0.1f * static_cast<float>(indices[i] % 7));
    auto x = torch::stack(rows);
    out.push_back({x, x.matmul(weights).unsqueeze(1)});
  }
  return out;
}

// Where the program is, counted from the calls it makes, and what the checks found.
struct Checks {
  int epochs_begun = 0;
  std::int64_t batches_this_epoch = 0;
  std::int64_t losses_this_epoch = 0;
  double first_loss = -1;
  bool failed = false;
  bool finished = false;

  // At exit, after the program (and dtrain) ended normally: a verdict the exit status carries.
  ~Checks() {
    if (!finished) {
      std::fprintf(stderr, "readme_program: FAILED: the checks of the last step never ran\n");
      failed = true;
    }
    if (failed) std::_Exit(1);
  }

  void fail(const std::string& what) {
    failed = true;
    std::fprintf(stderr, "readme_program: rank %d: FAILED: %s\n", dtrain::rank(), what.c_str());
  }

  // Every rank's weights and the loss over the whole dataset, the same on every rank or not.
  void check(const std::shared_ptr<ModelImpl>& model, const std::string& tag,
             const char* when) {
    torch::NoGradGuard no_grad;
    std::vector<torch::Tensor> flat;
    for (const auto& p : model->parameters()) flat.push_back(p.detach().flatten());
    auto high = torch::cat(flat);
    auto low = high.clone();
    dtrain::allreduce(high, {.op = dtrain::ReduceOp::Max, .name = "readme.high." + tag});
    dtrain::allreduce(low, {.op = dtrain::ReduceOp::Min, .name = "readme.low." + tag});
    if (!torch::equal(high, low)) fail(std::string("the weights differ across ranks ") + when);

    std::vector<std::int64_t> all(dataset_size);
    for (std::int64_t i = 0; i < dataset_size; ++i) all[static_cast<std::size_t>(i)] = i;
    double sum = 0;
    std::int64_t count = 0;
    for (const Batch& b : make_batches(all)) {
      sum += torch::mse_loss(model->forward(b.inputs), b.targets, torch::Reduction::Sum)
                 .item<double>();
      count += b.targets.size(0);
    }
    auto loss = torch::tensor({sum / static_cast<double>(count)}, torch::kFloat64);
    dtrain::allreduce(loss, {.op = dtrain::ReduceOp::Average, .name = "readme.loss." + tag});
    const double mean = loss.item<double>();
    if (dtrain::rank() == 0) std::printf("readme_program: dataset loss %s: %.6f\n", when, mean);
    if (first_loss < 0) {
      first_loss = mean;
    } else if (!(mean < first_loss / 4)) {
      fail("the loss over the dataset did not fall to a quarter: " + std::to_string(first_loss) +
           " -> " + std::to_string(mean));
    }
  }
};

inline Checks checks;

}  // namespace readme

// The dataset's batches for this epoch: the program asks once per epoch.
inline std::vector<readme::Batch> batches(const std::vector<std::int64_t>& indices) {
  readme::Checks& c = readme::checks;
  ++c.epochs_begun;
  c.losses_this_epoch = 0;
  std::vector<readme::Batch> out = readme::make_batches(indices);
  c.batches_this_epoch = static_cast<std::int64_t>(out.size());
  return out;
}

inline torch::Tensor loss_of(const std::shared_ptr<readme::ModelImpl>& model,
                             const readme::Batch& batch) {
  readme::Checks& c = readme::checks;
  ++c.losses_this_epoch;
  if (c.epochs_begun == 1 && c.losses_this_epoch == 1)
    c.check(model, "first", "after broadcast_module");
  if (c.epochs_begun == epochs && c.losses_this_epoch == c.batches_this_epoch) {
    c.check(model, "last", "at the last step");
    c.finished = true;
  }
  return torch::mse_loss(model->forward(batch.inputs), batch.targets);
}
