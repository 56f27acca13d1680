#pragma once
// How a sampler orders an epoch: DistributedSampler and SplitSortedBucketSampler take the same
// options. Every rank must pass the same ones (Note [Equal steps on every rank] in
// distributed_sampler.hpp).
#include <cstdint>

namespace dtrain {

struct SamplerOptions {
  bool shuffle = true;     // a new order every epoch, drawn from (seed, epoch)
  std::uint64_t seed = 0;  // the same on every rank
  bool drop_last = false;  // cut the epoch to whole shares instead of padding it by wrapping
};

}  // namespace dtrain
