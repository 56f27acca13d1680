// The libtorch baseline of benchmarks/compile_time.sh: a file with only <torch/torch.h>.
#include <torch/torch.h>

int main() {
  auto t = torch::ones({10});
  return t.sum().item<float>() == 10.0f ? 0 : 1;
}
