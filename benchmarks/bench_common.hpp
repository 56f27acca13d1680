#pragma once
// Shared helpers for dtrain's benchmarks: MPI set-up, timing, sample statistics, bandwidth units,
// the ResNet parameter lists, and the table printer.
//
// Note [Benchmark method]
// The machines these run on are noisy (±30% run to run, worse with 4 ranks on 2 cores), so every
// benchmark interleaves the strategies it compares round by round inside one run, takes one sample
// per strategy per round, and reports the median and the minimum of the samples. A sample's time
// is the slowest rank's time (reduced with MPI_MAX outside the timed region), measured from a
// barrier, so a sample is what a synchronous training step would see. Ratios are always taken
// against the raw-MPI figure measured in the same run.
#include <mpi.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <fmt/format.h>

namespace bench {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The benchmark initializes MPI itself (as a user program may), so dtrain can be initialized,
// shut down and initialized again with another Config in the same process.
class MpiProcess {
 public:
  MpiProcess(int& argc, char**& argv) {
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    if (provided < MPI_THREAD_MULTIPLE) {
      std::fprintf(stderr, "this MPI does not provide MPI_THREAD_MULTIPLE\n");
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
    MPI_Comm_dup(MPI_COMM_WORLD, &comm_);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  MpiProcess(const MpiProcess&) = delete;
  MpiProcess& operator=(const MpiProcess&) = delete;
  ~MpiProcess() {
    // What dtrain does when it finalizes MPI itself (Note [Finalize over TCP] in
    // include/dtrain/runtime/detail/session_impl.hpp): across hosts over TCP, MPICH/UCX can hang in
    // MPI_Finalize while a last message is still in flight.
    if (size_ > 1) {
      MPI_Barrier(comm_);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    MPI_Comm_free(&comm_);
    MPI_Finalize();
  }
  // The communicator the raw-MPI strategies and the benchmark's own barriers use.
  MPI_Comm comm() const noexcept { return comm_; }
  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  void barrier() const { MPI_Barrier(comm_); }
  double max_over_ranks(double v) const {
    double out = 0;
    MPI_Allreduce(&v, &out, 1, MPI_DOUBLE, MPI_MAX, comm_);
    return out;
  }
  double sum_over_ranks(double v) const {
    double out = 0;
    MPI_Allreduce(&v, &out, 1, MPI_DOUBLE, MPI_SUM, comm_);
    return out;
  }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
};

struct Summary {
  double median = 0;
  double min = 0;
  std::size_t count = 0;
};

inline Summary summarize(std::vector<double> v) {
  Summary s;
  s.count = v.size();
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  s.min = v.front();
  const std::size_t n = v.size();
  s.median = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  return s;
}

// Samples by strategy name, kept in insertion order for printing.
class Samples {
 public:
  void add(const std::string& name, double value) {
    auto [it, inserted] = data_.try_emplace(name);
    if (inserted) order_.push_back(name);
    it->second.push_back(value);
  }
  Summary get(const std::string& name) const {
    auto it = data_.find(name);
    return it == data_.end() ? Summary{} : summarize(it->second);
  }
  const std::vector<std::string>& names() const noexcept { return order_; }

 private:
  std::map<std::string, std::vector<double>> data_;
  std::vector<std::string> order_;
};

// nccl-tests units: algbw = bytes / time; busbw = algbw * 2(n-1)/n for allreduce.
inline double algbw_gbps(double bytes, double secs) { return secs > 0 ? bytes / secs / 1e9 : 0; }
inline double allreduce_busbw_gbps(double bytes, double secs, int n) {
  return algbw_gbps(bytes, secs) * 2.0 * (n - 1) / n;
}

inline std::string human_bytes(std::int64_t b) {
  if (b >= (1 << 20) && b % (1 << 20) == 0) return fmt::format("{} MiB", b >> 20);
  if (b >= (1 << 10) && b % (1 << 10) == 0) return fmt::format("{} KiB", b >> 10);
  return fmt::format("{} B", b);
}

// A duration in the unit that keeps 3 significant digits readable.
inline std::string human_time(double secs) {
  if (secs >= 1) return fmt::format("{:.3f} s", secs);
  if (secs >= 1e-3) return fmt::format("{:.2f} ms", secs * 1e3);
  return fmt::format("{:.1f} us", secs * 1e6);
}

inline double cpu_seconds_self() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}
inline long minor_faults_self() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

// One line naming the machine, printed by rank 0 at the top of every benchmark.
inline std::string machine_line(int ranks) {
  std::string model = "unknown CPU";
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) == 0) {
      auto colon = line.find(':');
      if (colon != std::string::npos) model = line.substr(colon + 2);
      break;
    }
  }
  char version[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int len = 0;
  MPI_Get_library_version(version, &len);
  std::string v(version, static_cast<std::size_t>(len));
  if (auto nl = v.find('\n'); nl != std::string::npos) v.resize(nl);
  return fmt::format("machine: {} online CPUs, {}; {}; {} ranks", sysconf(_SC_NPROCESSORS_ONLN),
                     model, v, ranks);
}

// ---- model parameter lists -------------------------------------------------------------------

struct Param {
  std::string name;
  std::vector<std::int64_t> shape;
  std::int64_t numel() const {
    std::int64_t n = 1;
    for (auto d : shape) n *= d;
    return n;
  }
};

// torchvision's resnet18/resnet50 parameters (named_parameters() order), reversed: the order in
// which backward produces the gradients. Built from the architecture so each shape is checkable
// against the published parameter counts (11,689,512 and 25,557,032).
inline std::vector<Param> resnet_params(bool bottleneck, const std::vector<int>& blocks) {
  std::vector<Param> p;
  auto conv = [&](std::string n, std::int64_t out, std::int64_t in, std::int64_t k) {
    p.push_back({n + ".weight", {out, in, k, k}});
  };
  auto bn = [&](std::string n, std::int64_t c) {
    p.push_back({n + ".weight", {c}});
    p.push_back({n + ".bias", {c}});
  };
  conv("conv1", 64, 3, 7);
  bn("bn1", 64);
  const int expansion = bottleneck ? 4 : 1;
  std::int64_t in = 64;
  for (int layer = 0; layer < 4; ++layer) {
    const std::int64_t width = 64 << layer;
    for (int b = 0; b < blocks[static_cast<std::size_t>(layer)]; ++b) {
      const std::string pre = fmt::format("layer{}.{}", layer + 1, b);
      if (bottleneck) {
        conv(pre + ".conv1", width, in, 1);
        bn(pre + ".bn1", width);
        conv(pre + ".conv2", width, width, 3);
        bn(pre + ".bn2", width);
        conv(pre + ".conv3", width * expansion, width, 1);
        bn(pre + ".bn3", width * expansion);
      } else {
        conv(pre + ".conv1", width, in, 3);
        bn(pre + ".bn1", width);
        conv(pre + ".conv2", width, width, 3);
        bn(pre + ".bn2", width);
      }
      if (b == 0 && (in != width * expansion || layer > 0)) {
        conv(pre + ".downsample.0", width * expansion, in, 1);
        bn(pre + ".downsample.1", width * expansion);
      }
      in = width * expansion;
    }
  }
  p.push_back({"fc.weight", {1000, in}});
  p.push_back({"fc.bias", {1000}});
  std::reverse(p.begin(), p.end());
  return p;
}

inline std::vector<Param> resnet50_params() {
  auto p = resnet_params(true, {3, 4, 6, 3});
  std::int64_t total = 0;
  for (const auto& x : p) total += x.numel();
  if (p.size() != 161 || total != 25557032) {
    std::fprintf(stderr, "resnet50 parameter list is wrong: %zu tensors, %lld values\n", p.size(),
                 static_cast<long long>(total));
    std::abort();
  }
  return p;
}

inline std::vector<Param> resnet18_params() {
  auto p = resnet_params(false, {2, 2, 2, 2});
  std::int64_t total = 0;
  for (const auto& x : p) total += x.numel();
  if (p.size() != 62 || total != 11689512) {
    std::fprintf(stderr, "resnet18 parameter list is wrong: %zu tensors, %lld values\n", p.size(),
                 static_cast<long long>(total));
    std::abort();
  }
  return p;
}

// ---- command line ----------------------------------------------------------------------------

// --key=value options; anything else is an error the benchmark reports.
class Args {
 public:
  Args(int argc, char** argv) {
    for (int i = 1; i < argc; ++i) {
      std::string_view a = argv[i];
      if (a.rfind("--", 0) != 0) continue;
      auto eq = a.find('=');
      if (eq == std::string_view::npos) kv_[std::string(a.substr(2))] = "1";
      else kv_[std::string(a.substr(2, eq - 2))] = std::string(a.substr(eq + 1));
    }
  }
  long get_int(const std::string& key, long fallback) const {
    auto it = kv_.find(key);
    return it == kv_.end() ? fallback : std::strtol(it->second.c_str(), nullptr, 10);
  }
  double get_double(const std::string& key, double fallback) const {
    auto it = kv_.find(key);
    return it == kv_.end() ? fallback : std::strtod(it->second.c_str(), nullptr);
  }
  std::string get(const std::string& key, const std::string& fallback) const {
    auto it = kv_.find(key);
    return it == kv_.end() ? fallback : it->second;
  }

 private:
  std::map<std::string, std::string> kv_;
};

}  // namespace bench
