#pragma once
// dtrain::Profiler: where a distributed training step spends its time. RAII scopes time the
// phases of each step on the training thread; a sampler thread records CPU, memory, network,
// disk and GPU use; each step also records how much the engine communicated. Every rank writes
// its own JSON Lines file (Note [Profile schema]); `dtrain-report DIR -o report.html` merges them.
//
//   dtrain::Profiler profiler;                        // DTRAIN_PROFILE=dir turns it on
//   for (...) {
//     auto step = profiler.step(batch_size);
//     { auto p = profiler.phase(dtrain::Phase::data); batch = loader.next(); }
//     { auto p = profiler.phase(dtrain::Phase::forward); loss = model(batch); }
//     ...
//   }
//
// Note [Profiler cost]
// Off (no folder), a scope is a null-pointer test when it opens and when it closes, with no
// clock read. On, a phase costs two steady_clock reads and a push/pop on a small vector; a step
// adds two engine_stats() snapshots (its start and end: collectives run between steps, such as
// metric averaging, are not charged to any step) and one move into the writer's queue. Formatting and file I/O
// happen on the writer thread. benchmarks/profiler_overhead.cpp measures both (docs/profiling.md).
//
// Note [Profiler threading]
// Construction is collective when dtrain is initialized: every rank must build its Profiler, in
// the same order relative to other profilers, and all must agree on whether profiling is on. The
// ranks exchange that (one small allgather) and use it to agree on the run's identity and time
// zero; a rank that is off while others are on, or cannot write its file, makes every rank throw.
// After that a Profiler is used from one thread, the one that runs the training loop.
#include <sched.h>
#include <unistd.h>

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "dtrain/runtime/collectives.hpp"
#include "dtrain/core/config.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/logging.hpp"
#include "dtrain/core/version.hpp"
#include "dtrain/profile/engine_counters.hpp"
#include "dtrain/profile/nvml.hpp"
#include "dtrain/profile/options.hpp"
#include "dtrain/profile/phase.hpp"
#include "dtrain/profile/phase_times.hpp"
#include "dtrain/profile/record_writer.hpp"
#include "dtrain/profile/records.hpp"
#include "dtrain/profile/run_agreement.hpp"
#include "dtrain/profile/sampler.hpp"
#include "dtrain/runtime/runtime.hpp"

namespace dtrain {
namespace detail {

// Everything a recording profiler owns. Scopes point here, so a Profiler can be moved while
// they are open.
struct ProfilerState {
  using Clock = std::chrono::steady_clock;

  ProfilerOptions options;
  std::unique_ptr<RecordWriter> writer;
  Nvml nvml;
  std::unique_ptr<Sampler> sampler;
  PhaseTimes times;
  Clock::time_point origin;
  bool recording = false;
  std::int64_t recorded_steps = 0;
  std::int64_t phases_outside_steps = 0;
  std::optional<EngineStats> engine_at_step_start;

  double seconds_since_origin(Clock::time_point t) const {
    return std::chrono::duration<double>(t - origin).count();
  }

  // The engine's counters now, or nothing when dtrain is not running.
  static std::optional<EngineStats> engine_snapshot() {
    if (!dtrain::is_initialized()) return std::nullopt;
    try {
      return dtrain::engine_stats();
    } catch (const NotInitializedError&) {  // shut down since the check
      return std::nullopt;
    }
  }
};

inline std::string profile_file_name(int rank) { return fmt::format("rank-{}.jsonl", rank); }

// Creates the folder if needed; returns a problem, or an empty string.
inline std::string prepare_profile_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path p(dir);
  if (fs::exists(p, ec) && !fs::is_directory(p, ec))
    return fmt::format(
        "dtrain: the profile folder '{}' (DTRAIN_PROFILE or ProfilerOptions::dir) exists and is "
        "not a folder; name a folder, or a path where one can be created",
        dir);
  fs::create_directories(p, ec);
  if (ec)
    return fmt::format(
        "dtrain: cannot create the profile folder '{}' (DTRAIN_PROFILE or ProfilerOptions::dir): "
        "{}; name a folder this process can write",
        dir, ec.message());
  return {};
}

// The number of processes this one was launched with when dtrain is not initialized: from MPI if
// it is running, else from the launcher's environment (MPICH's PMI_SIZE, Open MPI's
// OMPI_COMM_WORLD_SIZE); 1 when nothing says otherwise.
inline int launched_world_size() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) {
    int n = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    return n;
  }
  for (const char* var : {"PMI_SIZE", "OMPI_COMM_WORLD_SIZE"})
    if (const char* v = std::getenv(var)) return std::max(1, std::atoi(v));
  return 1;
}

inline long affinity_cpu_count() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return 0;
  return CPU_COUNT(&set);
}

inline std::string host_label(const std::string& host_id) {
  if (!host_id.empty()) return host_id;
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "localhost";
  return buf;
}

}  // namespace detail

class Profiler {
 public:
  class PhaseScope;
  class StepScope;

  // Options from dtrain's Config (DTRAIN_PROFILE, DTRAIN_PROFILE_INTERVAL_MS): the Config of
  // init() when dtrain is initialized, otherwise read from the environment.
  Profiler() : Profiler(options_from_config()) {}

  // Collective when dtrain is initialized (Note [Profiler threading]). Throws
  // InvalidArgumentError for an interval outside 100 ms to 60 s or an unwritable folder.
  explicit Profiler(ProfilerOptions options) : Profiler(Checked{std::move(options), {}}) {}

  Profiler(const Profiler&) = delete;
  Profiler& operator=(const Profiler&) = delete;
  Profiler(Profiler&&) noexcept = default;
  Profiler& operator=(Profiler&& other) noexcept {
    if (this != &other) {
      close();
      state_ = std::move(other.state_);
      steps_ = other.steps_;
    }
    return *this;
  }
  // Stops recording and closes the file (writing what is queued). Never throws.
  ~Profiler() { close(); }

  // Whether this profiler writes a profile at all (a folder was given).
  bool enabled() const noexcept { return state_ != nullptr; }
  // Whether steps and samples are being recorded now.
  bool recording() const noexcept { return state_ && state_->recording; }
  // Steps begun so far, recorded or not: the step counter.
  std::int64_t steps() const noexcept { return steps_; }
  // This rank's profile file; empty when profiling is off.
  std::string path() const { return state_ ? state_->writer->path() : std::string(); }

  // Begins (or resumes) recording: steps from the next one on, and system samples.
  void start() {
    if (!state_ || state_->recording) return;
    state_->writer->push(detail::MarkRecord{detail::MarkRecord::Kind::start, now_seconds(),
                                            steps_, 0});
    state_->sampler->start();
    state_->recording = true;
  }

  // Stops recording; start() resumes. A step still open is not recorded.
  void stop() {
    if (!state_ || !state_->recording) return;
    state_->recording = false;
    state_->sampler->stop();
    state_->writer->push(detail::MarkRecord{detail::MarkRecord::Kind::stop, now_seconds(),
                                            state_->recorded_steps,
                                            state_->phases_outside_steps});
  }

  // Blocks until everything recorded so far is in the file.
  void flush() {
    if (state_) state_->writer->flush();
  }

  // One training step, from here to the end of the returned scope. `samples`: the examples this
  // rank processes in the step (its batch size), for throughput and batch-size findings.
  [[nodiscard]] StepScope step(std::int64_t samples = 0);
  // A phase of the current step, from here to the end of the returned scope.
  [[nodiscard]] PhaseScope phase(Phase phase);
  // A user-named phase; a standard name ("data", "forward", ...) is that standard phase.
  [[nodiscard]] PhaseScope phase(std::string_view name);

 private:
  // Options and the first problem found with them; problems are raised after the ranks agree,
  // so that a bad setting on one rank cannot leave the others waiting.
  struct Checked {
    ProfilerOptions options;
    std::string problem;
  };

  static Checked options_from_config() {
    Checked c;
    try {
      c.options = profiler_options_from(dtrain::is_initialized() ? dtrain::config()
                                                                 : Config::from_env());
    } catch (const InvalidArgumentError& e) {
      c.problem = e.what();
    }
    return c;
  }

  explicit Profiler(Checked checked) {
    ProfilerOptions options = std::move(checked.options);
    std::string problem = std::move(checked.problem);
    const bool distributed = dtrain::is_initialized();
    const int rank = distributed ? dtrain::rank() : 0;
    const int size = distributed ? dtrain::size() : 1;
    if (problem.empty()) {
      try {
        options.validate();
      } catch (const InvalidArgumentError& e) {
        problem = e.what();
      }
    }
    auto state = std::make_unique<detail::ProfilerState>();
    const bool on = !options.dir.empty();
    if (on && problem.empty() && !distributed)
      if (const int n = detail::launched_world_size(); n > 1)
        problem = fmt::format(
            "dtrain: a Profiler was built before dtrain::init() in a job of {} processes: each "
            "would write the same file. Build it after dtrain::init() (or a dtrain::Session), so "
            "that every rank writes its own",
            n);
    if (on && problem.empty()) problem = detail::prepare_profile_dir(options.dir);
    if (on && problem.empty()) {
      try {
        state->writer = std::make_unique<detail::RecordWriter>(
            (std::filesystem::path(options.dir) / detail::profile_file_name(rank)).string());
      } catch (const InvalidArgumentError& e) {
        problem = e.what();
      }
    }
    // Every rank learns every rank's outcome before anyone throws, so no rank waits forever.
    const detail::RunAgreement agreed =
        detail::agree_on_run(on, problem.empty(), distributed, rank, size);
    if (!problem.empty()) throw InvalidArgumentError(problem);
    agreed.throw_if_inconsistent(options.dir);
    if (!on) return;

    state->options = std::move(options);
    state->origin = detail::ProfilerState::Clock::now();
    const int local_rank = distributed ? dtrain::local_rank() : 0;
    state->nvml = detail::Nvml::open(state->options.nvml_library, state->options.gpu_index,
                                     local_rank);
    detail::HeaderRecord h;
    h.run_id = agreed.run_id;
    h.rank = rank;
    h.size = size;
    h.local_rank = local_rank;
    h.local_size = distributed ? dtrain::local_size() : 1;
    h.host = detail::host_label(distributed ? dtrain::config().host_id : std::string());
    h.pid = static_cast<long>(getpid());
    h.cpu_count = sysconf(_SC_NPROCESSORS_ONLN);
    h.affinity_cpus = detail::affinity_cpu_count();
    h.sample_interval_ms = static_cast<double>(state->options.sample_interval.count());
    h.start_unix_ms = std::chrono::duration<double, std::milli>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
    h.dtrain_version = dtrain::version();
    h.gpu_available = state->nvml.available();
    h.gpu_reason = state->nvml.reason();
    h.gpu_index = state->nvml.index();
    h.gpu_name = state->nvml.name();
    h.gpu_memory_total_bytes = state->nvml.memory_total_bytes();
    state->writer->push(std::move(h));
    state->sampler = std::make_unique<detail::Sampler>(*state->writer, state->nvml,
                                                       state->options.sample_interval,
                                                       state->origin);
    if (rank == 0)
      detail::log(LogLevel::info, "profiling {} rank(s) into {}; report: dtrain-report {} -o report.html",
                  size, state->options.dir, state->options.dir);
    state_ = std::move(state);
    if (state_->options.start_recording) start();
  }

  double now_seconds() const {
    return state_->seconds_since_origin(detail::ProfilerState::Clock::now());
  }

  void close() noexcept {
    if (!state_) return;
    try {
      stop();
      state_->writer->push(detail::MarkRecord{detail::MarkRecord::Kind::end, now_seconds(),
                                              state_->recorded_steps, 0});
    } catch (...) {  // allocation failure while stopping: the file still ends on whole lines
    }
    state_->sampler.reset();
    state_->writer->close();
    state_.reset();
  }

  std::unique_ptr<detail::ProfilerState> state_;
  std::int64_t steps_ = 0;
};

// Times one phase. Moving it moves the responsibility to close the phase.
class [[nodiscard]] Profiler::PhaseScope {
 public:
  PhaseScope() = default;
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;
  PhaseScope(PhaseScope&& o) noexcept : state_(std::exchange(o.state_, nullptr)) {}
  PhaseScope& operator=(PhaseScope&& o) noexcept {
    if (this != &o) {
      end();
      state_ = std::exchange(o.state_, nullptr);
    }
    return *this;
  }
  ~PhaseScope() { end(); }

  // Closes the phase before the end of the scope.
  void end() noexcept {
    if (!state_) return;
    state_->times.exit(detail::ProfilerState::Clock::now());
    state_ = nullptr;
  }

 private:
  friend class Profiler;
  PhaseScope(detail::ProfilerState* state, std::size_t slot) {
    if (!state->times.in_step()) {
      ++state->phases_outside_steps;
      return;
    }
    state->times.enter(slot, detail::ProfilerState::Clock::now());
    state_ = state;
  }
  detail::ProfilerState* state_ = nullptr;
};

// Times one step and records it when it ends.
class [[nodiscard]] Profiler::StepScope {
 public:
  StepScope() = default;
  StepScope(const StepScope&) = delete;
  StepScope& operator=(const StepScope&) = delete;
  StepScope(StepScope&& o) noexcept
      : state_(std::exchange(o.state_, nullptr)), index_(o.index_), samples_(o.samples_) {}
  StepScope& operator=(StepScope&& o) noexcept {
    if (this != &o) {
      end();
      state_ = std::exchange(o.state_, nullptr);
      index_ = o.index_;
      samples_ = o.samples_;
    }
    return *this;
  }
  ~StepScope() { end(); }

  // Ends the step before the end of the scope.
  void end() noexcept {
    if (!state_) return;
    detail::ProfilerState* s = std::exchange(state_, nullptr);
    const auto now = detail::ProfilerState::Clock::now();
    try {
      detail::PhaseTimes::Step times = s->times.end_step(now);
      if (!s->recording) return;  // stopped during the step
      detail::StepRecord r;
      r.step = index_;
      r.t = s->seconds_since_origin(now - times.total);
      r.duration = times.total;
      r.other = times.other;
      r.phases = std::move(times.phases);
      r.samples = samples_;
      if (s->engine_at_step_start)
        if (auto e = detail::ProfilerState::engine_snapshot())
          r.engine = detail::engine_stats_delta(*e, *s->engine_at_step_start);
      s->writer->push(std::move(r));
      ++s->recorded_steps;
    } catch (...) {  // out of memory: lose this step, never throw from a destructor
    }
  }

 private:
  friend class Profiler;
  StepScope(detail::ProfilerState* state, std::int64_t index, std::int64_t samples)
      : index_(index), samples_(samples) {
    if (state->times.in_step()) return;  // a step inside a step: the outer one counts
    state->engine_at_step_start = detail::ProfilerState::engine_snapshot();
    state->times.begin_step(detail::ProfilerState::Clock::now());
    state_ = state;
  }
  detail::ProfilerState* state_ = nullptr;
  std::int64_t index_ = 0;
  std::int64_t samples_ = 0;
};

inline Profiler::StepScope Profiler::step(std::int64_t samples) {
  const std::int64_t index = steps_++;
  if (!state_ || !state_->recording) return StepScope();
  return StepScope(state_.get(), index, samples);
}

inline Profiler::PhaseScope Profiler::phase(Phase phase) {
  if (!state_ || !state_->recording) return PhaseScope();
  return PhaseScope(state_.get(), detail::PhaseTimes::slot_of(phase));
}

inline Profiler::PhaseScope Profiler::phase(std::string_view name) {
  if (name.empty() || name == "other")
    throw InvalidArgumentError(fmt::format(
        "dtrain: Profiler::phase(\"{}\"): a phase needs a name other than \"\" and \"other\" "
        "(\"other\" is the time no phase covered)",
        name));
  if (!state_ || !state_->recording) return PhaseScope();
  return PhaseScope(state_.get(), state_->times.slot_of(name));
}

}  // namespace dtrain
