// What an elastic commit costs a training step (docs/elastic.md).
//
// The state and the step are bench_checkpoint_save's: ResNet-18 or ResNet-50 weights plus SGD
// momentum (float32, 93.5 MB or 204.5 MB), and the communication half of a data-parallel step
// (one grouped_allreduce of every gradient, then the momentum update); "plain" is the plain
// trainer's state (examples/plain, 3.6 KB), where what a commit costs beyond the copy shows.
// Each round measures, interleaved:
//   step                    a step without a commit
//   step + commit()         the step that calls elastic::State::commit: serialization on each
//                           host's writer, rank 0's question to dtrainrun, the answer's allreduce
//   commit() alone          the slowest rank's time inside commit()
//   steps during the write  the steps that run while a writer thread is still busy
//   step + commit + wait    a commit written before the step returns
// and, per round, what one commit adds to the training time against that round's median step:
//   cost, background        (step + commit() - step) + sum over the steps during the write of
//                           (that step - step)
// A step's time is the slowest rank's, from a barrier. A stand-in for dtrainrun's notification
// server answers on rank 0's host (loopback: a cluster adds its network's round trip), so every
// commit asks it (and the question alone is timed on rank 0 at the end); --no-launcher leaves the
// question out. --each-rank-a-host makes every rank a host of its own (DTRAIN_HOST_ID), so every
// rank writes, as with one rank per host.
//
// Usage: mpiexec -n <ranks> bench_elastic_commit [--rounds=5] [--model=plain|resnet18|resnet50|all]
//            [--dir=/dev/shm/bench-elastic] [--each-rank-a-host] [--no-launcher]
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <dtrain/dtrain.hpp>
#include <dtrain/train/elastic_launcher.hpp>

#include "bench_common.hpp"

namespace {

struct State {
  std::vector<std::vector<float>> weights, velocity, grads;
  std::int64_t bytes = 0;  // weights + velocity
};

State make_state(const std::vector<bench::Param>& params) {
  State s;
  for (const auto& p : params) {
    const auto n = static_cast<std::size_t>(p.numel());
    s.weights.emplace_back(n, 0.01f);
    s.velocity.emplace_back(n, 0.0f);
    s.grads.emplace_back(n, 0.0f);
    s.bytes += 2 * static_cast<std::int64_t>(n * sizeof(float));
  }
  return s;
}

// The plain trainer's MLP: 2 -> 64 -> 3.
std::vector<bench::Param> plain_params() {
  return {{"fc1.weight", {64, 2}}, {"fc1.bias", {64}}, {"fc2.weight", {3, 64}}, {"fc2.bias", {3}}};
}

void step(State& s, int rank, std::int64_t k) {
  for (auto& g : s.grads) std::fill(g.begin(), g.end(), 1e-3f * static_cast<float>(rank + k % 7));
  dtrain::grouped_allreduce(s.grads, {.name = "bench.grads"});
  for (std::size_t t = 0; t < s.weights.size(); ++t)
    for (std::size_t i = 0; i < s.weights[t].size(); ++i) {
      s.velocity[t][i] = 0.9f * s.velocity[t][i] + s.grads[t][i];
      s.weights[t][i] -= 0.1f * s.velocity[t][i];
    }
}

// Answers every `GEN` line with "GEN 0 <size>": the running world may carry on.
class NotifyStandIn {
 public:
  explicit NotifyStandIn(int size) : answer_("GEN 0 " + std::to_string(size) + "\n") {
    listener_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t n = sizeof a;
    if (::bind(listener_, reinterpret_cast<sockaddr*>(&a), n) != 0 || ::listen(listener_, 16) ||
        ::getsockname(listener_, reinterpret_cast<sockaddr*>(&a), &n) != 0) {
      fmt::print(stderr, "cannot listen on 127.0.0.1\n");
      std::exit(1);
    }
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] {
      while (!stop_) {
        pollfd p{listener_, POLLIN, 0};
        if (::poll(&p, 1, 50) <= 0) continue;
        const int fd = ::accept(listener_, nullptr, nullptr);
        char c = 0;
        while (fd >= 0 && ::read(fd, &c, 1) == 1 && c != '\n') {
        }
        if (fd >= 0 && ::write(fd, answer_.data(), answer_.size()) < 0) {
        }
        if (fd >= 0) ::close(fd);
      }
    });
  }
  ~NotifyStandIn() {
    stop_ = true;
    thread_.join();
    ::close(listener_);
  }
  int port() const { return port_; }

 private:
  std::string answer_;
  int listener_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace

int main(int argc, char** argv) {
  bench::MpiProcess mpi(argc, argv);
  const bench::Args args(argc, argv);
  const int rounds = static_cast<int>(args.get_int("rounds", 5));
  const std::string which = args.get("model", "all");
  const std::filesystem::path dir = args.get("dir", "/dev/shm/bench-elastic");
  const bool each_rank_a_host = args.get("each-rank-a-host", "0") == "1";
  const bool ask = args.get("no-launcher", "0") != "1";
  const int rank = mpi.rank();
  dtrain::Config config = dtrain::Config::from_env();
  if (each_rank_a_host) config.host_id = fmt::format("bench-host-{}", rank);
  dtrain::init(config);

  std::unique_ptr<NotifyStandIn> launcher;
  if (ask) {
    if (rank == 0) launcher = std::make_unique<NotifyStandIn>(mpi.size());
    int port = launcher ? launcher->port() : 0;
    MPI_Bcast(&port, 1, MPI_INT, 0, mpi.comm());
    ::setenv("DTRAIN_ELASTIC", "1", 1);
    ::setenv("DTRAIN_ELASTIC_NOTIFY", fmt::format("127.0.0.1:{}", port).c_str(), 1);
    ::setenv("DTRAIN_ELASTIC_GENERATION", "0", 1);
  }
  if (rank == 0)
    fmt::print("{}\ncommit folder: {}/{{host}} ({} writer{}), launcher question: {}\n\n",
               bench::machine_line(mpi.size()), dir.string(),
               each_rank_a_host ? mpi.size() : 1,
               each_rank_a_host && mpi.size() > 1 ? "s" : "", ask ? "yes (loopback)" : "no");

  std::vector<std::string> models;
  for (const char* m : {"plain", "resnet18", "resnet50"})
    if (which == "all" || which == m) models.push_back(m);
  if (rank == 0)
    fmt::print("| model | state | step | step + commit() | commit() alone | steps during the "
               "write | step + commit + wait | cost, background |\n"
               "|---|---|---|---|---|---|---|---|\n");
  for (const auto& name : models) {
    State s = make_state(name == "plain"      ? plain_params()
                         : name == "resnet50" ? bench::resnet50_params()
                                              : bench::resnet18_params());
    std::filesystem::remove_all(dir / fmt::format("bench-host-{}", rank));
    if (rank == 0) std::filesystem::remove_all(dir);
    mpi.barrier();
    dtrain::elastic::State elastic({.directory = dir / "{host}", .keep_last = 2});
    bench::Samples samples;
    std::int64_t k = 0;
    auto timed = [&](auto&& body) {
      mpi.barrier();
      const auto t0 = bench::Clock::now();
      body();
      return mpi.max_over_ranks(bench::seconds_since(t0));
    };
    auto commit = [&] {
      elastic.commit({.step = k}, {{"model", s.weights}, {"optimizer", s.velocity}});
    };
    step(s, rank, k++);  // warm-up: first-touch of every buffer
    for (int round = 0; round < rounds + 1; ++round) {  // round 0 warms the payload buffers
      const bool keep = round > 0;
      std::vector<double> plain;
      for (int i = 0; i < 5; ++i) {
        const double t = timed([&] { step(s, rank, k++); });
        plain.push_back(t);
        if (keep) samples.add("step", t);
      }
      const double reference = bench::summarize(plain).median;
      double inside = 0;
      const double t_commit = timed([&] {
        step(s, rank, k++);
        const auto t0 = bench::Clock::now();
        commit();
        inside = bench::seconds_since(t0);
      });
      inside = mpi.max_over_ranks(inside);
      double cost = t_commit - reference;
      if (keep) samples.add("step + commit()", t_commit);
      if (keep) samples.add("commit() alone", inside);
      for (int busy = 1; busy;) {  // until every writer is done
        const double t = timed([&] { step(s, rank, k++); });
        int mine = elastic.writing() ? 1 : 0;
        MPI_Allreduce(&mine, &busy, 1, MPI_INT, MPI_MAX, mpi.comm());
        if (keep) samples.add("steps during the write", t);
        cost += t - reference;
      }
      if (keep) samples.add("cost, background", cost);
      const double t_blocking = timed([&] {
        step(s, rank, k++);
        commit();
        elastic.wait();
      });
      if (keep) samples.add("step + commit + wait", t_blocking);
    }
    elastic.wait();
    if (rank == 0) {
      auto cell = [&](const char* n) {
        const auto x = samples.get(n);
        return fmt::format("{} (min {})", bench::human_time(x.median), bench::human_time(x.min));
      };
      fmt::print("| {} | {} | {} | {} | {} | {} | {} | {} |\n", name, bench::human_bytes(s.bytes),
                 cell("step"), cell("step + commit()"), cell("commit() alone"),
                 cell("steps during the write"), cell("step + commit + wait"),
                 cell("cost, background"));
    }
    mpi.barrier();
  }
  std::filesystem::remove_all(dir / fmt::format("bench-host-{}", rank));
  if (rank == 0) std::filesystem::remove_all(dir);
  if (launcher) {
    const auto port = static_cast<std::uint16_t>(launcher->port());
    dtrain::detail::LauncherClient client({"127.0.0.1", port}, std::chrono::milliseconds(2000));
    std::vector<double> times;
    for (int i = 0; i < 50; ++i) {
      const auto t0 = bench::Clock::now();
      if (!client.ask().answer) fmt::print(stderr, "the stand-in did not answer\n");
      times.push_back(bench::seconds_since(t0));
    }
    const auto q = bench::summarize(times);
    fmt::print("\nthe question alone (rank 0, loopback, 50 times): median {}, min {}\n",
               bench::human_time(q.median), bench::human_time(q.min));
  }
  launcher.reset();
  dtrain::shutdown();
  return 0;
}
