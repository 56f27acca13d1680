#pragma once
// How the engine drives the autotuner (DTRAIN_AUTOTUNE): rank 0 only. The tuner itself is pure
// logic (autotune/tuner.hpp); this is what feeds it steps and turns its decisions into settings.
//
// Note [Autotune steps]
// The engine sees ops, not training steps. A training step submits each of its tensors once, so a
// step ends where a name comes back (Horovod counts steps the same way): the executed responses
// between two such boundaries are one step, its bytes what they reduced, its time the wall time
// between the boundaries. The names of the first step are the job's tensor set, the key of the
// saved result (Note [Saved result key] in autotune/saved_result.hpp).
//
// Note [Applying tuned settings]
// Rank 0 decides. The coordinator's knobs — fusion threshold, cycle time, response cache — shape
// only what rank 0 plans, so rank 0 switches them alone (switching the cache off evicts its
// entries through the ordinary eviction messages). Hierarchical allreduce changes the MPI calls
// every rank makes, the fusion pipeline how each rank packs, and the pieces in flight how many
// pieces each rank posts at once: those travel in the first response message planned under the
// new configuration (ResponseMessage::tuned) and every rank applies them before executing it, so
// all ranks switch at the same message.
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "dtrain/autotune/knobs.hpp"
#include "dtrain/autotune/saved_result.hpp"
#include "dtrain/autotune/search_space.hpp"
#include "dtrain/autotune/tuner.hpp"
#include "dtrain/autotune/tuning_log.hpp"
#include "dtrain/core/config.hpp"
#include "dtrain/core/env.hpp"
#include "dtrain/core/logging.hpp"
#include "dtrain/runtime/negotiation/messages.hpp"
#include "dtrain/runtime/negotiation/op_key.hpp"

namespace dtrain::detail {

class EngineAutotuner {
 public:
  using Clock = std::chrono::steady_clock;

  // `ranks_per_host`: the job's layout, for the saved result's key; more than one host lets the
  // tuner try hierarchical allreduce. `host_over_gloo`: host tensors go over Gloo (Note [Choosing
  // the host library]).
  EngineAutotuner(const Config& config, std::vector<int> ranks_per_host, bool host_over_gloo)
      : config_(config), tuner_(make_space(config, ranks_per_host.size() > 1, host_over_gloo),
                                autotune::tuner_options(config)) {
    job_.world_size = 0;
    for (int n : ranks_per_host) job_.world_size += n;
    job_.ranks_per_host = std::move(ranks_per_host);
    if (!config.autotune_log.empty()) log_ = autotune::TuningLog(config.autotune_log);
    in_effect_ = tuner_.knobs();
    if (tuner_.done()) {
      log(LogLevel::warning, "autotune: every tunable setting is fixed by the user ({}); nothing "
          "to tune", autotune::describe(in_effect_));
      finished_ = true;
    }
  }

  // The knobs in effect now (what rank 0's coordinator and backend run with).
  const autotune::Knobs& knobs() const noexcept { return in_effect_; }
  bool done() const noexcept { return finished_; }

  // One response message rank 0 has executed: `arrival` when it was planned, `bytes` what it
  // reduced here. Returns the knobs to switch to when the configuration changes.
  std::optional<autotune::Knobs> on_executed(const ResponseMessage& msg, std::int64_t bytes,
                                             Clock::time_point arrival) {
    if (finished_) return std::nullopt;
    std::optional<autotune::Knobs> change;
    for (const auto& r : msg.responses) {
      if (r.error != ErrorKind::none || r.kind == OpKind::join || r.kind == OpKind::barrier ||
          r.kind == OpKind::process_set)
        continue;
      for (std::size_t i = 0; i < r.names.size(); ++i) {
        std::string name = display_name(r.process_set, r.names[i]);  // names are per set
        if (step_names_.contains(name)) {
          if (auto c = end_step(arrival)) change = c;
          if (finished_) return change;
        }
        step_names_.emplace(name, autotune::TensorSignature{
                                      name, r.dtype, i < r.numels.size() ? r.numels[i] : 0});
      }
    }
    step_bytes_ += bytes;
    return change;
  }

  // The settings every rank applies with the next response message (Note [Applying tuned
  // settings]).
  TunedSettings settings_for(std::uint64_t generation) const {
    return TunedSettings{generation, in_effect_.fusion_pipeline, in_effect_.hierarchical_allreduce,
                         in_effect_.pieces_in_flight};
  }

  std::uint64_t generation() const noexcept { return generation_; }

 private:
  static autotune::SearchSpace make_space(const Config& config, bool multi_host,
                                          bool host_over_gloo) {
    autotune::SearchSpaceOptions o;
    o.base = autotune::knobs_from_config(config);
    o.fixed = autotune::knobs_set_by_user(config, ProcessEnv{});
    // Pieces in flight and the host hierarchy shape MPI's host reductions only (Note [Search
    // space]); the host backend ignores them over Gloo.
    if (host_over_gloo) {
      o.fixed.insert(autotune::Knob::pieces_in_flight);
      o.fixed.insert(autotune::Knob::hierarchical_allreduce);
    }
    o.multi_host = multi_host;
    return autotune::SearchSpace(o);
  }

  std::optional<autotune::Knobs> end_step(Clock::time_point now) {
    std::optional<autotune::Knobs> change;
    if (!tensor_set_known_) {
      // The first step: the job's tensors are known, and with them the saved result's key.
      tensor_set_known_ = true;
      std::vector<autotune::TensorSignature> tensors;
      for (auto& [name, t] : step_names_) tensors.push_back(t);
      job_.tensor_set = autotune::tensor_set_hash(std::move(tensors));
      if (!config_.autotune_cache.empty()) {
        if (auto saved = autotune::reuse_saved_result(config_.autotune_cache, job_, tuner_.space())) {
          autotune::TuningRecord row;
          row.kind = autotune::RecordKind::reused;
          row.knobs = saved->knobs;
          row.score_bytes_per_second = saved->score_bytes_per_second;
          log_.write(row);
          finished_ = true;
          return switch_to(saved->knobs);
        }
      }
    } else if (step_bytes_ > 0) {
      const double seconds = std::chrono::duration<double>(now - step_start_).count();
      if (seconds > 0) {
        const bool changed = tuner_.record_step({step_bytes_, seconds, generation_at_step_start_});
        for (; logged_ < tuner_.history().size(); ++logged_) log_.write(tuner_.history()[logged_]);
        if (changed) change = switch_to(tuner_.knobs());
        if (tuner_.done()) finish();
      }
    }
    step_names_.clear();
    step_bytes_ = 0;
    step_start_ = now;
    generation_at_step_start_ = tuner_.generation();
    return change;
  }

  std::optional<autotune::Knobs> switch_to(const autotune::Knobs& k) {
    if (k == in_effect_) return std::nullopt;
    in_effect_ = k;
    ++generation_;
    return k;
  }

  void finish() {
    finished_ = true;
    const auto& best = tuner_.best();
    if (!best) return;
    log(LogLevel::info, "autotune: done after {} configurations; keeping {} ({:.4g} MB/s)",
        tuner_.configurations_measured(), autotune::describe(best->knobs),
        best->score_bytes_per_second / 1e6);
    if (!config_.autotune_cache.empty())
      autotune::save_result(config_.autotune_cache, job_, tuner_.space(),
                            {best->knobs, best->score_bytes_per_second});
  }

  Config config_;
  autotune::Tuner tuner_;
  autotune::JobIdentity job_;
  autotune::TuningLog log_;
  std::size_t logged_ = 0;
  autotune::Knobs in_effect_;
  std::uint64_t generation_ = 0;  // of the settings sent to the ranks; 0: the initial ones
  bool finished_ = false;
  bool tensor_set_known_ = false;
  std::unordered_map<std::string, autotune::TensorSignature> step_names_;
  std::int64_t step_bytes_ = 0;
  Clock::time_point step_start_{};
  std::uint64_t generation_at_step_start_ = 0;
};

}  // namespace dtrain::detail
