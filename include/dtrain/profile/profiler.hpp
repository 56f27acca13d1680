#pragma once
// dtrain::Profiler: where a distributed training step spends its time. RAII scopes time the
// phases of each step on the training thread; a sampler thread records CPU, memory, network,
// disk and GPU use; each step also records how much the engine communicated. Every rank writes
// its own JSON Lines file (Note [Profile schema]); `dtrain-report DIR -o report.html` merges them.
// With DTRAIN_PROFILE set, a job is profiled without any Profiler (steps from the optimizer's
// updates, waits on handles as communication wait: Note [Zero-code profiling]); a Profiler then
// adds its steps and phases to that profile.
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
// Construction is collective when dtrain is initialized and the job has no profile of its own
// (DTRAIN_PROFILE was not set at init): every rank must build its Profiler, in the same order
// relative to other profilers, and all must agree on whether profiling is on. The ranks exchange
// that (one small allgather) and use it to agree on the run's identity and time zero; a rank that
// is off while others are on, or cannot write its file, makes every rank throw. init() agrees the
// same way on the job's profile; a Profiler built while that is open attaches to it, locally.
// After that a Profiler is used from one thread, the one that runs the training loop.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "dtrain/core/build_mode.hpp"
#include "dtrain/profile/options.hpp"
#include "dtrain/profile/phase.hpp"

namespace dtrain {
namespace detail {
struct ProfilerState;
// The scopes' work when the profiler records (profile/profiler_impl.hpp).
DTRAIN_API bool enter_phase(ProfilerState& state, std::size_t slot);
DTRAIN_API void exit_phase(ProfilerState& state) noexcept;
DTRAIN_API bool begin_step(ProfilerState& state);
DTRAIN_API void end_step(ProfilerState& state, std::int64_t index, std::int64_t samples) noexcept;
}  // namespace detail

class Profiler {
 public:
  class PhaseScope;
  class StepScope;

  // Options from dtrain's Config (DTRAIN_PROFILE, DTRAIN_PROFILE_INTERVAL_MS): the Config of
  // init() when dtrain is initialized, otherwise read from the environment.
  DTRAIN_API Profiler();

  // Collective when dtrain is initialized without a job profile (Note [Profiler threading]).
  // Throws InvalidArgumentError for an interval outside 100 ms to 60 s or an unwritable folder.
  // While the job is profiled (DTRAIN_PROFILE at init), attaches to that profile instead: its
  // folder and interval are the job's, and only start_recording = false applies.
  DTRAIN_API explicit Profiler(ProfilerOptions options);

  Profiler(const Profiler&) = delete;
  Profiler& operator=(const Profiler&) = delete;
  DTRAIN_API Profiler(Profiler&& other) noexcept;
  DTRAIN_API Profiler& operator=(Profiler&& other) noexcept;
  // Stops recording and closes the file (writing what is queued); an attached Profiler leaves
  // the job's profile to shutdown(). Never throws.
  DTRAIN_API ~Profiler();

  // Whether this profiler writes a profile at all (a folder was given, or the job is profiled).
  bool enabled() const noexcept { return state_ != nullptr; }
  // Whether it adds to the job's profile (DTRAIN_PROFILE at init) rather than its own.
  bool attached() const noexcept { return attached_; }
  // Whether steps and samples are being recorded now.
  DTRAIN_API bool recording() const noexcept;
  // Steps begun so far, recorded or not: the step counter.
  std::int64_t steps() const noexcept { return steps_; }
  // This rank's profile file (in the run's folder within the profile folder); empty when
  // profiling is off.
  DTRAIN_API std::string path() const;

  // Begins (or resumes) recording: steps from the next one on, and system samples.
  DTRAIN_API void start();
  // Stops recording; start() resumes. A step still open is not recorded.
  DTRAIN_API void stop();
  // Blocks until everything recorded so far is in the file.
  DTRAIN_API void flush();

  // One training step, from here to the end of the returned scope. `samples`: the examples this
  // rank processes in the step (its batch size), for throughput and batch-size findings.
  [[nodiscard]] StepScope step(std::int64_t samples = 0);
  // A phase of the current step, from here to the end of the returned scope.
  [[nodiscard]] PhaseScope phase(Phase phase);
  // A user-named phase; a standard name ("data", "forward", ...) is that standard phase.
  [[nodiscard]] PhaseScope phase(std::string_view name);

 private:
  struct Checked;
  DTRAIN_API explicit Profiler(Checked checked);
  DTRAIN_API static Checked options_from_config();
  DTRAIN_API void attach(std::shared_ptr<detail::ProfilerState> job, Checked checked);
  DTRAIN_API void close() noexcept;
  DTRAIN_API std::size_t slot_of(std::string_view name);

  std::shared_ptr<detail::ProfilerState> state_;
  bool attached_ = false;
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
    if (state_) detail::exit_phase(*std::exchange(state_, nullptr));
  }

 private:
  friend class Profiler;
  PhaseScope(detail::ProfilerState* state, std::size_t slot) {
    if (detail::enter_phase(*state, slot)) state_ = state;
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
    if (state_) detail::end_step(*std::exchange(state_, nullptr), index_, samples_);
  }

 private:
  friend class Profiler;
  StepScope(detail::ProfilerState* state, std::int64_t index, std::int64_t samples)
      : index_(index), samples_(samples) {
    if (detail::begin_step(*state)) state_ = state;
  }
  detail::ProfilerState* state_ = nullptr;
  std::int64_t index_ = 0;
  std::int64_t samples_ = 0;
};

// Off (no folder), a scope costs a null-pointer test (Note [Profiler cost]).
inline Profiler::StepScope Profiler::step(std::int64_t samples) {
  const std::int64_t index = steps_++;
  if (!state_) return StepScope();
  return StepScope(state_.get(), index, samples);
}

inline Profiler::PhaseScope Profiler::phase(Phase phase) {
  if (!state_) return PhaseScope();
  return PhaseScope(state_.get(), static_cast<std::size_t>(phase));
}

inline Profiler::PhaseScope Profiler::phase(std::string_view name) {
  const std::size_t slot = slot_of(name);  // checks the name even when off
  if (!state_) return PhaseScope();
  return PhaseScope(state_.get(), slot);
}

}  // namespace dtrain

#ifdef DTRAIN_HEADER_ONLY
#include "dtrain/profile/profiler_impl.hpp"
#endif
