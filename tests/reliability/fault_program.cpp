// A small distributed program that fails on purpose, for run_faults.py. Every rank prints what it
// sees as lines starting with "fault-report:", which the driver checks.
//
//   fault_program loop <rank> <step> <kill|segv|exit3|return0|stop>
//       every rank runs allreduce steps; at <step>, <rank> dies in the given way ("stop": it freezes
//       with SIGSTOP during a large allreduce, so its peers' collective never completes)
//   fault_program init-retry        a failed init() followed by a successful one still finalizes MPI
//   fault_program finalize-first    MPI_Finalize() while dtrain runs
//   fault_program timeline <path>   init() with DTRAIN_TIMELINE=<path>
//   fault_program steps <n>         every rank runs n checked allreduce steps, reporting its pid
//                                   and when rank 0 is at step 100 (the pause scenarios)
//   fault_program restart <owner>   calls after shutdown() and a second init(), with MPI started
//                                   by dtrain (owner "dtrain") or by the program ("program")
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

int steps(int count) {
  dtrain::init();
  const int rank = dtrain::rank(), size = dtrain::size();
  report("rank {} pid {}", rank, static_cast<long>(getpid()));
  bool exact = true;
  try {
    for (int step = 0; step < count; ++step) {
      if (rank == 0 && step == 100) report("rank 0 at step 100");
      std::vector<float> v(1024, static_cast<float>(rank + 1));
      dtrain::allreduce(v, {.op = dtrain::ReduceOp::Sum, .name = fmt::format("step.{}", step)});
      exact = exact && v.front() == static_cast<float>(size * (size + 1) / 2) &&
              v.back() == v.front();
      std::this_thread::sleep_for(10ms);
    }
  } catch (const dtrain::Error& e) {
    report("rank {} caught {}: {}", rank, kind_of(e), e.what());
    std::ofstream(fmt::format("saved.{}", rank)) << "state of rank " << rank << "\n";
    dtrain::shutdown();
    report("rank {} saved and exits", rank);
    return 1;
  }
  dtrain::shutdown();
  report("rank {} finished {} steps, results exact: {}", rank, count, exact);
  return exact ? 0 : 1;
}

// What an op after shutdown() and a second init() say, and whether the second init() works.
int restart(const std::string& owner) {
  if (owner == "program") {
    int provided = 0;
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
  }
  dtrain::init();
  dtrain::shutdown();
  std::vector<float> v(4, 1.0f);
  try {
    dtrain::allreduce(v);
    report("an allreduce after shutdown() did not fail");
    return 1;
  } catch (const dtrain::NotInitializedError& e) {
    report("after shutdown: {}", e.what());
  }
  bool restarted = false;
  try {
    dtrain::init();
    dtrain::allreduce(v);
    dtrain::shutdown();
    restarted = true;
  } catch (const dtrain::Error& e) {
    report("init again: {}", e.what());
  }
  report("restarted: {}", restarted);
  if (owner == "program") MPI_Finalize();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "loop" && argc == 5) return loop(std::atoi(argv[2]), std::atoi(argv[3]), argv[4]);
  if (mode == "init-retry") return init_retry();
  if (mode == "finalize-first") return finalize_first();
  if (mode == "timeline" && argc == 3) return timeline(argv[2]);
  if (mode == "restart" && argc == 3) return restart(argv[2]);
  if (mode == "steps" && argc == 3) return steps(std::atoi(argv[2]));
  std::fprintf(stderr, "usage: fault_program loop <rank> <step> <how> | init-retry | "
                       "finalize-first | timeline <path> | restart dtrain|program | steps <n>\n");
  return 2;
}
