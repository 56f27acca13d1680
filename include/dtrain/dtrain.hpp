#pragma once
// dtrain: data-parallel distributed training for C++.
// The umbrella header: lifecycle, topology, tensors, collectives, training utilities, samplers,
// the profiler.
// Opt-in extras: <dtrain/torch.hpp> (libtorch tensors and optimizers), <dtrain/cuda.hpp>
// (CUDA/NCCL device path; link dtrain::cuda).
#include "dtrain/runtime/collectives.hpp"
#include "dtrain/runtime/grouped_collectives.hpp"
#include "dtrain/runtime/process_set.hpp"
#include "dtrain/core/config.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/logging.hpp"
#include "dtrain/core/version.hpp"
#include "dtrain/data/distributed_sampler.hpp"
#include "dtrain/data/file_sharder.hpp"
#include "dtrain/data/sampler_state.hpp"
#include "dtrain/data/split_sorted_bucket_sampler.hpp"
#include "dtrain/profile/profiler.hpp"
#include "dtrain/runtime/session.hpp"
#include "dtrain/tensor/traits.hpp"
#include "dtrain/tensor/view.hpp"
#include "dtrain/train/broadcast_parameters.hpp"
#include "dtrain/train/checkpoint.hpp"
#include "dtrain/train/distributed_optimizer.hpp"
#include "dtrain/train/elastic.hpp"
#include "dtrain/train/gradient_buffer.hpp"
#include "dtrain/train/gradient_hook.hpp"
#include "dtrain/train/lr_schedule.hpp"
#include "dtrain/train/metrics.hpp"
#include "dtrain/train/objects.hpp"
#include "dtrain/train/powersgd.hpp"
