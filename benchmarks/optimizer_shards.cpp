// Sharded optimizer state (and gradients) against unsharded, one configuration per run (the script
// benchmarks/optimizer_shards.sh runs both side by side): Adam over a ResNet of the example's
// model zoo, random images, the same steps; prints one JSON line from rank 0 with the mean step
// time (the slowest rank's), the optimizer state bytes per rank (the largest rank's, counting
// every state tensor), the peak resident memory per rank (the largest rank's) and the peak of the
// heap bytes in use during the timed steps (sampled every millisecond from mallinfo2: what the
// program holds, where resident memory also keeps what the allocator has freed but not returned).
//
//   mpiexec -n 4 bench_optimizer_shards --model resnet50 --shard optimizer
#include <malloc.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "dtrain/torch.hpp"
#include "models.hpp"

namespace {

std::int64_t state_bytes(torch::optim::Optimizer& optimizer) {
  std::int64_t n = 0;
  for (auto& [key, state] : optimizer.state()) {
    if (auto* adam = dynamic_cast<torch::optim::AdamParamState*>(state.get())) {
      for (const auto* t : {&adam->exp_avg(), &adam->exp_avg_sq(), &adam->max_exp_avg_sq()})
        if (t->defined()) n += static_cast<std::int64_t>(t->nbytes());
    }
  }
  return n;
}

std::int64_t peak_resident_bytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<std::int64_t>(usage.ru_maxrss) * 1024;  // Linux reports KiB
}

// The most heap bytes in use while it runs (mallinfo2: chunks handed out, mapped ones included).
class HeapPeak {
 public:
  HeapPeak()
      : sampler_([this] {
          while (!stop_.load()) {
            const auto info = mallinfo2();
            peak_ = std::max<std::size_t>(peak_, info.uordblks + info.hblkhd);
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
          }
        }) {}
  std::size_t stop() {
    stop_ = true;
    sampler_.join();
    return peak_;
  }

 private:
  std::atomic<bool> stop_{false};
  std::size_t peak_ = 0;
  std::thread sampler_;
};

double max_over_ranks(double v, const char* name) {
  std::vector<double> one{v};
  dtrain::allreduce(one, {.op = dtrain::ReduceOp::Max, .name = name});
  return one[0];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("sharded against unsharded optimizer state: step time and memory per rank");
  std::string model_name = "resnet50", shard = "none";
  std::int64_t steps = 8, warmup = 2, batch = 4, image = 32, threads = 1;
  app.add_option("--model", model_name, "a model of the ResNet example");
  app.add_option("--shard", shard, "none, optimizer or gradients")
      ->check(CLI::IsMember({"none", "optimizer", "gradients"}));
  app.add_option("--steps", steps, "timed steps")->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup, "untimed steps first")->check(CLI::NonNegativeNumber);
  app.add_option("--batch-size", batch, "images per rank and step")->check(CLI::PositiveNumber);
  app.add_option("--image-size", image, "side of the square images")->check(CLI::PositiveNumber);
  app.add_option("--threads", threads, "intra-op threads per rank")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);

  dtrain::init();
  torch::set_num_threads(static_cast<int>(threads));
  torch::manual_seed(1);
  auto model = resnet::make_model(model_name, {.in_channels = 3, .num_classes = 10,
                                               .norm = resnet::Norm::group});
  std::int64_t parameter_bytes = 0;
  for (const auto& p : model->parameters())
    parameter_bytes += static_cast<std::int64_t>(p.nbytes());
  torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(1e-3));
  dtrain::DistributedOptimizer optimizer(
      adam, model->named_parameters(),
      dtrain::DistributedOptimizerOptions{
          .shard = shard == "optimizer"   ? dtrain::Shard::optimizer_state
                   : shard == "gradients" ? dtrain::Shard::gradients
                                          : dtrain::Shard::none});

  torch::manual_seed(100 + dtrain::rank());
  const auto images = torch::randn({batch, 3, image, image});
  const auto labels = torch::randint(0, 10, {batch});
  double seconds = 0;
  std::optional<HeapPeak> heap;
  for (std::int64_t s = 0; s < warmup + steps; ++s) {
    dtrain::barrier();
    if (s == warmup) heap.emplace();
    const auto start = std::chrono::steady_clock::now();
    optimizer.zero_grad();
    torch::nn::functional::cross_entropy(model->forward(images), labels).backward();
    optimizer.step();
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    if (s >= warmup) seconds += took.count();
  }
  const double heap_peak = max_over_ranks(static_cast<double>(heap->stop()), "bench.heap");
  const double step_s = max_over_ranks(seconds / static_cast<double>(steps), "bench.step");
  const double state = max_over_ranks(static_cast<double>(state_bytes(adam)), "bench.state");
  const double rss = max_over_ranks(static_cast<double>(peak_resident_bytes()), "bench.rss");
  if (dtrain::rank() == 0)
    fmt::print(
        "{{\"model\": \"{}\", \"ranks\": {}, \"shard\": \"{}\", \"batch_size\": {}, "
        "\"image_size\": {}, \"steps\": {}, \"step_s\": {:.5f}, \"parameter_bytes\": {}, "
        "\"state_bytes_per_rank\": {:.0f}, \"peak_rss_bytes_per_rank\": {:.0f}, "
        "\"peak_heap_bytes_per_rank\": {:.0f}}}\n",
        model_name, dtrain::size(), shard, batch, image, steps, step_s, parameter_bytes, state,
        rss, heap_peak);
  std::fflush(stdout);
  dtrain::shutdown();
  return 0;
}
