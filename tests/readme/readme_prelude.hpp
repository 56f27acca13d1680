#pragma once
// What the README's example leaves to the user's program: a model, a dataset size and a number of
// epochs, batches of a dataset, and a loss. A small regression problem, so the example trains for
// real on every rank.
#include <torch/torch.h>

#include <cstdint>
#include <memory>
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

// Batches of 8 samples of y = x . (1, 2, 3, 4), taken by index.
inline std::vector<readme::Batch> batches(const std::vector<std::int64_t>& indices) {
  const auto weights = torch::tensor({1.0f, 2.0f, 3.0f, 4.0f});
  std::vector<readme::Batch> out;
  for (std::size_t at = 0; at < indices.size(); at += 8) {
    std::vector<torch::Tensor> rows;
    for (std::size_t i = at; i < std::min(indices.size(), at + 8); ++i)
      rows.push_back(torch::arange(4, torch::kFloat32) * 0.1f * static_cast<float>(indices[i] % 7));
    auto x = torch::stack(rows);
    out.push_back({x, x.matmul(weights).unsqueeze(1)});
  }
  return out;
}

inline torch::Tensor loss_of(const std::shared_ptr<readme::ModelImpl>& model,
                             const readme::Batch& batch) {
  return torch::mse_loss(model->forward(batch.inputs), batch.targets);
}
