// A training job with no line of profiling code, for tests/profile/run_zero_code.py: a
// DistributedOptimizer over a toy model, each step a little work, and one rank slowed on purpose
// (it sleeps in every step). Or, with --no-optimizer, a job that only runs collectives now and
// then: no optimizer, so no steps. Run under DTRAIN_PROFILE, it is profiled all the same
// (Note [Zero-code profiling]).
//
//   zero_code_job [--updates N] [--slow-rank R] [--slow-ms MS] [--no-optimizer]
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string_view>
#include <thread>
#include <vector>

#include "dtrain/dtrain.hpp"

namespace {

struct ToySgd {
  std::vector<float> weights = std::vector<float>(4096, 0.0f);
  std::vector<float> grads = std::vector<float>(4096, 0.0f);
  void step() {
    for (std::size_t i = 0; i < weights.size(); ++i) weights[i] -= 0.01f * grads[i];
  }
  std::vector<std::span<float>> gradients() { return {grads}; }
};

void busy_for(std::chrono::microseconds d) {
  const auto end = std::chrono::steady_clock::now() + d;
  volatile double x = 0;
  while (std::chrono::steady_clock::now() < end) x = x + 1;
}

int number(std::string_view flag, std::string_view text) {
  int v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size()) {
    std::fprintf(stderr, "zero_code_job: %.*s expects an integer\n", static_cast<int>(flag.size()),
                 flag.data());
    std::exit(2);
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  int updates = 50, slow_rank = -1, slow_ms = 20;
  bool optimizer = true;
  for (int i = 1; i < argc; ++i) {
    const std::string_view flag = argv[i];
    if (flag == "--no-optimizer") optimizer = false;
    else if (i + 1 < argc && flag == "--updates") updates = number(flag, argv[++i]);
    else if (i + 1 < argc && flag == "--slow-rank") slow_rank = number(flag, argv[++i]);
    else if (i + 1 < argc && flag == "--slow-ms") slow_ms = number(flag, argv[++i]);
    else {
      std::fprintf(stderr, "usage: zero_code_job [--updates N] [--slow-rank R] [--slow-ms MS] "
                           "[--no-optimizer]\n");
      return 2;
    }
  }
  dtrain::Session session(argc, argv);
  if (!optimizer) {  // collectives now and then, for about a second: no step anywhere
    std::vector<float> v(4096, 1.0f);
    for (int i = 0; i < 10; ++i) {
      dtrain::allreduce(v);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return 0;
  }
  ToySgd sgd;
  dtrain::DistributedOptimizer<ToySgd> distributed(sgd);
  for (int u = 0; u < updates; ++u) {
    busy_for(std::chrono::microseconds(500));  // forward and backward
    std::fill(sgd.grads.begin(), sgd.grads.end(), 1.0f);
    if (dtrain::rank() == slow_rank)  // the straggler
      std::this_thread::sleep_for(std::chrono::milliseconds(slow_ms));
    distributed.step();
  }
  return 0;
}
