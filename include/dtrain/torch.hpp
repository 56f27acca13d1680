#pragma once
// libtorch integration: torch::Tensor as a dtrain tensor, DistributedOptimizer over
// torch::optim optimizers with gradient hooks, broadcast of module parameters/buffers and
// optimizer state.
#include "dtrain/dtrain.hpp"
#include "dtrain/torch/optimizer.hpp"
#include "dtrain/torch/tensor.hpp"
