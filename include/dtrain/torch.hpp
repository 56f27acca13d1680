#pragma once
// libtorch integration: torch::Tensor as a dtrain tensor, DistributedOptimizer over
// torch::optim optimizers with gradient hooks, broadcast of module parameters/buffers and
// optimizer state; tensors, modules, optimizers and generators as checkpoint items.
#include "dtrain/dtrain.hpp"
#include "dtrain/torch/optimizer.hpp"
#include "dtrain/torch/serialize.hpp"
#include "dtrain/torch/tensor.hpp"
