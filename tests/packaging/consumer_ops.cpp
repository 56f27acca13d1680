// Collectives from a second file of the consumer (consumer.cpp).
#include <dtrain/dtrain.hpp>

#include <iostream>
#include <vector>

#include "consumer_parts.hpp"

bool consumer_allreduce_sum_ok() {
  const int size = dtrain::size();
  std::vector<float> v{float(dtrain::rank() + 1)};
  dtrain::allreduce(v, dtrain::AllreduceOptions{.op = dtrain::ReduceOp::Sum});
  const float expected = float(size * (size + 1) / 2);
  std::cout << "rank " << dtrain::rank() << ": allreduce sum " << v[0] << " (expected "
            << expected << ")" << std::endl;
  return v[0] == expected;
}

bool consumer_allgather_ok() {
  std::vector<int> mine(static_cast<std::size_t>(dtrain::rank() + 1), dtrain::rank());
  const std::vector<int> all = dtrain::allgather(mine);
  std::size_t at = 0;
  for (int r = 0; r < dtrain::size(); ++r)
    for (int i = 0; i <= r; ++i)
      if (at >= all.size() || all[at++] != r) return false;
  return at == all.size();
}
