// A small distributed program that fails on purpose, for run_faults.py. Every rank prints what it
// sees as lines starting with "fault-report:", which the driver checks.
//
//   fault_program loop <rank> <step> <kill|segv|exit3|return0|stop>
//       every rank runs allreduce steps; at <step>, <rank> dies in the given way ("stop": it freezes
//       with SIGSTOP during a large allreduce, so its peers' collective never completes)
//   fault_program init-retry        a failed init() followed by a successful one still finalizes MPI
//   fault_program finalize-first    MPI_Finalize() while dtrain runs
//   fault_program timeline <path>   init() with DTRAIN_TIMELINE=<path>
#include <mpi.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "dtrain/dtrain.hpp"

namespace {

using namespace std::chrono_literals;

template <class... Args>
void report(fmt::format_string<Args...> f, Args&&... args) {
  std::printf("fault-report: %s\n", fmt::format(f, std::forward<Args>(args)...).c_str());
  std::fflush(stdout);
}

const char* kind_of(const dtrain::Error& e) {
  if (dynamic_cast<const dtrain::TimeoutError*>(&e)) return "TimeoutError";
  if (dynamic_cast<const dtrain::ShutdownError*>(&e)) return "ShutdownError";
  if (dynamic_cast<const dtrain::MismatchError*>(&e)) return "MismatchError";
  return "Error";
}

int loop(int die_rank, int die_step, const std::string& how) {
  dtrain::init();
  const int rank = dtrain::rank();
  report("rank {} pid {}", rank, static_cast<long>(getpid()));
  try {
    for (int step = 0; step < 1000000; ++step) {
      if (rank == die_rank && step == die_step) {
        report("rank {} dies ({}) at step {}", rank, how, step);
        if (how == "kill") raise(SIGKILL);
        if (how == "segv") raise(SIGSEGV);
        if (how == "exit3") std::exit(3);
        if (how == "return0") return 0;  // leaves main() without dtrain::shutdown()
      }
      if (how == "stop" && step == die_step) {
        // A collective long enough to freeze a rank in the middle of it.
        std::vector<float> big(std::size_t{64} << 20, 1.0f);
        auto h = dtrain::allreduce_async(big, {.op = dtrain::ReduceOp::Sum, .name = "big"});
        if (rank == die_rank) {
          std::this_thread::sleep_for(30ms);
          report("rank {} freezes", rank);
          raise(SIGSTOP);
        }
        h.wait();
      }
      std::vector<float> v(1024, 1.0f);
      dtrain::allreduce(v, {.op = dtrain::ReduceOp::Sum, .name = fmt::format("step.{}", step)});
      std::this_thread::sleep_for(2ms);
    }
  } catch (const dtrain::Error& e) {
    report("rank {} caught {}: {}", rank, kind_of(e), e.what());
    // The process can still save its state and exit.
    std::ofstream(fmt::format("saved.{}", rank)) << "state of rank " << rank << "\n";
    dtrain::shutdown();
    report("rank {} saved and exits", rank);
    return 1;
  }
  dtrain::shutdown();
  return 0;
}

int init_retry() {
  dtrain::Config bad = dtrain::Config::from_env();
  bad.timeline_path = "/nonexistent-dtrain-dir/timeline.json";
  try {
    dtrain::init(bad);
    report("init with an unwritable timeline did not fail");
    return 1;
  } catch (const dtrain::Error& e) {
    report("first init failed: {}", e.what());
  }
  dtrain::init();
  std::vector<float> v(4, 1.0f);
  dtrain::allreduce(v);
  dtrain::shutdown();
  int finalized = 0;
  MPI_Finalized(&finalized);
  report("MPI finalized after shutdown: {}", finalized);
  return finalized ? 0 : 1;
}

int finalize_first() {
  int provided = 0;
  MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
  dtrain::init();
  std::vector<float> v(4, 1.0f);
  dtrain::allreduce(v);
  std::vector<std::string> log;
  dtrain::detail::set_log_sink([&](std::string_view line) { log.emplace_back(line); });
  MPI_Finalize();
  dtrain::detail::set_log_sink({});
  bool warned = false;
  for (const auto& line : log) warned |= line.find("MPI_Finalize() was called while dtrain was running") != std::string::npos;
  report("warned: {}; dtrain still running after MPI_Finalize: {}", warned, dtrain::is_initialized());
  return warned && !dtrain::is_initialized() ? 0 : 1;
}

int timeline(const std::string& path) {
  dtrain::Config c = dtrain::Config::from_env();
  c.timeline_path = path;
  try {
    dtrain::init(c);
    dtrain::shutdown();
    report("init with timeline {} succeeded", path);
  } catch (const dtrain::Error& e) {
    report("init failed: {}", e.what());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "loop" && argc == 5) return loop(std::atoi(argv[2]), std::atoi(argv[3]), argv[4]);
  if (mode == "init-retry") return init_retry();
  if (mode == "finalize-first") return finalize_first();
  if (mode == "timeline" && argc == 3) return timeline(argv[2]);
  std::fprintf(stderr, "usage: fault_program loop <rank> <step> <how> | init-retry | "
                       "finalize-first | timeline <path>\n");
  return 2;
}
