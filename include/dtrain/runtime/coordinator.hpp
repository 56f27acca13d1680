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
// Note [Response cache]
// After an allreduce, broadcast or reducescatter succeeds, the coordinator assigns its name and
// metadata a cache id and announces it to every rank. A rank that later submits the same name with
// the same metadata sends only the id. Only the coordinator inserts and evicts, so every rank's
// mirror changes in the same order; an evicted id stays resolvable ("retired") until every rank
// has applied the message that evicted it, so a rank that sent an id just before learning of its
// eviction is still understood.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dtrain/runtime/messages.hpp"

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
};

struct CoordinatorStats {
  std::uint64_t responses = 0;         // collectives emitted
  std::uint64_t fused_tensors = 0;     // tensors that shared a response with another
  std::uint64_t cache_hits = 0;        // requests that arrived as cache ids
  std::uint64_t requests = 0;          // requests received, in either form
  std::uint64_t stall_warnings = 0;
};

// Hooks for observers (timeline, logging); all optional.
struct CoordinatorHooks {
  std::function<void(const std::string& name, OpKind kind, int rank, Clock::time_point when)> rank_ready;
  std::function<void(const std::string& name, Clock::time_point when)> negotiated;
  std::function<void(const std::string& report)> stall_warning;
};

class Coordinator {
 public:
  explicit Coordinator(CoordinatorOptions o, CoordinatorHooks hooks = {})
      : opt_(o), hooks_(std::move(hooks)), joined_(o.size, false), shut_down_(o.size, false),
        applied_(o.size, 0) {}

  void on_message(const RequestMessage& m, Clock::time_point now) {
    const int r = m.rank;
    applied_[r] = std::max(applied_[r], m.responses_applied);
    for (auto id : m.cached) {
      Request q = resolve_cached(id);
      ++stats_.cache_hits;
      add_request(r, std::move(q), now);
    }
    for (const auto& q : m.requests) add_request(r, q, now);
    if (m.shutdown && !shut_down_[r]) {
      shut_down_[r] = true;
      ++shut_down_count_;
    }
    retire_cache_entries();
  }

  // The next message to send to every rank, if one is due at `now`.
  std::optional<ResponseMessage> poll(Clock::time_point now) {
    ResponseMessage msg;
    check_stalls(now, msg);
    if (!msg.fatal.empty()) return finish(std::move(msg));
    fail_ops_waiting_for_shut_down_ranks();
    if (!ready_.empty() && due(now)) plan(msg);
    if (joined_count_ == opt_.size && opt_.size > 0) {
      Response j;
      j.kind = OpKind::join;
      j.last_joined_rank = last_joined_;
      msg.responses.push_back(std::move(j));
      std::fill(joined_.begin(), joined_.end(), false);
      joined_count_ = 0;
    }
    if (shut_down_count_ == opt_.size && !shutdown_announced_) {
      msg.shutdown_complete = true;
      shutdown_announced_ = true;
    }
    if (msg.responses.empty() && !msg.shutdown_complete) return std::nullopt;
    return finish(std::move(msg));
  }

  // When poll() has something time-driven to do (a batching window closing, a stall check).
  std::optional<Clock::time_point> next_deadline() const {
    std::optional<Clock::time_point> t;
    auto earliest = [&](Clock::time_point c) { if (!t || c < *t) t = c; };
    if (!ready_.empty()) earliest(first_ready_ + cycle());
    if (!table_.empty() && !opt_.stall_check_disable) {
      for (const auto& [name, p] : table_) earliest(p.last_warned + stall_check());
    }
    return t;
  }

  bool has_pending() const noexcept { return !table_.empty() || !ready_.empty(); }
  const CoordinatorStats& stats() const noexcept { return stats_; }
  std::size_t cache_size() const noexcept { return cache_.size(); }

  // Human-readable list of what is pending and who is missing (stall warnings, shutdown errors).
  std::string pending_report(Clock::time_point now, std::size_t max_items = 20) const {
    std::vector<const std::pair<const std::string, Pending>*> items;
    for (const auto& kv : table_) items.push_back(&kv);
    std::sort(items.begin(), items.end(),
              [](auto* a, auto* b) { return a->second.first_seen < b->second.first_seen; });
    std::string out;
    std::size_t shown = 0;
    for (auto* kv : items) {
      if (shown++ == max_items) {
        out += fmt::format("\n  ... and {} more", items.size() - max_items);
        break;
      }
      const auto& p = kv->second;
      std::vector<int> missing, present;
      for (int r = 0; r < opt_.size; ++r) (p.per_rank[r] ? present : missing).push_back(r);
      out += fmt::format("\n  {} '{}': submitted by ranks [{}], missing on ranks [{}], waiting {:.1f} s",
                         to_string(p.kind), kv->first, fmt::join(present, ", "),
                         fmt::join(missing, ", "), seconds(now - p.first_seen));
    }
    return out;
  }

 private:
  struct Pending {
    OpKind kind = OpKind::allreduce;
    std::vector<std::optional<Request>> per_rank;
    int submitted = 0;
    Clock::time_point first_seen;
    Clock::time_point last_warned;
  };
  struct CacheEntry {
    std::uint64_t id;
    Request meta;
    std::list<std::string>::iterator lru;
  };

  static double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }
  Clock::duration cycle() const {
    return std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double, std::milli>(opt_.cycle_time_ms));
  }
  Clock::duration stall_check() const {
    return std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double>(opt_.stall_check_time_seconds));
  }

  Request resolve_cached(std::uint64_t id) const {
    if (auto it = cache_by_id_.find(id); it != cache_by_id_.end()) return cache_.at(it->second).meta;
    if (auto it = retired_.find(id); it != retired_.end()) return it->second.first;
    throw Error(fmt::format("dtrain: internal error: unknown response-cache id {}", id));
  }

  void add_request(int r, Request q, Clock::time_point now) {
    ++stats_.requests;
    if (q.kind == OpKind::join) {
      if (!joined_[r]) {
        joined_[r] = true;
        ++joined_count_;
        last_joined_ = r;
      }
      // Ops that were waiting only for this rank may now be ready.
      std::vector<std::string> now_ready;
      for (auto& [name, p] : table_)
        if (is_ready(p)) now_ready.push_back(name);
      for (auto& name : now_ready) make_ready(name, now);
      return;
    }
    auto [it, inserted] = table_.try_emplace(q.name);
    Pending& p = it->second;
    if (inserted) {
      p.kind = q.kind;
      p.per_rank.resize(opt_.size);
      p.first_seen = now;
      p.last_warned = now;
    }
    if (hooks_.rank_ready) hooks_.rank_ready(q.name, q.kind, r, now);
    if (!p.per_rank[r]) ++p.submitted;
    p.per_rank[r] = std::move(q);
    if (is_ready(p)) make_ready(it->first, now);
  }

  bool is_ready(const Pending& p) const {
    for (int r = 0; r < opt_.size; ++r)
      if (!p.per_rank[r] && !joined_[r]) return false;
    return p.submitted > 0;
  }

  void make_ready(const std::string& name, Clock::time_point now) {
    auto node = table_.extract(name);
    Pending& p = node.mapped();
    if (hooks_.negotiated) hooks_.negotiated(name, now);
    Ready ready = validate(name, p);
    const std::string group = ready.request.group;
    if (!group.empty() && ready.request.group_size > 1) {
      auto& members = groups_[group];
      members.push_back(std::move(ready));
      if (static_cast<std::int32_t>(members.size()) < members.front().request.group_size) return;
      for (auto& m : members) push_ready(std::move(m), now);
      groups_.erase(group);
      return;
    }
    push_ready(std::move(ready), now);
  }

  struct Ready {
    Request request;                 // canonical: the first submitting rank's request
    std::vector<std::int64_t> rank_rows;
    std::int32_t contributors = 0;
    ErrorKind error = ErrorKind::none;
    std::string message;
    bool from_cache_for_all = false;
  };

  void push_ready(Ready r, Clock::time_point now) {
    if (ready_.empty()) first_ready_ = now;
    ready_bytes_ += r.request.numel() * static_cast<std::int64_t>(element_size(r.request.dtype));
    ready_.push_back(std::move(r));
  }

  bool due(Clock::time_point now) const {
    if (opt_.cycle_time_ms <= 0) return true;
    if (opt_.fusion_threshold_bytes > 0 && ready_bytes_ >= opt_.fusion_threshold_bytes) return true;
    bool burst_under_way = !groups_.empty();
    for (const auto& [name, p] : table_) burst_under_way |= p.submitted > 0;
    return !burst_under_way || now - first_ready_ >= cycle();
  }

  template <class F>
  std::string by_value(const Pending& p, F&& field) const {
    std::map<std::string, std::vector<int>> groups;
    for (int r = 0; r < opt_.size; ++r)
      if (p.per_rank[r]) groups[field(*p.per_rank[r])].push_back(r);
    std::string out;
    for (const auto& [value, ranks] : groups)
      out += fmt::format("{}{} on ranks [{}]", out.empty() ? "" : "; ", value, fmt::join(ranks, ", "));
    return out;
  }

  Ready validate(const std::string& name, const Pending& p) const {
    Ready out;
    int first = 0;
    while (!p.per_rank[first]) ++first;
    out.request = *p.per_rank[first];
    out.contributors = p.submitted;
    auto fail = [&](ErrorKind kind, std::string msg) {
      out.error = kind;
      out.message = std::move(msg);
      return out;
    };
    auto mismatch = [&](std::string_view field, auto&& get) -> std::optional<Ready> {
      const auto reference = get(out.request);
      for (int r = 0; r < opt_.size; ++r) {
        if (p.per_rank[r] && get(*p.per_rank[r]) != reference) {
          return fail(ErrorKind::mismatch,
                      fmt::format("dtrain: ranks disagree on the {} of {} '{}': {}", field,
                                  to_string(out.request.kind), name,
                                  by_value(p, [&](const Request& q) { return fmt::format("{}", get(q)); })));
        }
      }
      return std::nullopt;
    };
    const OpKind kind = out.request.kind;
    auto shape_s = [](const Request& q) { return fmt::format("[{}]", fmt::join(q.shape, ", ")); };
    auto row_shape_s = [](const Request& q) {
      return q.shape.size() <= 1 ? std::string("[]")
                                 : fmt::format("[{}]", fmt::join(q.shape.begin() + 1, q.shape.end(), ", "));
    };
    if (auto e = mismatch("op kind", [](const Request& q) { return std::string(to_string(q.kind)); })) return *e;
    if (auto e = mismatch("dtype", [](const Request& q) { return std::string(to_string(q.dtype)); })) return *e;
    if (auto e = mismatch("device", [](const Request& q) { return to_string(q.device); })) return *e;
    if (kind == OpKind::allreduce || kind == OpKind::reducescatter) {
      if (auto e = mismatch("reduce op", [](const Request& q) { return std::string(to_string(q.reduce_op)); })) return *e;
      if (auto e = mismatch("prescale factor", [](const Request& q) { return q.prescale; })) return *e;
      if (auto e = mismatch("postscale factor", [](const Request& q) { return q.postscale; })) return *e;
    }
    if (kind == OpKind::allreduce || kind == OpKind::reducescatter || kind == OpKind::broadcast) {
      if (auto e = mismatch("shape", shape_s)) return *e;
    }
    if (kind == OpKind::allgather || kind == OpKind::alltoall) {
      if (auto e = mismatch("number of dimensions", [](const Request& q) { return q.shape.size(); })) return *e;
      if (auto e = mismatch("shape beyond dim 0", row_shape_s)) return *e;
    }
    if (kind == OpKind::broadcast) {
      if (auto e = mismatch("root rank", [](const Request& q) { return q.root; })) return *e;
      if (joined_[out.request.root] && !p.per_rank[out.request.root])
        return fail(ErrorKind::invalid_argument,
                    fmt::format("dtrain: broadcast '{}' has root rank {}, which has already joined",
                                name, out.request.root));
    }
    if (auto e = mismatch("group", [](const Request& q) { return q.group + "/" + std::to_string(q.group_size); })) return *e;
    const bool someone_joined = p.submitted < opt_.size;
    if (someone_joined && (kind == OpKind::alltoall || kind == OpKind::reducescatter)) {
      std::vector<int> absent;
      for (int r = 0; r < opt_.size; ++r)
        if (!p.per_rank[r]) absent.push_back(r);
      return fail(ErrorKind::invalid_argument,
                  fmt::format("dtrain: {} '{}' cannot run while ranks [{}] have joined: only "
                              "allreduce, allgather, broadcast and barrier accept joined ranks",
                              to_string(kind), name, fmt::join(absent, ", ")));
    }
    if (kind == OpKind::allgather) {
      out.rank_rows.assign(opt_.size, 0);
      for (int r = 0; r < opt_.size; ++r)
        if (p.per_rank[r]) out.rank_rows[r] = p.per_rank[r]->dim0();
    }
    return out;
  }

  static bool fusable(const Ready& r) {
    return r.error == ErrorKind::none && r.request.kind == OpKind::allreduce;
  }

  void plan(ResponseMessage& msg) {
    const std::int64_t threshold = opt_.fusion_threshold_bytes;
    struct Open {
      std::size_t index;
      std::int64_t bytes;
    };
    std::vector<Open> open;  // fusable responses that can still take tensors
    for (auto& r : ready_) {
      const Request& q = r.request;
      const std::int64_t bytes = q.numel() * static_cast<std::int64_t>(element_size(q.dtype));
      if (fusable(r) && threshold > 0 && bytes <= threshold) {
        bool placed = false;
        for (auto& o : open) {
          Response& s = msg.responses[o.index];
          if (s.dtype == q.dtype && s.device == q.device && s.reduce_op == q.reduce_op &&
              s.prescale == q.prescale && s.postscale == q.postscale &&
              s.active_ranks == r.contributors && o.bytes + bytes <= threshold) {
            if (s.names.size() == 1) ++stats_.fused_tensors;
            ++stats_.fused_tensors;
            s.names.push_back(q.name);
            s.numels.push_back(q.numel());
            o.bytes += bytes;
            placed = true;
            break;
          }
        }
        if (placed) {
          note_cacheable(q, msg);
          continue;
        }
        open.push_back({msg.responses.size(), bytes});
      }
      Response s;
      s.kind = q.kind;
      s.names = {q.name};
      s.numels = {q.numel()};
      s.dtype = q.dtype;
      s.device = q.device;
      s.reduce_op = q.reduce_op;
      s.prescale = q.prescale;
      s.postscale = q.postscale;
      s.root = q.root;
      s.shape = q.shape;
      s.rank_rows = std::move(r.rank_rows);
      s.active_ranks = r.contributors;
      s.error = r.error;
      s.error_message = std::move(r.message);
      if (s.error == ErrorKind::none) {
        ++stats_.responses;
        note_cacheable(q, msg);
      }
      msg.responses.push_back(std::move(s));
    }
    ready_.clear();
    ready_bytes_ = 0;
  }

  void note_cacheable(const Request& q, ResponseMessage& msg) {
    if (opt_.cache_capacity <= 0) return;
    if (q.kind != OpKind::allreduce && q.kind != OpKind::broadcast && q.kind != OpKind::reducescatter)
      return;
    if (auto it = cache_.find(q.name); it != cache_.end()) {
      if (it->second.meta.same_metadata(q)) {
        lru_.splice(lru_.begin(), lru_, it->second.lru);
        return;
      }
      evict(q.name, msg);
    }
    if (static_cast<std::int64_t>(cache_.size()) >= opt_.cache_capacity) evict(lru_.back(), msg);
    const std::uint64_t id = next_cache_id_++;
    lru_.push_front(q.name);
    cache_.emplace(q.name, CacheEntry{id, q, lru_.begin()});
    cache_by_id_.emplace(id, q.name);
    msg.cache_inserts.push_back({id, q.name});
  }

  void evict(const std::string& name, ResponseMessage& msg) {
    auto it = cache_.find(name);
    const std::uint64_t id = it->second.id;
    retired_.emplace(id, std::make_pair(it->second.meta, next_seq_));
    cache_by_id_.erase(id);
    lru_.erase(it->second.lru);
    cache_.erase(it);
    msg.cache_evictions.push_back(id);
  }

  void retire_cache_entries() {
    if (retired_.empty()) return;
    const std::uint64_t oldest = *std::min_element(applied_.begin(), applied_.end());
    std::erase_if(retired_, [&](const auto& kv) { return kv.second.second < oldest; });
  }

  void check_stalls(Clock::time_point now, ResponseMessage& msg) {
    if (opt_.stall_check_disable || table_.empty()) return;
    bool warn = false, stop = false;
    for (auto& [name, p] : table_) {
      const double waited = seconds(now - p.first_seen);
      warn |= now - p.last_warned >= stall_check();
      if (opt_.stall_shutdown_time_seconds > 0 && waited >= opt_.stall_shutdown_time_seconds)
        stop = true;
    }
    // One report covers every op stalled by now, so they share the next reminder time.
    if (warn)
      for (auto& [name, p] : table_)
        if (now - p.first_seen >= stall_check()) p.last_warned = now;
    if (!warn && !stop) return;
    const std::string report = pending_report(now);
    if (stop) {
      msg.fatal = fmt::format(
          "dtrain: stall shutdown: ops have waited more than {} s "
          "(DTRAIN_STALL_SHUTDOWN_TIME_SECONDS) for ranks that never submitted them:{}\n"
          "One or more ranks took a different code path (e.g. skipped a step or an op) or are "
          "stuck; every rank must submit every op with the same name.",
          opt_.stall_shutdown_time_seconds, report);
      return;
    }
    ++stats_.stall_warnings;
    if (hooks_.stall_warning)
      hooks_.stall_warning(fmt::format(
          "dtrain: stalled ops: some ranks have been waiting more than {} s for others to submit "
          "the same op (DTRAIN_STALL_CHECK_TIME_SECONDS):{}",
          opt_.stall_check_time_seconds, report));
  }

  void fail_ops_waiting_for_shut_down_ranks() {
    if (shut_down_count_ == 0) return;
    std::vector<std::string> doomed;
    for (const auto& [name, p] : table_)
      for (int r = 0; r < opt_.size; ++r)
        if (!p.per_rank[r] && shut_down_[r]) {
          doomed.push_back(name);
          break;
        }
    for (const auto& name : doomed) {
      auto node = table_.extract(name);
      Ready r;
      r.request = *std::find_if(node.mapped().per_rank.begin(), node.mapped().per_rank.end(),
                                [](const auto& q) { return q.has_value(); })->operator->();
      std::vector<int> gone;
      for (int k = 0; k < opt_.size; ++k)
        if (!node.mapped().per_rank[k] && shut_down_[k]) gone.push_back(k);
      r.error = ErrorKind::shutdown;
      r.message = fmt::format("dtrain: {} '{}' can never complete: ranks [{}] called "
                              "dtrain::shutdown() without submitting it",
                              to_string(r.request.kind), name, fmt::join(gone, ", "));
      push_ready(std::move(r), Clock::now());
    }
  }

  ResponseMessage finish(ResponseMessage msg) {
    msg.seq = next_seq_++;
    return msg;
  }

  CoordinatorOptions opt_;
  CoordinatorHooks hooks_;
  std::unordered_map<std::string, Pending> table_;
  std::unordered_map<std::string, std::vector<Ready>> groups_;
  std::vector<Ready> ready_;
  std::int64_t ready_bytes_ = 0;
  Clock::time_point first_ready_;
  std::vector<bool> joined_;
  int joined_count_ = 0;
  int last_joined_ = -1;
  std::vector<bool> shut_down_;
  int shut_down_count_ = 0;
  bool shutdown_announced_ = false;
  std::vector<std::uint64_t> applied_;
  std::unordered_map<std::string, CacheEntry> cache_;
  std::unordered_map<std::uint64_t, std::string> cache_by_id_;
  std::map<std::uint64_t, std::pair<Request, std::uint64_t>> retired_;
  std::list<std::string> lru_;
  std::uint64_t next_cache_id_ = 1;
  std::uint64_t next_seq_ = 1;
  CoordinatorStats stats_;
};

}  // namespace dtrain::detail
