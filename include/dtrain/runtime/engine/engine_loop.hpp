#pragma once
// The engine thread (runtime/engine/engine.hpp): its loop, which sends this rank's new ops to the
// coordinator, lets rank 0's coordinator plan, and applies the coordinator's responses in order;
// the autotuner's hook; and the wait between rounds (Note [Waiting without burning cores] in
// runtime/engine/wait_policy.hpp).
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dtrain/runtime/engine/engine.hpp"

namespace dtrain::detail {

inline void Engine::run() {
  lower_timer_slack();  // Note [Waiting without burning cores]
  try {
    loop();
  } catch (const std::exception& ex) {
    fail_everything(fmt::format("dtrain: the engine on rank {} failed: {}", rank_, ex.what()));
  }
  channel_->drain();
  cpu_clock_.thread_ends();  // Note [Engine CPU time]
  std::vector<std::shared_ptr<Entry>> leftovers;
  std::string why;
  {
    std::lock_guard lock(mutex_);
    why = fatal_.empty() ? fmt::format("dtrain: rank {} shut down while the op was in flight", rank_)
                         : fatal_;
    leftovers = table_.drain();
    thread_exited_ = true;
  }
  cv_.notify_all();
  for (auto& e : leftovers) e->state->complete(std::make_exception_ptr(ShutdownError(why)));
}



inline void Engine::loop() {
  auto last_progress = Clock::now();
  while (true) {
    std::vector<std::shared_ptr<Entry>> fresh;
    bool send_shutdown = false;
    std::string ending;
    {
      std::lock_guard lock(mutex_);
      if (abandon_) return;
      fresh = table_.take_queued();
      if (shutdown_requested_ && !shutdown_sent_) send_shutdown = shutdown_sent_ = true;
      ending.swap(job_ending_);
    }
    bool progressed = false;
    if (!fresh.empty() || send_shutdown || !ending.empty()) {
      send_requests(fresh, send_shutdown, std::move(ending));
      progressed = true;
    }
    if (coordinator_) {
      progressed |= receive_requests();
      if (auto msg = coordinator_->poll(Clock::now())) {
        if (pending_tuned_) msg->tuned = *std::exchange(pending_tuned_, std::nullopt);
        publish_coordinator_stats();
        const auto planned = Clock::now();
        timeline_.cycle_mark(planned);
        channel_->send_response(*msg, size_);
        const auto reduced_before = counters_.get(Counter::bytes_reduced);
        if (apply(*msg)) return;
        if (autotuner_)
          tune(*msg, counters_.get(Counter::bytes_reduced) - reduced_before, planned);
        progressed = true;
      }
    } else if (auto msg = channel_->receive_response()) {
      if (apply(*msg)) return;
      progressed = true;
    }
    channel_->progress();
    const auto now = Clock::now();
    if (progressed) {
      last_progress = now;
      continue;
    }
    wait_for_work(now - last_progress);
  }
}

inline bool Engine::awaiting_peers() {
  std::lock_guard lock(mutex_);
  return table_.awaiting() || shutdown_sent_ || channel_->sending() ||
         (coordinator_ && coordinator_->has_pending());
}

inline void Engine::wait_for_work(Clock::duration idle_for) {
  const bool awaiting = awaiting_peers();
  Clock::duration limit = wait_policy_.sleep_for(awaiting, idle_for);
  if (limit == Clock::duration::zero()) return;  // hot poll: a peer in step answers soon
  if (coordinator_)
    if (auto d = coordinator_->next_deadline())
      limit = std::min(limit, std::max<Clock::duration>(*d - Clock::now(), Clock::duration::zero()));
  std::unique_lock lock(mutex_);
  auto wake = [&] {
    return table_.has_queued() || abandon_ || (shutdown_requested_ && !shutdown_sent_) ||
           !job_ending_.empty();
  };
  if (!awaiting && !coordinator_) {
    cv_.wait(lock, wake);  // nothing in flight: nothing can arrive for this rank
  } else {
    cv_.wait_for(lock, limit, wake);
  }
}

inline void Engine::send_requests(const std::vector<std::shared_ptr<Entry>>& fresh, bool shutdown,
                   std::string ending) {
  RequestMessage m;
  m.rank = rank_;
  m.responses_applied = responses_applied_;
  m.shutdown = shutdown;
  m.fatal = std::move(ending);
  for (const auto& e : fresh) {
    const Request& q = e->request;
    if (auto id = mirror_.id_for(q)) {
      m.cached.push_back(*id);
      counters_.add(Counter::cache_ids_sent);
    } else {
      m.requests.push_back(q);
    }
    counters_.add(Counter::requests_sent);
  }
  if (coordinator_) {
    coordinator_->on_message(m, Clock::now());
  } else {
    channel_->send_request(m);
  }
}

inline bool Engine::receive_requests() {
  bool any = false;
  while (auto m = channel_->receive_request()) {
    coordinator_->on_message(*m, Clock::now());
    any = true;
  }
  return any;
}

// Rank 0: feeds the autotuner one executed message; a new configuration takes effect in the
// coordinator at once and on every rank with the next message (Note [Applying tuned settings]).
inline void Engine::tune(const ResponseMessage& msg, std::uint64_t bytes, Clock::time_point planned) {
  const auto knobs = autotuner_->on_executed(msg, static_cast<std::int64_t>(bytes), planned);
  if (!knobs) return;
  const Config tuned = autotune::apply_knobs(config_, *knobs);
  coordinator_->retune(tuned.fusion_threshold_bytes, tuned.cycle_time_ms, tuned.cache_capacity);
  pending_tuned_ = autotuner_->settings_for(autotuner_->generation());
  log(LogLevel::debug, "autotune: switching to {}", autotune::describe(*knobs));
}

// Applies one message from the coordinator. Returns true when the engine must stop.
inline bool Engine::apply(const ResponseMessage& msg) {
  const auto arrival = Clock::now();
  responses_applied_ = msg.seq;
  if (msg.tuned.generation != 0) executor_->retune(msg.tuned);
  for (const auto& ins : msg.cache_inserts) {
    std::lock_guard lock(mutex_);
    const Entry* e = table_.find(OpKey{ins.process_set, ins.name});
    if (!e) continue;  // a rank that joined, or is not in the set, has nothing to remember
    mirror_.insert(ins.id, e->request);
  }
  for (auto id : msg.cache_evictions) mirror_.evict(id);
  if (!msg.fatal.empty()) {
    fail_everything(msg.fatal);
    settle_after_job_failure(*channel_, rank_, size_, coordinator_.has_value());
    return true;
  }
  for (const auto& r : msg.responses) {
    if (log_enabled(LogLevel::debug)) log_response(rank_, r);
    executor_->execute(r, arrival);
  }
  return msg.shutdown_complete;
}

// The coordinator's counters (rank 0), after each message it plans.
inline void Engine::publish_coordinator_stats() {
  const CoordinatorStats c = coordinator_->stats();
  counters_.set(Counter::responses, c.responses);
  counters_.set(Counter::fused_tensors, c.fused_tensors);
  counters_.set(Counter::cache_hits, c.cache_hits);
  counters_.set(Counter::stall_warnings, c.stall_warnings);
  counters_.set(Counter::wait_for_slowest_ns, c.wait_for_slowest_ns);
}

}  // namespace dtrain::detail
