#pragma once
// libtorch integration: torch::Tensor as a dtrain tensor, DistributedOptimizer over
// torch::optim optimizers with gradient hooks, broadcast of module parameters/buffers and
// optimizer state; gradients as views into fusion memory (GradientViews); tensors, modules,
// optimizers and generators as checkpoint items; SyncBatchNorm and convert_sync_batchnorm.
#include "dtrain/dtrain.hpp"
#include "dtrain/torch/broadcast_state.hpp"
#include "dtrain/torch/convert_sync_batchnorm.hpp"
#include "dtrain/torch/gradient_views.hpp"
#include "dtrain/torch/optimizer.hpp"
#include "dtrain/torch/serialize.hpp"
#include "dtrain/torch/sync_batch_norm.hpp"
#include "dtrain/torch/tensor.hpp"
