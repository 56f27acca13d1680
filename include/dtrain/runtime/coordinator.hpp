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
// This header holds the pending table and the poll loop; each step it takes has a header of its
// own: validation across ranks (Note [Validation across ranks] in
// runtime/cross_rank_validation.hpp), the fusion planner (Note [Fusion planning] in
// runtime/fusion_planner.hpp), failed-op verdicts and group sizes (Note [Failed ops] in
// runtime/failed_ops.hpp), the join (Note [Join] in runtime/join_tracker.hpp), the cache side of
// Note [Response cache] (runtime/response_cache.hpp) and the stall inspector, which says when ops
// have waited too long (Note [Stall inspection] in runtime/stall_inspector.hpp).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dtrain/runtime/coordinator_options.hpp"
#include "dtrain/runtime/cross_rank_validation.hpp"
#include "dtrain/runtime/failed_ops.hpp"
#include "dtrain/runtime/fusion_planner.hpp"
#include "dtrain/runtime/join_tracker.hpp"
#include "dtrain/runtime/messages.hpp"
#include "dtrain/runtime/ready_op.hpp"
#include "dtrain/runtime/response_cache.hpp"
#include "dtrain/runtime/stall_inspector.hpp"

namespace dtrain::detail {

class Coordinator {
 public:
  explicit Coordinator(CoordinatorOptions o, CoordinatorHooks hooks = {})
      : opt_(o), hooks_(std::move(hooks)), failed_(o.size), join_(o.size, o.op_timeout_seconds),
        shut_down_(o.size, false), applied_(o.size, 0), cache_(o.cache_capacity),
        stall_(StallOptions{o.stall_check_disable, o.stall_check_time_seconds,
                            o.stall_shutdown_time_seconds}) {}

  void on_message(const RequestMessage& m, Clock::time_point now) {
    const int r = m.rank;
    if (!m.fatal.empty() && job_ending_.empty()) job_ending_ = m.fatal;
    applied_[r] = std::max(applied_[r], m.responses_applied);
    if (!m.cached.empty() || !m.requests.empty()) join_.heard_from(r, now);
    for (auto id : m.cached) {
      Request q = cache_.resolve(id);
      ++stats_.cache_hits;
      add_request(r, std::move(q), now);
    }
    for (const auto& q : m.requests) add_request(r, q, now);
    failed_.message_read();  // a rank submits a whole group in one message (Note [Failed ops])
    if (m.shutdown && !shut_down_[r]) {
      shut_down_[r] = true;
      ++shut_down_count_;
      failed_.rank_shut_down(r);
    }
    cache_.retire(applied_);
  }

  // The autotuner's batching knobs, in effect from the next poll(): how much to fuse, how long to
  // wait for a batch, how many responses to cache (0: none; evictions go out in the next message).
  void retune(std::int64_t fusion_threshold_bytes, double cycle_time_ms,
              std::int64_t cache_capacity) {
    opt_.fusion_threshold_bytes = fusion_threshold_bytes;
    opt_.cycle_time_ms = cycle_time_ms;
    if (cache_capacity != opt_.cache_capacity) {
      opt_.cache_capacity = cache_capacity;
      pending_cache_capacity_ = cache_capacity;
    }
  }

  // The next message to send to every rank, if one is due at `now`.
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
    check_stalls(now, msg);
    if (!msg.fatal.empty()) return finish(std::move(msg));
    fail_ops_waiting_for_shut_down_ranks(now);
    time_out_ops(now);
    if (!ready_.empty() && due(now)) plan(msg);
    if (auto join = join_.conclude(now, shut_down_)) msg.responses.push_back(std::move(*join));
    if (shut_down_count_ == opt_.size && !shutdown_announced_) {
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
    auto earliest = [&](Clock::time_point c) { if (!t || c < *t) t = c; };
    if (!ready_.empty()) earliest(first_ready_ + cycle());
    if (const auto oldest = oldest_wait())
      if (const auto d = stall_.next_deadline(*oldest)) earliest(*d);
    if (opt_.op_timeout_seconds > 0)
      for (const auto& [name, p] : table_) earliest(p.first_seen + op_timeout());
    if (const auto d = join_.timeout_deadline()) earliest(*d);
    return t;
  }

  bool has_pending() const noexcept {
    return !table_.empty() || !ready_.empty() || join_.active();
  }
  const CoordinatorStats& stats() const noexcept { return stats_; }
  std::size_t cache_size() const noexcept { return cache_.size(); }
  // Verdicts still waiting for ranks that have not submitted the name (Note [Failed ops]).
  std::size_t failed_remembered() const noexcept { return failed_.remembered(); }

  // Human-readable list of what is pending and who is missing (stall warnings, shutdown errors).
  std::string pending_report(Clock::time_point now, std::size_t max_items = 20) const {
    std::vector<const std::pair<const std::string, Pending>*> items;
    for (const auto& kv : table_) items.push_back(&kv);
    std::sort(items.begin(), items.end(),
              [](auto* a, auto* b) { return a->second.first_seen < b->second.first_seen; });
    std::string out = join_.describe(now);
    std::size_t shown = 0;
    for (auto* kv : items) {
      if (shown++ == max_items) {
        out += fmt::format("\n  ... and {} more", items.size() - max_items);
        break;
      }
      const auto& p = kv->second;
      out += fmt::format("\n  {} '{}': submitted by ranks [{}], missing on ranks [{}], waiting "
                         "{:.1f} s",
                         p.kind, kv->first, fmt::join(submitting_ranks(p.per_rank), ", "),
                         fmt::join(absent_ranks(p.per_rank), ", "), seconds(now - p.first_seen));
    }
    return out;
  }

 private:
  struct Pending {
    OpKind kind = OpKind::allreduce;
    PerRankRequests per_rank;
    int submitted = 0;
    Clock::time_point first_seen;
  };

  static double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }
  Clock::duration cycle() const {
    return std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double, std::milli>(opt_.cycle_time_ms));
  }
  Clock::duration op_timeout() const {
    return std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double>(opt_.op_timeout_seconds));
  }

  void add_request(int r, Request q, Clock::time_point now) {
    ++stats_.requests;
    if (q.kind == OpKind::join) {
      add_join(r, now);
      return;
    }
    if (auto verdict = failed_.verdict_for(r, q)) {
      push_error(q, *verdict, {r}, now);
      return;
    }
    if (!q.rejected.empty()) {
      fail_arriving(r, q, rejected_verdict(r, q), now);
      return;
    }
    if (!q.group.empty()) {
      if (auto mismatch = failed_.group_size_mismatch(r, q)) {
        fail_group(q.group, {ErrorKind::mismatch, std::move(*mismatch)}, r, &q, now);
        return;
      }
    }
    auto [it, inserted] = table_.try_emplace(q.name);
    Pending& p = it->second;
    if (inserted) {
      p.kind = q.kind;
      p.per_rank.resize(opt_.size);
      p.first_seen = now;
    }
    if (hooks_.rank_ready) hooks_.rank_ready(q.name, r, now);
    if (!p.per_rank[r]) ++p.submitted;
    p.per_rank[r] = std::move(q);
    if (is_ready(p)) make_ready(it->first, now);
  }

  void add_join(int r, Clock::time_point now) {
    join_.join(r, now);
    // Ops that were waiting only for this rank may now be ready.
    std::vector<std::string> now_ready;
    for (auto& [name, p] : table_)
      if (is_ready(p)) now_ready.push_back(name);
    for (auto& name : now_ready) make_ready(name, now);
  }

  bool is_ready(const Pending& p) const {
    for (int r = 0; r < opt_.size; ++r)
      if (!p.per_rank[r] && !join_.has_joined(r)) return false;
    return p.submitted > 0;
  }

  void make_ready(const std::string& name, Clock::time_point now) {
    auto node = table_.extract(name);
    Pending& p = node.mapped();
    if (hooks_.negotiated) hooks_.negotiated(name, p.kind, p.first_seen, now);
    stats_.wait_for_slowest_ns += static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(now - p.first_seen).count());
    ReadyOp ready = validate_across_ranks(name, p.per_rank);
    const std::string group = ready.request.group;
    if (!group.empty()) {
      auto& members = groups_[group];
      members.push_back(std::move(ready));
      if (static_cast<std::int32_t>(members.size()) < members.front().request.group_size) return;
      for (auto& m : members) push_ready(std::move(m), now);
      groups_.erase(group);
      failed_.group_complete(group);
      return;
    }
    push_ready(std::move(ready), now);
  }

  void push_ready(ReadyOp op, Clock::time_point now) {
    if (ready_.empty()) first_ready_ = now;
    ready_bytes_ += op.bytes();
    ready_.push_back(std::move(op));
  }

  void push_error(const Request& q, const Verdict& verdict, std::vector<std::int32_t> ranks,
                  Clock::time_point now) {
    push_ready(ReadyOp::failure(q, verdict, std::move(ranks)), now);
  }

  // Fails every member of `group` on every rank (Note [Failed ops]). `arriving` (from rank r,
  // whose message is still being read) is a member not in the table yet; r is -1 when nothing is
  // arriving.
  void fail_group(const std::string& group, const Verdict& verdict, int r,
                  const Request* arriving, Clock::time_point now) {
    failed_.fail_group(group, verdict, r, shut_down_);
    std::vector<std::string> names;
    for (const auto& [name, p] : table_)
      if (first_submission(p.per_rank).group == group) names.push_back(name);
    for (const auto& name : names) {
      auto node = table_.extract(name);
      const PerRankRequests& per_rank = node.mapped().per_rank;
      auto ranks = submitting_ranks(per_rank);
      if (arriving && arriving->name == name) ranks.push_back(r);
      push_error(first_submission(per_rank), verdict, std::move(ranks), now);
    }
    bool arriving_ready = false;
    if (auto g = groups_.find(group); g != groups_.end()) {
      for (auto& member : g->second) {
        push_error(member.request, verdict, {}, now);  // ready: every rank has it
        arriving_ready |= arriving && arriving->name == member.request.name;
      }
      groups_.erase(g);
    }
    const bool arriving_seen =
        arriving && (arriving_ready || std::ranges::find(names, arriving->name) != names.end());
    if (arriving && !arriving_seen) push_error(*arriving, verdict, {r}, now);
  }

  // Fails op `q.name`, which rank r has just submitted, on every rank that submitted it or will.
  void fail_arriving(int r, const Request& q, const Verdict& verdict, Clock::time_point now) {
    if (!q.group.empty()) {
      fail_group(q.group, verdict, r, &q, now);
      return;
    }
    std::vector<std::int32_t> ranks;
    if (auto it = table_.find(q.name); it != table_.end()) {
      ranks = submitting_ranks(it->second.per_rank);
      table_.erase(it);
    }
    ranks.push_back(r);
    failed_.fail_name(q.name, verdict, ranks, shut_down_);
    push_error(q, verdict, std::move(ranks), now);
  }

  // Fails a pending op on every rank that submitted it or will.
  void fail_pending(const std::string& name, const Verdict& verdict, Clock::time_point now) {
    auto it = table_.find(name);
    if (it == table_.end()) return;  // failed with its group
    const Request q = first_submission(it->second.per_rank);
    if (!q.group.empty()) {
      fail_group(q.group, verdict, -1, nullptr, now);
      return;
    }
    auto ranks = submitting_ranks(it->second.per_rank);
    table_.erase(it);
    failed_.fail_name(name, verdict, ranks, shut_down_);
    push_error(q, verdict, std::move(ranks), now);
  }

  // Fails every pending op on which `verdict_on(name, pending)` gives a verdict, and with it.
  template <class VerdictOn>
  void fail_pending_where(VerdictOn&& verdict_on, Clock::time_point now) {
    std::vector<std::pair<std::string, Verdict>> doomed;
    for (const auto& [name, p] : table_)
      if (std::optional<Verdict> v = verdict_on(name, p)) doomed.emplace_back(name, std::move(*v));
    for (const auto& [name, verdict] : doomed) fail_pending(name, verdict, now);
  }

  // Whether the ready ops go out now (Note [Batching]).
  bool due(Clock::time_point now) const {
    if (opt_.cycle_time_ms <= 0) return true;
    if (opt_.fusion_threshold_bytes > 0 && ready_bytes_ >= opt_.fusion_threshold_bytes) return true;
    bool burst_under_way = !groups_.empty();
    for (const auto& [name, p] : table_) burst_under_way |= p.submitted > 0;
    return !burst_under_way || now - first_ready_ >= cycle();
  }

  // Turns the ready ops into responses (Note [Fusion planning]) and caches those that succeed.
  void plan(ResponseMessage& msg) {
    for (const ReadyOp& op : ready_)
      if (!op.failed()) cache_.note_success(op.request, msg, next_seq_);
    for (Response& s : plan_responses(ready_, opt_.fusion_threshold_bytes)) {
      if (s.error == ErrorKind::none) ++stats_.responses;
      if (s.names.size() > 1) stats_.fused_tensors += s.names.size();
      msg.responses.push_back(std::move(s));
    }
    ready_.clear();
    ready_bytes_ = 0;
  }

  // When the oldest wait for ranks began, if anything waits (Note [Stall inspection]).
  std::optional<Clock::time_point> oldest_wait() const {
    std::optional<Clock::time_point> t;
    for (const auto& [name, p] : table_)
      if (!t || p.first_seen < *t) t = p.first_seen;
    if (join_.active())
      if (const Clock::time_point quiet = join_.quiet_since(); !t || quiet < *t) t = quiet;
    return t;
  }

  void check_stalls(Clock::time_point now, ResponseMessage& msg) {
    const auto oldest = oldest_wait();
    if (!oldest) return;
    switch (stall_.judge(*oldest, now)) {
      case StallInspector::Verdict::none: return;
      case StallInspector::Verdict::shut_down:
        msg.fatal = stall_.shutdown_message(pending_report(now));
        return;
      case StallInspector::Verdict::warn: break;
    }
    ++stats_.stall_warnings;
    const std::string warning = stall_.warn(pending_report(now), now);
    if (hooks_.stall_warning) hooks_.stall_warning(warning);
  }

  // Ops that have waited DTRAIN_OP_TIMEOUT_SECONDS for ranks that never submitted them fail with
  // TimeoutError on every rank (Note [Failed ops]).
  void time_out_ops(Clock::time_point now) {
    if (opt_.op_timeout_seconds <= 0) return;
    fail_pending_where([&](const std::string& name, const Pending& p) -> std::optional<Verdict> {
      if (now - p.first_seen < op_timeout()) return std::nullopt;
      return timed_out_verdict(first_submission(p.per_rank).kind, name, opt_.op_timeout_seconds,
                               absent_ranks(p.per_rank), submitting_ranks(p.per_rank));
    }, now);
  }

  // Ops that wait for a rank that has shut down can never complete.
  void fail_ops_waiting_for_shut_down_ranks(Clock::time_point now) {
    if (shut_down_count_ == 0) return;
    fail_pending_where([&](const std::string& name, const Pending& p) -> std::optional<Verdict> {
      std::vector<int> gone;
      for (int k = 0; k < opt_.size; ++k)
        if (!p.per_rank[k] && shut_down_[k]) gone.push_back(k);
      if (gone.empty()) return std::nullopt;
      return shut_down_verdict(first_submission(p.per_rank).kind, name, gone);
    }, now);
  }

  ResponseMessage finish(ResponseMessage msg) {
    msg.seq = next_seq_++;
    return msg;
  }

  CoordinatorOptions opt_;
  CoordinatorHooks hooks_;
  std::unordered_map<std::string, Pending> table_;
  std::unordered_map<std::string, std::vector<ReadyOp>> groups_;  // ready members by group
  FailedOps failed_;
  JoinTracker join_;
  std::vector<ReadyOp> ready_;
  std::int64_t ready_bytes_ = 0;
  Clock::time_point first_ready_;
  std::vector<bool> shut_down_;
  int shut_down_count_ = 0;
  bool shutdown_announced_ = false;
  std::string job_ending_;  // a rank ended the job (RequestMessage::fatal)
  bool job_end_announced_ = false;
  std::vector<std::uint64_t> applied_;
  ResponseCache cache_;
  std::optional<std::int64_t> pending_cache_capacity_;
  StallInspector stall_;
  std::uint64_t next_seq_ = 1;
  CoordinatorStats stats_;
};

}  // namespace dtrain::detail
