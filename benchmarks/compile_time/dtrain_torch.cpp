// torch_only.cpp with <dtrain/torch.hpp> and one allreduce of a torch::Tensor: what dtrain adds
// to a libtorch trainer's file (benchmarks/compile_time.sh).
#include <dtrain/torch.hpp>

int main(int argc, char** argv) {
  dtrain::Session session(argc, argv);
  auto t = torch::ones({10});
  dtrain::allreduce(t);
  return t.sum().item<float>() == 10.0f ? 0 : 1;
}
