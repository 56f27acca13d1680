#pragma once
// Note [Negotiation]
// Every rank's engine sends the coordinator (rank 0) a RequestMessage whenever its user threads
// submit ops. The coordinator keeps a table of pending ops by name, recording which ranks have
// submitted each one. An op becomes ready when every rank that has not joined has submitted it;
// its metadata is then checked across ranks (a disagreement becomes an error response naming the
// field and the ranks), and ready ops are fused into responses. The coordinator sends one ordered
// ResponseMessage to every rank and all ranks execute it in that order, so ranks may submit in
// any order without deadlock. Nothing is exchanged while no op is pending: an idle job sends no
// messages and no thread polls.
//
// Note [Batching]
// A ready op is emitted at once unless other ops are partially submitted (a burst is under way):
// then the coordinator waits up to the cycle time for them so they fuse into the same response.
// An op that arrives at an idle engine is never delayed by the cycle time.
//
// Note [Process sets]
// A process set is a subset of the world's ranks that runs collectives of its own (Horovod's
// process sets). "Every rank" above then means every member: the coordinator negotiates each
// set on its own (runtime/negotiation/set_coordinator.hpp), with a pending table, groups, failed-op
// verdicts, a join, a stall inspector and a batch of ready ops of its own, so ops of different sets
// never wait for each other's ranks, never fuse together, and may use the same names. What the sets
// share is the coordinator itself and its one ordered response stream: each poll gathers every
// set's responses into the one message every rank receives, and each rank runs, in that order,
// the responses of the sets it belongs to and skips the others without touching MPI.
//
// That single order is why two sets, disjoint or overlapping, cannot deadlock, however their
// ops are submitted. A rank blocks in a collective only on members of the same set, and they run
// that set's responses in the same order it does. A wait-for cycle between ranks would need two
// of them to run two responses in opposite orders: rank a inside response X (of set A) waiting
// for rank b, while b is inside response Y (of set B) waiting for a. Then both are members of
// both sets, and both run X and Y in the message order, which is one order for everyone. Disjoint
// sets share no rank, so their collectives run at the same time on their own communicators;
// overlapping sets take their turns on the ranks they share.
//
// A set is created by add_process_set(), itself an op of the world: every rank submits it with
// the same rank list, the world negotiates it like any op, and the coordinator numbers the set
// when it plans the response (set 0 is the world). Every rank runs that response at the same
// place in its stream, creating the set's communicators there
// (runtime/execution/response_executor.hpp), so a set exists on every rank from the same point of
// the order on, with no protocol of its own and at any time after init(). A set costs nothing while
// idle: the coordinator only looks at sets with something pending, and an idle job still sends no
// message.
//
// This header holds the sets and the poll loop; each step a set takes has a header of its own:
// validation across ranks (Note [Validation across ranks] in
// runtime/negotiation/cross_rank_validation.hpp), the fusion planner (Note [Fusion planning] in
// runtime/negotiation/fusion_planner.hpp), failed-op verdicts and group sizes (Note [Failed ops] in
// runtime/negotiation/failed_ops.hpp), the join (Note [Join] in
// runtime/negotiation/join_tracker.hpp), the cache side of Note [Response cache]
// (runtime/negotiation/response_cache.hpp) and the stall inspector, which says when ops have waited
// too long (Note [Stall inspection] in runtime/negotiation/stall_inspector.hpp).
#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dtrain/core/error.hpp"
#include "dtrain/runtime/negotiation/coordinator_options.hpp"
#include "dtrain/runtime/negotiation/messages.hpp"
#include "dtrain/runtime/negotiation/response_cache.hpp"
#include "dtrain/runtime/negotiation/set_coordinator.hpp"
#include "dtrain/runtime/negotiation/set_members.hpp"

namespace dtrain::detail {

class Coordinator {
 public:
  explicit Coordinator(CoordinatorOptions o, CoordinatorHooks hooks = {})
      : options_(o), hooks_(std::move(hooks)), shut_down_(o.size, false), applied_(o.size, 0),
        cache_(o.cache_capacity) {
    sets_.try_emplace(0, SetMembers::world(o.size), shared());
  }
  // The sets point at this object's members.
  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;

  void on_message(const RequestMessage& m, Clock::time_point now) {
    const int r = m.rank;
    if (!m.fatal.empty() && job_ending_.empty()) job_ending_ = m.fatal;
    applied_[r] = std::max(applied_[r], m.responses_applied);
    if (!m.cached.empty() || !m.requests.empty())
      for (auto& [id, set] : sets_)
        if (set.members().contains(r)) set.heard_from(r, now);
    for (auto id : m.cached) {
      Request q = cache_.resolve(id);
      ++stats_.cache_hits;
      route(r, std::move(q), now);
    }
    for (const auto& q : m.requests) route(r, q, now);
    // A rank submits a whole group in one message (Note [Failed ops]).
    for (auto& [id, set] : sets_) set.message_read();
    if (m.shutdown && !shut_down_[r]) {
      shut_down_[r] = true;
      ++shut_down_count_;
      for (auto& [id, set] : sets_)
        if (set.members().contains(r)) set.rank_shut_down(r);
    }
    cache_.retire(applied_);
  }

  // The autotuner's batching knobs, in effect from the next poll(): how much to fuse, how long to
  // wait for a batch, how many responses to cache (0: none; evictions go out in the next message).
  void retune(std::int64_t fusion_threshold_bytes, double cycle_time_ms,
              std::int64_t cache_capacity) {
    options_.fusion_threshold_bytes = fusion_threshold_bytes;
    options_.cycle_time_ms = cycle_time_ms;
    if (cache_capacity != options_.cache_capacity) {
      options_.cache_capacity = cache_capacity;
      pending_cache_capacity_ = cache_capacity;
    }
  }

  // The next message to send to every rank, if one is due at `now`: every set's responses, the
  // world's first, then the others by id (Note [Process sets]).
  std::optional<ResponseMessage> poll(Clock::time_point now) {
    ResponseMessage msg;
    if (pending_cache_capacity_) {
      cache_.set_capacity(*pending_cache_capacity_, msg, next_seq_);
      pending_cache_capacity_.reset();
    }
    if (!job_ending_.empty() && !job_end_announced_) {
      msg.fatal = job_ending_;
      job_end_announced_ = true;
      return finish(std::move(msg));
    }
    for (auto& [id, set] : sets_) {
      set.check_stalls(now, msg);
      if (!msg.fatal.empty()) return finish(std::move(msg));
    }
    for (auto& [id, set] : sets_) set.poll_into(now, msg, next_seq_);
    for (Response& s : msg.responses)
      if (s.kind == OpKind::process_set && s.error == ErrorKind::none) create_set(s);
    if (shut_down_count_ == options_.size && !shutdown_announced_) {
      msg.shutdown_complete = true;
      shutdown_announced_ = true;
    }
    if (msg.responses.empty() && !msg.shutdown_complete && msg.cache_evictions.empty())
      return std::nullopt;
    return finish(std::move(msg));
  }

  // When poll() has something time-driven to do (a batching window closing, a stall check, a
  // timeout).
  std::optional<Clock::time_point> next_deadline() const {
    std::optional<Clock::time_point> t;
    for (const auto& [id, set] : sets_)
      if (const auto d = set.next_deadline(); d && (!t || *d < *t)) t = d;
    return t;
  }

  bool has_pending() const noexcept {
    return std::any_of(sets_.begin(), sets_.end(),
                       [](const auto& kv) { return kv.second.has_pending(); });
  }
  const CoordinatorStats& stats() const noexcept { return stats_; }
  std::size_t cache_size() const noexcept { return cache_.size(); }
  // Verdicts still waiting for ranks that have not submitted the name (Note [Failed ops]).
  std::size_t failed_remembered() const noexcept {
    std::size_t n = 0;
    for (const auto& [id, set] : sets_) n += set.failed_remembered();
    return n;
  }
  // Process sets, the world included.
  std::size_t process_sets() const noexcept { return sets_.size(); }

  // The ranks could not make set `id`'s communicators (Note [Communicator limit] in
  // runtime/execution/response_executor.hpp): it does not exist, and a set of its ranks may be
  // asked for again. Nothing was submitted to it: no rank had it.
  void forget_set(std::int32_t id) {
    if (id != 0) sets_.erase(id);
  }

  // Human-readable list of what is pending and who is missing (stall warnings, shutdown errors).
  std::string pending_report(Clock::time_point now, std::size_t max_items = 20) const {
    std::string out;
    for (const auto& [id, set] : sets_) out += set.pending_report(now, max_items);
    return out;
  }

 private:
  SharedNegotiation shared() {
    return SharedNegotiation{&options_, &hooks_, &stats_, &cache_, &shut_down_};
  }

  void route(int r, Request q, Clock::time_point now) {
    ++stats_.requests;
    auto it = sets_.find(q.process_set);
    // A rank submits to a set only once it has run the response that created it, which the
    // coordinator planned before that, and only as a member (Note [Process sets]).
    if (it == sets_.end() || !it->second.members().contains(r))
      throw Error(fmt::format("dtrain: internal error: rank {} submitted {} '{}' to process set "
                              "{}, which {}",
                              r, q.kind, q.name, q.process_set,
                              it == sets_.end() ? "does not exist" : "it is not a member of"));
    it->second.add_request(r, std::move(q), now);
  }

  // Numbers the set that `s` (a successful add_process_set) creates, or fails it when a set of
  // the same ranks exists.
  void create_set(Response& s) {
    for (const auto& [id, set] : sets_) {
      if (set.members().ranks() != s.set_ranks) continue;
      s.error = ErrorKind::invalid_argument;
      s.error_message = fmt::format(
          "dtrain: add_process_set '{}': process set {} has the same ranks [{}]{}; use that one "
          "(a set of given ranks exists once)",
          s.names.front(), id, fmt::join(s.set_ranks, ", "), id == 0 ? " (the world)" : "");
      --stats_.responses;
      return;
    }
    s.process_set = next_set_id_++;
    sets_.try_emplace(s.process_set, SetMembers(s.process_set, options_.size, s.set_ranks),
                      shared());
  }

  ResponseMessage finish(ResponseMessage msg) {
    msg.seq = next_seq_++;
    return msg;
  }

  CoordinatorOptions options_;
  CoordinatorHooks hooks_;
  CoordinatorStats stats_;
  std::vector<bool> shut_down_;
  int shut_down_count_ = 0;
  bool shutdown_announced_ = false;
  std::string job_ending_;  // a rank ended the job (RequestMessage::fatal)
  bool job_end_announced_ = false;
  std::vector<std::uint64_t> applied_;
  ResponseCache cache_;
  std::optional<std::int64_t> pending_cache_capacity_;
  std::map<std::int32_t, SetCoordinator> sets_;  // by id; 0 is the world
  std::int32_t next_set_id_ = 1;
  std::uint64_t next_seq_ = 1;
};

}  // namespace dtrain::detail
