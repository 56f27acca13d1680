// The program the `torch` component's packaging test builds: <dtrain/torch.hpp> with a libtorch
// found by the package config, linked through dtrain::torch. fmt::format is called here on purpose:
// libtorch's include directory holds its own {fmt} headers, and a program that compiled against
// them while linking dtrain's fmt library would not link (Note [libtorch and {fmt}]).
#include <dtrain/torch.hpp>
#include <fmt/format.h>

#include <cstdlib>
#include <iostream>

int main(int argc, char** argv) {
  dtrain::Session session(argc, argv);
  auto t = torch::full({3}, static_cast<float>(dtrain::rank() + 1));
  dtrain::allreduce(t, dtrain::AllreduceOptions{.op = dtrain::ReduceOp::Sum});
  const int size = dtrain::size();
  const float expected = static_cast<float>(size * (size + 1) / 2);
  std::cout << fmt::format("rank {}/{}: libtorch allreduce sum {} (expected {}), fmt {}\n",
                           dtrain::rank(), size, t[0].item<float>(), expected, FMT_VERSION);
  if (!torch::all(t == expected).item<bool>()) return 1;
  if (argc > 1 && std::atoi(argv[1]) != size) return 1;
  return 0;
}
