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
// The coordinator checks ready ops across ranks as Note [Validation across ranks]
// (runtime/cross_rank_validation.hpp) says and fuses them as Note [Fusion planning]
// (runtime/fusion_planner.hpp) says, keeps the cache side of Note [Response cache]
// (runtime/response_cache.hpp) and asks the stall inspector (runtime/stall_inspector.hpp) when ops
// have waited too long.
//
// Note [Failed ops]
// An op can fail before every rank has submitted it: a rank rejected its own call (a local argument
// error: it submits the name with the reason instead of the tensor, so the others do not wait for
// it and generated names stay in step), the ranks disagree on the size of a group, or the op waited
// longer than DTRAIN_OP_TIMEOUT_SECONDS for ranks that never submitted it. The coordinator then
// fails the op at once on the ranks that submitted it and remembers the verdict until every rank
// has submitted the name once (or shut down), so a rank that arrives later fails at once with the
// same error instead of waiting for peers that have moved on. A name's next submission by the
// same rank is a new op.
//
// Note [Join]
// A rank that joined takes part in every allreduce, allgather and broadcast with nothing of its own
// until every rank has joined. The join is waiting on the ranks that have not joined; it stalls
// when all of them have gone quiet (no request for the stall check time), it times out after
// DTRAIN_OP_TIMEOUT_SECONDS of such silence, and it fails at once when one of them shuts down
// without joining, so neither a stalled peer nor a shut-down one leaves the joined ranks waiting.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dtrain/runtime/cross_rank_validation.hpp"
#include "dtrain/runtime/fusion_planner.hpp"
#include "dtrain/runtime/messages.hpp"
#include "dtrain/runtime/ready_op.hpp"
#include "dtrain/runtime/response_cache.hpp"
#include "dtrain/runtime/stall_inspector.hpp"

namespace dtrain::detail {

using Clock = std::chrono::steady_clock;

struct CoordinatorOptions {
  int size = 1;
  std::int64_t fusion_threshold_bytes = 134217728;
  double cycle_time_ms = 1.0;
  std::int64_t cache_capacity = 1024;
  bool stall_check_disable = false;
  double stall_check_time_seconds = 60;
  double stall_shutdown_time_seconds = 0;
  double op_timeout_seconds = 600;  // 0: none (Note [Failed ops])
};

struct CoordinatorStats {
  std::uint64_t responses = 0;         // collectives emitted
  std::uint64_t fused_tensors = 0;     // tensors that shared a response with another
  std::uint64_t cache_hits = 0;        // requests that arrived as cache ids
  std::uint64_t requests = 0;          // requests received, in either form
  std::uint64_t stall_warnings = 0;
  // Per op, from the first rank's submission reaching the coordinator to the last one's: how long
  // the fastest rank waited for the slowest, summed over ops.
  std::uint64_t wait_for_slowest_ns = 0;
};

// Hooks for observers (timeline, logging); all optional.
struct CoordinatorHooks {
  std::function<void(const std::string& name, int rank, Clock::time_point when)> rank_ready;
  // `started`: when the first rank submitted it.
  std::function<void(const std::string& name, OpKind kind, Clock::time_point started,
                     Clock::time_point when)>
      negotiated;
  std::function<void(const std::string& report)> stall_warning;
};

class Coordinator {
 public:
  explicit Coordinator(CoordinatorOptions o, CoordinatorHooks hooks = {})
      : opt_(o), hooks_(std::move(hooks)), joined_(o.size, false), shut_down_(o.size, false),
        applied_(o.size, 0), last_heard_(o.size), cache_(o.cache_capacity),
        stall_(StallOptions{o.stall_check_disable, o.stall_check_time_seconds,
                            o.stall_shutdown_time_seconds}) {}

  void on_message(const RequestMessage& m, Clock::time_point now) {
    const int r = m.rank;
    if (!m.fatal.empty() && job_ending_.empty()) job_ending_ = m.fatal;
    applied_[r] = std::max(applied_[r], m.responses_applied);
    if (!m.cached.empty() || !m.requests.empty()) last_heard_[r] = now;
    for (auto id : m.cached) {
      Request q = cache_.resolve(id);
      ++stats_.cache_hits;
      add_request(r, std::move(q), now);
    }
    for (const auto& q : m.requests) add_request(r, q, now);
    // A rank submits all members of a group in one message, so a failed group is settled for it
    // once the whole message has been read.
    for (const auto& [group, k] : settling_) settle(failed_groups_, group, k);
    settling_.clear();
    if (m.shutdown && !shut_down_[r]) {
      shut_down_[r] = true;
      ++shut_down_count_;
      settle_failed_for_shut_down_rank(r);
    }
    cache_.retire(applied_);
  }

  // The autotuner's batching knobs, in effect from the next poll(): how much to fuse, how long to
  // wait for a batch, how many responses to cache (0: none; evictions go out in the next message).
  void retune(std::int64_t fusion_threshold_bytes, double cycle_time_ms, std::int64_t cache_capacity) {
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
    check_join(now, msg);
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
    if (opt_.op_timeout_seconds > 0) {
      for (const auto& [name, p] : table_) earliest(p.first_seen + op_timeout());
      if (joined_count_ > 0) earliest(join_quiet_since() + op_timeout());
    }
    return t;
  }

  bool has_pending() const noexcept {
    return !table_.empty() || !ready_.empty() || joined_count_ > 0;
  }
  const CoordinatorStats& stats() const noexcept { return stats_; }
  std::size_t cache_size() const noexcept { return cache_.size(); }
  // Verdicts still waiting for ranks that have not submitted the name (Note [Failed ops]).
  std::size_t failed_remembered() const noexcept { return failed_.size() + failed_groups_.size(); }

  // Human-readable list of what is pending and who is missing (stall warnings, shutdown errors).
  std::string pending_report(Clock::time_point now, std::size_t max_items = 20) const {
    std::vector<const std::pair<const std::string, Pending>*> items;
    for (const auto& kv : table_) items.push_back(&kv);
    std::sort(items.begin(), items.end(),
              [](auto* a, auto* b) { return a->second.first_seen < b->second.first_seen; });
    std::string out;
    if (joined_count_ > 0) {
      out += fmt::format("\n  join: joined by ranks [{}], waiting for ranks [{}], from which no "
                         "request has come for {:.1f} s",
                         fmt::join(ranks_where(joined_, true), ", "),
                         fmt::join(ranks_where(joined_, false), ", "),
                         seconds(now - join_quiet_since()));
    }
    std::size_t shown = 0;
    for (auto* kv : items) {
      if (shown++ == max_items) {
        out += fmt::format("\n  ... and {} more", items.size() - max_items);
        break;
      }
      const auto& p = kv->second;
      out += fmt::format("\n  {} '{}': submitted by ranks [{}], missing on ranks [{}], waiting {:.1f} s",
                         p.kind, kv->first, fmt::join(present_ranks(p), ", "),
                         fmt::join(missing_ranks(p), ", "), seconds(now - p.first_seen));
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
  // A verdict remembered for the ranks that have not submitted the name yet (Note [Failed ops]).
  struct Failed {
    ErrorKind error = ErrorKind::none;
    std::string message;
    std::vector<bool> settled;  // per rank: has submitted the name (or shut down)
  };
  // What each rank said about the size of a group still being negotiated.
  struct GroupSizes {
    std::vector<std::optional<std::int32_t>> per_rank;
  };

  static double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }
  static Clock::duration from_seconds(double s) {
    return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
  }
  Clock::duration cycle() const {
    return std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double, std::milli>(opt_.cycle_time_ms));
  }
  Clock::duration op_timeout() const { return from_seconds(opt_.op_timeout_seconds); }

  static std::vector<int> ranks_where(const std::vector<bool>& flags, bool value) {
    std::vector<int> out;
    for (std::size_t r = 0; r < flags.size(); ++r)
      if (flags[r] == value) out.push_back(static_cast<int>(r));
    return out;
  }
  std::vector<std::int32_t> present_ranks(const Pending& p) const {
    std::vector<std::int32_t> out;
    for (int r = 0; r < opt_.size; ++r)
      if (p.per_rank[r]) out.push_back(r);
    return out;
  }
  std::vector<int> missing_ranks(const Pending& p) const {
    std::vector<int> out;
    for (int r = 0; r < opt_.size; ++r)
      if (!p.per_rank[r]) out.push_back(r);
    return out;
  }

  void add_request(int r, Request q, Clock::time_point now) {
    ++stats_.requests;
    if (q.kind == OpKind::join) {
      add_join(r, now);
      return;
    }
    if (settle_failed(r, q, now)) return;
    if (!q.rejected.empty()) {
      fail_arriving(r, q, ErrorKind::invalid_argument,
                    fmt::format("dtrain: {} '{}' was rejected on rank {}: {}",
                                q.group.empty() ? to_string(q.kind) : "grouped_allreduce",
                                q.group.empty() ? q.name : q.group, r, q.rejected),
                    now);
      return;
    }
    if (!q.group.empty() && !check_group_size(r, q, now)) return;
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
    if (!joined_[r]) {
      if (joined_count_ == 0) join_started_ = now;
      joined_[r] = true;
      ++joined_count_;
      last_joined_ = r;
    }
    // Ops that were waiting only for this rank may now be ready.
    std::vector<std::string> now_ready;
    for (auto& [name, p] : table_)
      if (is_ready(p)) now_ready.push_back(name);
    for (auto& name : now_ready) make_ready(name, now);
  }

  // A rank submitting a name whose op has already failed gets the same error at once.
  bool settle_failed(int r, const Request& q, Clock::time_point now) {
    if (auto it = failed_.find(q.name); it != failed_.end() && !it->second.settled[r]) {
      push_error(q, it->second.error, it->second.message, {r}, now);
      settle(failed_, q.name, r);
      return true;
    }
    if (q.group.empty()) return false;
    auto g = failed_groups_.find(q.group);
    if (g == failed_groups_.end() || g->second.settled[r]) return false;
    push_error(q, g->second.error, g->second.message, {r}, now);
    settling_.emplace_back(q.group, r);
    return true;
  }

  static bool all_settled(const Failed& f) {
    return std::all_of(f.settled.begin(), f.settled.end(), [](bool b) { return b; });
  }
  static void settle(std::unordered_map<std::string, Failed>& verdicts, const std::string& key, int r) {
    auto it = verdicts.find(key);
    if (it == verdicts.end()) return;
    it->second.settled[r] = true;
    if (all_settled(it->second)) verdicts.erase(it);
  }
  void remember(std::unordered_map<std::string, Failed>& verdicts, const std::string& key, Failed f) {
    for (int k = 0; k < opt_.size; ++k) f.settled[k] = f.settled[k] || shut_down_[k];
    if (!all_settled(f)) verdicts[key] = std::move(f);
  }

  // Ranks must agree on the number of members of a group; a disagreement fails the whole group
  // on every rank (Note [Failed ops]). Returns false when the group has failed.
  bool check_group_size(int r, const Request& q, Clock::time_point now) {
    GroupSizes& g = group_sizes_[q.group];
    if (g.per_rank.empty()) g.per_rank.resize(opt_.size);
    if (!g.per_rank[r]) g.per_rank[r] = q.group_size;
    for (int k = 0; k < opt_.size; ++k) {
      if (!g.per_rank[k] || *g.per_rank[k] == q.group_size) continue;
      std::map<std::int32_t, std::vector<int>> by_size;
      for (int j = 0; j < opt_.size; ++j)
        if (g.per_rank[j]) by_size[*g.per_rank[j]].push_back(j);
      std::string values;
      for (const auto& [n, ranks] : by_size)
        values += fmt::format("{}{} on ranks [{}]", values.empty() ? "" : "; ", n, fmt::join(ranks, ", "));
      fail_group(q.group, ErrorKind::mismatch,
                 fmt::format("dtrain: ranks disagree on the number of tensors in grouped_allreduce "
                             "'{}': {}. Every rank must pass the same number of tensors.",
                             q.group, values),
                 r, &q, now);
      return false;
    }
    return true;
  }

  // Fails every member of `group` on every rank. `arriving` (from rank r, whose message is still
  // being read) is a member not in the table yet; r is -1 when nothing is arriving.
  void fail_group(const std::string& group, ErrorKind error, const std::string& message, int r,
                  const Request* arriving, Clock::time_point now) {
    Failed f{error, message, std::vector<bool>(opt_.size, false)};
    if (auto g = group_sizes_.find(group); g != group_sizes_.end()) {
      // A rank that stated the group's size has submitted all its members already.
      for (int k = 0; k < opt_.size; ++k) f.settled[k] = k != r && g->second.per_rank[k].has_value();
      group_sizes_.erase(g);
    }
    std::vector<std::string> names;
    for (const auto& [name, p] : table_)
      if (p.per_rank[first_present(p)]->group == group) names.push_back(name);
    for (const auto& name : names) {
      auto node = table_.extract(name);
      auto ranks = present_ranks(node.mapped());
      if (arriving && arriving->name == name) ranks.push_back(r);
      push_error(*node.mapped().per_rank[first_present(node.mapped())], error, message,
                 std::move(ranks), now);
    }
    bool arriving_ready = false;
    if (auto g = groups_.find(group); g != groups_.end()) {
      for (auto& member : g->second) {
        push_error(member.request, error, message, {}, now);  // ready: every rank has it
        arriving_ready |= arriving && arriving->name == member.request.name;
      }
      groups_.erase(g);
    }
    const bool arriving_seen = arriving && (arriving_ready || std::find(names.begin(), names.end(), arriving->name) != names.end());
    if (arriving && !arriving_seen) push_error(*arriving, error, message, {r}, now);
    if (r >= 0) settling_.emplace_back(group, r);
    if (r >= 0) failed_groups_[group] = std::move(f);  // settled for r once its message is read
    else remember(failed_groups_, group, std::move(f));
  }

  // Fails op `q.name`, which rank r has just submitted, on every rank that submitted it or will.
  void fail_arriving(int r, const Request& q, ErrorKind error, const std::string& message,
                     Clock::time_point now) {
    if (!q.group.empty()) {
      fail_group(q.group, error, message, r, &q, now);
      return;
    }
    Failed f{error, message, std::vector<bool>(opt_.size, false)};
    std::vector<std::int32_t> ranks;
    if (auto it = table_.find(q.name); it != table_.end()) {
      for (int k = 0; k < opt_.size; ++k) f.settled[k] = it->second.per_rank[k].has_value();
      ranks = present_ranks(it->second);
      table_.erase(it);
    }
    f.settled[r] = true;
    ranks.push_back(r);
    push_error(q, error, message, std::move(ranks), now);
    remember(failed_, q.name, std::move(f));
  }

  // Fails a pending op on every rank that submitted it or will.
  void fail_pending(const std::string& name, ErrorKind error, const std::string& message,
                    Clock::time_point now) {
    auto it = table_.find(name);
    if (it == table_.end()) return;
    const Request q = *it->second.per_rank[first_present(it->second)];
    if (!q.group.empty()) {
      fail_group(q.group, error, message, -1, nullptr, now);
      return;
    }
    Failed f{error, message, std::vector<bool>(opt_.size, false)};
    for (int k = 0; k < opt_.size; ++k) f.settled[k] = it->second.per_rank[k].has_value();
    auto ranks = present_ranks(it->second);
    table_.erase(it);
    push_error(q, error, message, std::move(ranks), now);
    remember(failed_, name, std::move(f));
  }

  void push_error(const Request& q, ErrorKind error, const std::string& message,
                  std::vector<std::int32_t> ranks, Clock::time_point now) {
    ReadyOp r;
    r.request = q;
    r.error = error;
    r.message = message;
    r.error_ranks = std::move(ranks);
    push_ready(std::move(r), now);
  }

  // A rank that shut down will never submit: it no longer holds a remembered verdict open.
  void settle_failed_for_shut_down_rank(int r) {
    for (auto* verdicts : {&failed_, &failed_groups_}) {
      for (auto it = verdicts->begin(); it != verdicts->end();) {
        it->second.settled[r] = true;
        it = all_settled(it->second) ? verdicts->erase(it) : std::next(it);
      }
    }
  }

  int first_present(const Pending& p) const {
    int first = 0;
    while (!p.per_rank[first]) ++first;
    return first;
  }

  bool is_ready(const Pending& p) const {
    for (int r = 0; r < opt_.size; ++r)
      if (!p.per_rank[r] && !joined_[r]) return false;
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
      group_sizes_.erase(group);
      return;
    }
    push_ready(std::move(ready), now);
  }

  void push_ready(ReadyOp r, Clock::time_point now) {
    if (ready_.empty()) first_ready_ = now;
    ready_bytes_ += r.bytes();
    ready_.push_back(std::move(r));
  }

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

  // Since when every rank the join waits for has been quiet (Note [Join]).
  Clock::time_point join_quiet_since() const {
    Clock::time_point t = join_started_;
    for (int r = 0; r < opt_.size; ++r)
      if (!joined_[r]) t = std::max(t, last_heard_[r]);
    return t;
  }

  // When the oldest wait for ranks began, if anything waits (Note [Stall inspection]).
  std::optional<Clock::time_point> oldest_wait() const {
    std::optional<Clock::time_point> t;
    for (const auto& [name, p] : table_)
      if (!t || p.first_seen < *t) t = p.first_seen;
    if (joined_count_ > 0)
      if (const Clock::time_point quiet = join_quiet_since(); !t || quiet < *t) t = quiet;
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
    std::vector<std::string> expired;
    for (const auto& [name, p] : table_)
      if (now - p.first_seen >= op_timeout()) expired.push_back(name);
    for (const auto& name : expired) {
      auto it = table_.find(name);
      if (it == table_.end()) continue;  // failed with its group
      const Pending& p = it->second;
      const Request& q = *p.per_rank[first_present(p)];
      fail_pending(name, ErrorKind::timeout,
           fmt::format("dtrain: {} '{}' timed out after {} s (DTRAIN_OP_TIMEOUT_SECONDS): ranks "
                       "[{}] never submitted it (submitted by ranks [{}]). Those ranks took a "
                       "different code path, are stuck, or are still busy; if a rank "
                       "legitimately works alone for that long, raise DTRAIN_OP_TIMEOUT_SECONDS.",
                       q.kind, name, opt_.op_timeout_seconds,
                       fmt::join(missing_ranks(p), ", "), fmt::join(present_ranks(p), ", ")),
           now);
    }
  }

  void fail_ops_waiting_for_shut_down_ranks(Clock::time_point now) {
    if (shut_down_count_ == 0) return;
    std::vector<std::string> doomed;
    for (const auto& [name, p] : table_)
      for (int r = 0; r < opt_.size; ++r)
        if (!p.per_rank[r] && shut_down_[r]) {
          doomed.push_back(name);
          break;
        }
    for (const auto& name : doomed) {
      auto it = table_.find(name);
      if (it == table_.end()) continue;  // failed with its group
      const Pending& p = it->second;
      const Request& q = *p.per_rank[first_present(p)];
      std::vector<int> gone;
      for (int k = 0; k < opt_.size; ++k)
        if (!p.per_rank[k] && shut_down_[k]) gone.push_back(k);
      fail_pending(name, ErrorKind::shutdown,
                   fmt::format("dtrain: {} '{}' can never complete: ranks [{}] called "
                               "dtrain::shutdown() without submitting it",
                               q.kind, name, fmt::join(gone, ", ")),
                   now);
    }
  }

  // Completes, fails or times out the join (Note [Join]).
  void check_join(Clock::time_point now, ResponseMessage& msg) {
    if (joined_count_ == 0) return;
    Response j;
    j.kind = OpKind::join;
    j.names = {"join"};
    if (joined_count_ == opt_.size) {
      j.last_joined_rank = last_joined_;
    } else {
      std::vector<int> gone;
      for (int r = 0; r < opt_.size; ++r)
        if (!joined_[r] && shut_down_[r]) gone.push_back(r);
      if (!gone.empty()) {
        j.error = ErrorKind::shutdown;
        j.error_message = fmt::format(
            "dtrain: join() can never complete: ranks [{}] called dtrain::shutdown() without "
            "joining (joined: ranks [{}])",
            fmt::join(gone, ", "), fmt::join(ranks_where(joined_, true), ", "));
      } else if (opt_.op_timeout_seconds > 0 && now - join_quiet_since() >= op_timeout()) {
        j.error = ErrorKind::timeout;
        j.error_message = fmt::format(
            "dtrain: join() timed out after {} s (DTRAIN_OP_TIMEOUT_SECONDS): ranks [{}] have "
            "neither joined nor submitted any op for that long (joined: ranks [{}])",
            opt_.op_timeout_seconds, fmt::join(ranks_where(joined_, false), ", "),
            fmt::join(ranks_where(joined_, true), ", "));
      } else {
        return;
      }
    }
    if (j.error != ErrorKind::none)
      for (int r = 0; r < opt_.size; ++r)
        if (joined_[r]) j.error_ranks.push_back(r);
    msg.responses.push_back(std::move(j));
    std::fill(joined_.begin(), joined_.end(), false);
    joined_count_ = 0;
  }

  ResponseMessage finish(ResponseMessage msg) {
    msg.seq = next_seq_++;
    return msg;
  }

  CoordinatorOptions opt_;
  CoordinatorHooks hooks_;
  std::unordered_map<std::string, Pending> table_;
  std::unordered_map<std::string, std::vector<ReadyOp>> groups_;  // ready members by group
  std::unordered_map<std::string, GroupSizes> group_sizes_;
  std::unordered_map<std::string, Failed> failed_;
  std::unordered_map<std::string, Failed> failed_groups_;
  std::vector<std::pair<std::string, int>> settling_;  // (group, rank) settled after a message
  std::vector<ReadyOp> ready_;
  std::int64_t ready_bytes_ = 0;
  Clock::time_point first_ready_;
  std::vector<bool> joined_;
  int joined_count_ = 0;
  int last_joined_ = -1;
  Clock::time_point join_started_;
  std::vector<bool> shut_down_;
  int shut_down_count_ = 0;
  bool shutdown_announced_ = false;
  std::string job_ending_;  // a rank ended the job (RequestMessage::fatal)
  bool job_end_announced_ = false;
  std::vector<std::uint64_t> applied_;
  std::vector<Clock::time_point> last_heard_;
  ResponseCache cache_;
  std::optional<std::int64_t> pending_cache_capacity_;
  StallInspector stall_;
  std::uint64_t next_seq_ = 1;
  CoordinatorStats stats_;
};

}  // namespace dtrain::detail
