#pragma once
// The coordinator's negotiation for one process set: its pending table, the groups being
// completed, its failed-op verdicts, its join, its stall inspector and its batch of ready ops.
// Note [Negotiation] and Note [Process sets] in runtime/negotiation/coordinator.hpp say how the
// coordinator drives one of these per set; everything here concerns the members of one set only.
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

#include "dtrain/runtime/negotiation/coordinator_options.hpp"
#include "dtrain/runtime/negotiation/cross_rank_validation.hpp"
#include "dtrain/runtime/negotiation/failed_ops.hpp"
#include "dtrain/runtime/negotiation/fusion_planner.hpp"
#include "dtrain/runtime/negotiation/join_tracker.hpp"
#include "dtrain/runtime/negotiation/messages.hpp"
#include "dtrain/runtime/negotiation/op_key.hpp"
#include "dtrain/runtime/negotiation/op_names.hpp"
#include "dtrain/runtime/negotiation/ready_op.hpp"
#include "dtrain/runtime/negotiation/response_cache.hpp"
#include "dtrain/runtime/negotiation/set_members.hpp"
#include "dtrain/runtime/negotiation/stall_inspector.hpp"

namespace dtrain::detail {

// What every set's negotiation shares with the coordinator that owns it (which outlives it).
struct SharedNegotiation {
  const CoordinatorOptions* options = nullptr;  // changed by the autotuner between polls
  const CoordinatorHooks* hooks = nullptr;
  CoordinatorStats* stats = nullptr;
  ResponseCache* cache = nullptr;                // one id space for every set
  const std::vector<bool>* shut_down = nullptr;  // by world rank: called dtrain::shutdown()
};

class SetCoordinator {
 public:
  SetCoordinator(SetMembers members, SharedNegotiation shared)
      : members_(std::move(members)), sh_(shared), failed_(member_mask(members_)),
        join_(members_, shared.options->op_timeout_seconds),
        stall_(*shared.options) {}

  const SetMembers& members() const noexcept { return members_; }

  // Member `r` sent requests at `now` (of any set): a join does not count it silent.
  void heard_from(int r, Clock::time_point now) { join_.heard_from(r, now); }

  // Member `r` submitted `q`, an op of this set.
  void add_request(int r, Request q, Clock::time_point now) {
    count_generated_name(q);
    if (q.kind == OpKind::join) {
      add_join(r, now);
      return;
    }
    if (auto verdict = failed_.verdict_for(r, q)) {
      push_error(q, *verdict, {r}, now);
      return;
    }
    if (!q.rejected.empty()) {
      fail_arriving(r, q, rejected_verdict(r, q, members_.label()), now);
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
      p.per_rank.resize(static_cast<std::size_t>(members_.world_size()));
      p.first_seen = now;
    }
    if (hook().rank_ready) hook().rank_ready(display_name(members_.id(), q.name), r, now);
    if (!p.per_rank[r]) ++p.submitted;
    p.per_rank[r] = std::move(q);
    if (is_ready(p)) make_ready(it->first, now);
  }

  // A member's whole message has been read (Note [Failed ops]).
  void message_read() { failed_.message_read(); }
  // Member `r` called dtrain::shutdown(): it holds no verdict open any more.
  void rank_shut_down(int r) { failed_.rank_shut_down(r); }

  // The stall inspector's turn at `now`: a warning goes to the hooks; a stall shutdown sets
  // `msg.fatal` (Note [Stall inspection]).
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
    ++sh_.stats->stall_warnings;
    const std::string warning = stall_.warn(pending_report(now), now);
    if (hook().stall_warning) hook().stall_warning(warning);
  }

  // Adds what is due at `now` to `msg` (sequence number `seq`): failures of ops that can never
  // complete or have waited too long, the ready ops' responses once the batch is due, and the
  // join's end.
  void poll_into(Clock::time_point now, ResponseMessage& msg, std::uint64_t seq) {
    fail_ops_waiting_for_shut_down_ranks(now);
    time_out_ops(now);
    if (!ready_.empty() && due(now)) plan(msg, seq);
    if (auto join = join_.conclude(now, *sh_.shut_down)) {
      join->name_counts.assign(generated_.begin(), generated_.end());
      msg.responses.push_back(std::move(*join));
    }
  }

  // When poll_into() has something time-driven to do (a batching window closing, a stall check,
  // a timeout).
  std::optional<Clock::time_point> next_deadline() const {
    std::optional<Clock::time_point> t;
    auto earliest = [&](Clock::time_point c) { if (!t || c < *t) t = c; };
    if (!ready_.empty()) earliest(first_ready_ + cycle());
    if (const auto oldest = oldest_wait())
      if (const auto d = stall_.next_deadline(*oldest)) earliest(*d);
    if (opt().op_timeout_seconds > 0)
      for (const auto& [name, p] : table_) earliest(p.first_seen + op_timeout());
    if (const auto d = join_.timeout_deadline()) earliest(*d);
    return t;
  }

  bool has_pending() const noexcept {
    return !table_.empty() || !ready_.empty() || join_.active();
  }
  std::size_t failed_remembered() const noexcept { return failed_.remembered(); }

  // What is pending and who is missing (stall warnings, shutdown errors); "" when nothing is.
  std::string pending_report(Clock::time_point now, std::size_t max_items = 20) const {
    std::vector<const std::pair<const std::string, Pending>*> items;
    for (const auto& kv : table_) items.push_back(&kv);
    std::sort(items.begin(), items.end(),
              [](auto* a, auto* b) { return a->second.first_seen < b->second.first_seen; });
    std::string out = join_.describe(now);
    std::size_t shown = 0;
    for (auto* kv : items) {
      if (shown++ == max_items) {
        out += fmt::format("\n  ... and {} more{}", items.size() - max_items, members_.label());
        break;
      }
      const auto& p = kv->second;
      out += fmt::format("\n  {} '{}'{}: submitted by ranks [{}], missing on ranks [{}], waiting "
                         "{:.1f} s",
                         p.kind, kv->first, members_.label(),
                         fmt::join(submitting_ranks(p.per_rank), ", "),
                         fmt::join(absent_ranks(p.per_rank, members_), ", "),
                         seconds(now - p.first_seen));
    }
    return out;
  }

 private:
  struct Pending {
    OpKind kind = OpKind::allreduce;
    PerRankRequests per_rank;  // by world rank
    int submitted = 0;
    Clock::time_point first_seen;
  };

  static std::vector<bool> member_mask(const SetMembers& m) {
    std::vector<bool> mask(static_cast<std::size_t>(m.world_size()), false);
    for (std::int32_t r : m.ranks()) mask[static_cast<std::size_t>(r)] = true;
    return mask;
  }
  const CoordinatorOptions& opt() const noexcept { return *sh_.options; }
  const CoordinatorHooks& hook() const noexcept { return *sh_.hooks; }
  static double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }
  Clock::duration cycle() const {
    return std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double, std::milli>(opt().cycle_time_ms));
  }
  Clock::duration op_timeout() const {
    return std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double>(opt().op_timeout_seconds));
  }

  // Note [Generated names] in runtime/negotiation/op_names.hpp: a group's members carry the group's
  // name.
  void count_generated_name(const Request& q) {
    const auto generated = parse_generated_name(q.group.empty() ? q.name : q.group);
    if (!generated) return;
    std::uint64_t& next = generated_[static_cast<std::size_t>(generated->first)];
    next = std::max(next, generated->second + 1);
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
    for (std::int32_t r : members_.ranks())
      if (!p.per_rank[static_cast<std::size_t>(r)] && !join_.has_joined(r)) return false;
    return p.submitted > 0;
  }

  void make_ready(const std::string& name, Clock::time_point now) {
    auto node = table_.extract(name);
    Pending& p = node.mapped();
    if (hook().negotiated)
      hook().negotiated(display_name(members_.id(), name), p.kind, p.first_seen, now);
    sh_.stats->wait_for_slowest_ns += static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(now - p.first_seen).count());
    ReadyOp ready = validate_across_ranks(name, p.per_rank, members_);
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
    failed_.fail_group(group, verdict, r, *sh_.shut_down);
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
        push_error(member.request, verdict, {}, now);  // ready: every member has it
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
    failed_.fail_name(q.name, verdict, ranks, *sh_.shut_down);
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
    failed_.fail_name(name, verdict, ranks, *sh_.shut_down);
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
    if (opt().cycle_time_ms <= 0) return true;
    if (opt().fusion_threshold_bytes > 0 && ready_bytes_ >= opt().fusion_threshold_bytes)
      return true;
    bool burst_under_way = !groups_.empty();
    for (const auto& [name, p] : table_) burst_under_way |= p.submitted > 0;
    return !burst_under_way || now - first_ready_ >= cycle();
  }

  // Turns the ready ops into responses (Note [Fusion planning]) and caches those that succeed.
  void plan(ResponseMessage& msg, std::uint64_t seq) {
    for (const ReadyOp& op : ready_)
      if (!op.failed()) sh_.cache->note_success(op.request, msg, seq);
    for (Response& s : plan_responses(ready_, opt().fusion_threshold_bytes)) {
      if (s.error == ErrorKind::none) ++sh_.stats->responses;
      if (s.names.size() > 1) sh_.stats->fused_tensors += s.names.size();
      // The backends run a set's broadcast on its communicator, which numbers the set's ranks.
      if (s.kind == OpKind::broadcast && s.error == ErrorKind::none)
        s.root = members_.index_of(s.root);
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

  // Ops that have waited DTRAIN_OP_TIMEOUT_SECONDS for ranks that never submitted them fail with
  // TimeoutError on every rank (Note [Failed ops]).
  void time_out_ops(Clock::time_point now) {
    if (opt().op_timeout_seconds <= 0) return;
    fail_pending_where([&](const std::string& name, const Pending& p) -> std::optional<Verdict> {
      if (now - p.first_seen < op_timeout()) return std::nullopt;
      return timed_out_verdict(first_submission(p.per_rank).kind, name, opt().op_timeout_seconds,
                               absent_ranks(p.per_rank, members_), submitting_ranks(p.per_rank),
                               members_.label());
    }, now);
  }

  // Ops that wait for a member that has shut down can never complete.
  void fail_ops_waiting_for_shut_down_ranks(Clock::time_point now) {
    if (std::none_of(sh_.shut_down->begin(), sh_.shut_down->end(), [](bool b) { return b; }))
      return;
    fail_pending_where([&](const std::string& name, const Pending& p) -> std::optional<Verdict> {
      std::vector<int> gone;
      for (std::int32_t k : members_.ranks())
        if (!p.per_rank[static_cast<std::size_t>(k)] &&
            (*sh_.shut_down)[static_cast<std::size_t>(k)])
          gone.push_back(k);
      if (gone.empty()) return std::nullopt;
      return shut_down_verdict(first_submission(p.per_rank).kind, name, gone, members_.label());
    }, now);
  }

  SetMembers members_;
  SharedNegotiation sh_;
  std::unordered_map<std::string, Pending> table_;
  std::unordered_map<std::string, std::vector<ReadyOp>> groups_;  // ready members by group
  FailedOps failed_;
  JoinTracker join_;
  std::vector<ReadyOp> ready_;
  std::int64_t ready_bytes_ = 0;
  Clock::time_point first_ready_;
  StallInspector stall_;
  NameCounts generated_{};  // per kind: one past the highest generated count seen on this set
};

}  // namespace dtrain::detail
