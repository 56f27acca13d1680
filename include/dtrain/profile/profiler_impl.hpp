#pragma once
// Definitions of profile/profiler.hpp (Note [Build modes] in core/build_mode.hpp).
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include "dtrain/core/config.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/logging.hpp"
#include "dtrain/core/version.hpp"
#include "dtrain/runtime/engine_stats.hpp"
#include "dtrain/profile/profiler.hpp"
#include "dtrain/profile/profiler_state.hpp"
#include "dtrain/profile/run_agreement.hpp"
#include "dtrain/runtime/session.hpp"

namespace dtrain {

// Options and the first problem found with them; problems are raised after the ranks agree, so
// that a bad setting on one rank cannot leave the others waiting.
struct Profiler::Checked {
  ProfilerOptions options;
  std::string problem;
};

DTRAIN_API Profiler::Profiler() : Profiler(options_from_config()) {}

DTRAIN_API Profiler::Profiler(ProfilerOptions options)
    : Profiler(Checked{std::move(options), {}}) {}

DTRAIN_API Profiler::Profiler(Profiler&& other) noexcept
    : state_(std::move(other.state_)), steps_(other.steps_) {}

DTRAIN_API Profiler& Profiler::operator=(Profiler&& other) noexcept {
  if (this != &other) {
    close();
    state_ = std::move(other.state_);
    steps_ = other.steps_;
  }
  return *this;
}

DTRAIN_API Profiler::~Profiler() { close(); }

DTRAIN_API bool Profiler::recording() const noexcept { return state_ && state_->recording; }

DTRAIN_API std::string Profiler::path() const {
  return state_ ? state_->writer->path() : std::string();
}

DTRAIN_API void Profiler::start() {
  if (!state_ || state_->recording) return;
  state_->writer->push(detail::MarkRecord{detail::MarkRecord::Kind::start, state_->now_seconds(),
                                          steps_, 0});
  state_->sampler->start();
  state_->recording = true;
}

DTRAIN_API void Profiler::stop() {
  if (!state_ || !state_->recording) return;
  state_->recording = false;
  state_->sampler->stop();
  state_->writer->push(detail::MarkRecord{detail::MarkRecord::Kind::stop, state_->now_seconds(),
                                          state_->recorded_steps, state_->phases_outside_steps});
}

DTRAIN_API void Profiler::flush() {
  if (state_) state_->writer->flush();
}

DTRAIN_API Profiler::Checked Profiler::options_from_config() {
  Checked c;
  try {
    c.options = profiler_options_from(dtrain::is_initialized() ? dtrain::config()
                                                               : Config::from_env());
  } catch (const InvalidArgumentError& e) {
    c.problem = e.what();
  }
  return c;
}

DTRAIN_API Profiler::Profiler(Checked checked) {
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
  // On disk before training starts: a job killed at any point leaves a file that says whose it
  // is, never an empty one.
  state->writer->flush();
  state->sampler = std::make_unique<detail::SystemSampler>(*state->writer, state->nvml,
                                                           state->options.sample_interval,
                                                           state->origin);
  if (rank == 0)
    detail::log(LogLevel::info,
                "profiling {} rank(s) into {}; report: dtrain-report {} -o report.html", size,
                state->options.dir, state->options.dir);
  state_ = std::move(state);
  if (state_->options.start_recording) start();
}

DTRAIN_API void Profiler::close() noexcept {
  if (!state_) return;
  try {
    stop();
    state_->writer->push(detail::MarkRecord{detail::MarkRecord::Kind::end, state_->now_seconds(),
                                            state_->recorded_steps, 0});
  } catch (...) {  // allocation failure while stopping: the file still ends on whole lines
  }
  state_->sampler.reset();
  state_->writer->close();
  state_.reset();
}

DTRAIN_API std::size_t Profiler::slot_of(std::string_view name) {
  if (name.empty() || name == "other")
    throw InvalidArgumentError(fmt::format(
        "dtrain: Profiler::phase(\"{}\"): a phase needs a name other than \"\" and \"other\" "
        "(\"other\" is the time no phase covered)",
        name));
  return state_ ? state_->times.slot_of(name) : 0;
}

namespace detail {

DTRAIN_API bool enter_phase(ProfilerState& state, std::size_t slot) {
  if (!state.recording) return false;
  if (!state.times.in_step()) {
    ++state.phases_outside_steps;
    return false;
  }
  state.times.enter(slot, ProfilerState::Clock::now());
  return true;
}

DTRAIN_API void exit_phase(ProfilerState& state) noexcept {
  state.times.exit(ProfilerState::Clock::now());
}

DTRAIN_API bool begin_step(ProfilerState& state) {
  if (!state.recording) return false;
  if (state.times.in_step()) return false;  // a step inside a step: the outer one counts
  state.engine_at_step_start = ProfilerState::engine_snapshot();
  state.times.begin_step(ProfilerState::Clock::now());
  return true;
}

DTRAIN_API void end_step(ProfilerState& s, std::int64_t index, std::int64_t samples) noexcept {
  const auto now = ProfilerState::Clock::now();
  try {
    PhaseTimes::Step times = s.times.end_step(now);
    if (!s.recording) return;  // stopped during the step
    StepRecord r;
    r.step = index;
    r.t = s.seconds_since_origin(now - times.total);
    r.duration = times.total;
    r.other = times.other;
    r.phases = std::move(times.phases);
    r.samples = samples;
    if (s.engine_at_step_start)
      if (auto e = ProfilerState::engine_snapshot())
        r.engine = engine_stats_delta(*e, *s.engine_at_step_start);
    s.writer->push(std::move(r));
    ++s.recorded_steps;
  } catch (...) {  // out of memory: lose this step, never throw from a destructor
  }
}

}  // namespace detail
}  // namespace dtrain
