// The training API from a third file of the consumer (consumer.cpp): the same engine serves it.
#include <dtrain/dtrain.hpp>

#include <vector>

#include "consumer_parts.hpp"

bool consumer_sampler_ok() {
  dtrain::DistributedSampler sampler(100, {.parts = dtrain::size(), .part = dtrain::rank()});
  sampler.set_epoch(1);
  std::vector<double> count{double(sampler.indices().size())};
  dtrain::allreduce(count, {.op = dtrain::ReduceOp::Sum, .name = "consumer.samples"});
  return count[0] >= 100 && dtrain::engine_stats().collectives >= 2;
}
