#pragma once
// Definitions of profile/profiler.hpp (Note [Build modes] in core/build_mode.hpp).
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "dtrain/core/config.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/logging.hpp"
#include "dtrain/profile/active_profile.hpp"
#include "dtrain/profile/open_recording.hpp"
#include "dtrain/profile/profiler.hpp"
#include "dtrain/profile/profiler_state.hpp"
#include "dtrain/profile/run_agreement.hpp"
#include "dtrain/runtime/collectives.hpp"
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
    : state_(std::move(other.state_)),
      attached_(std::exchange(other.attached_, false)),
      steps_(other.steps_) {}

DTRAIN_API Profiler& Profiler::operator=(Profiler&& other) noexcept {
  if (this != &other) {
    close();
    state_ = std::move(other.state_);
    attached_ = std::exchange(other.attached_, false);
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
  if (!state_) return;
  // The index the next recorded step will have (Note [Implicit steps]).
  const std::int64_t next = state_->explicit_steps ? steps_ + state_->explicit_step_offset
                                                   : state_->next_implicit_step;
  detail::start_recording(*state_, next);
}

DTRAIN_API void Profiler::stop() {
  if (state_) detail::stop_recording(*state_);
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
  if (auto job = detail::job_profile()) {
    attach(std::move(job), std::move(checked));
    return;
  }
  detail::ProfilePlace place;
  place.distributed = dtrain::is_initialized();
  if (place.distributed) {
    place.rank = dtrain::rank();
    place.size = dtrain::size();
    place.local_rank = dtrain::local_rank();
    place.local_size = dtrain::local_size();
    place.host_id = dtrain::config().host_id;
    place.allgather = [](const std::vector<std::int64_t>& mine) {
      return dtrain::allgather(
          mine, fmt::format("dtrain.profiler.{}", detail::profiler_agreement_count()));
    };
  }
  state_ = detail::open_recording(std::move(checked.options), std::move(checked.problem), place);
  if (!state_) return;
  state_->training_thread = std::this_thread::get_id();
  detail::activate_own_profile(state_);
}

// Note [Zero-code profiling]: local, since every rank has the job's profile.
DTRAIN_API void Profiler::attach(std::shared_ptr<detail::ProfilerState> job, Checked checked) {
  if (!checked.problem.empty()) throw InvalidArgumentError(checked.problem);
  checked.options.validate();
  namespace fs = std::filesystem;
  std::error_code ec;
  const std::string& dir = checked.options.dir;
  if (!dir.empty() && dir != job->options.dir && !fs::equivalent(dir, job->options.dir, ec) &&
      dtrain::is_initialized() && dtrain::rank() == 0)
    detail::log(LogLevel::warning,
                "dtrain: this Profiler's folder '{}' is not used: the job is profiled into '{}' "
                "(DTRAIN_PROFILE), and the Profiler's steps and phases go there",
                dir, job->options.dir);
  job->training_thread = std::this_thread::get_id();
  state_ = std::move(job);
  attached_ = true;
  if (!checked.options.start_recording) stop();
}

DTRAIN_API void Profiler::close() noexcept {
  if (!state_) return;
  if (!attached_) {
    detail::deactivate_own_profile(state_.get());
    detail::close_recording(*state_);
  }
  state_.reset();
  attached_ = false;
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
  if (!state.explicit_steps) {
    // Note [Implicit steps]: from the program's first step on, its steps are the only ones.
    state.explicit_steps = true;
    state.explicit_step_offset = state.next_implicit_step;
    if (state.times.in_step()) (void)state.times.end_step(ProfilerState::Clock::now());
  }
  if (!state.recording) return false;
  if (state.times.in_step()) return false;  // a step inside a step: the outer one counts
  state.engine_at_step_start = engine_snapshot();
  state.times.begin_step(ProfilerState::Clock::now());
  return true;
}

DTRAIN_API void end_step(ProfilerState& s, std::int64_t index, std::int64_t samples) noexcept {
  const auto now = ProfilerState::Clock::now();
  try {
    PhaseTimes::Step times = s.times.end_step(now);
    if (!s.recording) return;  // stopped during the step
    record_step(s, std::move(times), now, index + s.explicit_step_offset, samples,
                engine_snapshot());
  } catch (...) {  // out of memory: lose this step, never throw from a destructor
  }
}

}  // namespace detail
}  // namespace dtrain
