#pragma once
// Both halves of the response cache: the coordinator's cache, which alone inserts and evicts, and
// every engine's mirror of it.
//
// Note [Response cache]
// After an allreduce, broadcast or reducescatter succeeds, the coordinator assigns its name and
// metadata a cache id and announces it to every rank. A rank that later submits the same name with
// the same metadata sends only the id. Only the coordinator inserts and evicts, so every rank's
// mirror changes in the same order; an evicted id stays resolvable ("retired") until every rank
// has applied the message that evicted it, so a rank that sent an id just before learning of its
// eviction is still understood. An entry stands for a name within its process set (the set is
// part of the negotiated metadata), so sets that use the same names keep entries of their own.
#include <algorithm>
#include <cstdint>
#include <list>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include "dtrain/core/error.hpp"
#include "dtrain/runtime/negotiation/messages.hpp"
#include "dtrain/runtime/negotiation/op_key.hpp"

namespace dtrain::detail {

// The coordinator's half: least recently used names, at most `capacity` (0: no cache).
class ResponseCache {
 public:
  explicit ResponseCache(std::int64_t capacity) : capacity_(capacity) {}

  std::size_t size() const noexcept { return cache_.size(); }

  // The request an id stands for, while any rank may still send it.
  Request resolve(std::uint64_t id) const {
    if (auto it = by_id_.find(id); it != by_id_.end()) return cache_.at(it->second).meta;
    if (auto it = retired_.find(id); it != retired_.end()) return it->second.meta;
    throw Error(fmt::format("dtrain: internal error: unknown response-cache id {}", id));
  }

  // Records that `q` succeeded in message `msg` (sequence number `seq`): inserts or refreshes its
  // entry, evicting the least recently used one when full, and announces both in `msg`.
  void note_success(const Request& q, ResponseMessage& msg, std::uint64_t seq) {
    if (capacity_ <= 0) return;
    if (q.kind != OpKind::allreduce && q.kind != OpKind::broadcast && q.kind != OpKind::reducescatter)
      return;
    OpKey key = OpKey::of(q);
    if (auto it = cache_.find(key); it != cache_.end()) {
      if (it->second.meta.same_metadata(q)) {
        lru_.splice(lru_.begin(), lru_, it->second.lru);
        return;
      }
      evict(key, msg, seq);
    }
    if (static_cast<std::int64_t>(cache_.size()) >= capacity_) evict(lru_.back(), msg, seq);
    const std::uint64_t id = next_id_++;
    lru_.push_front(key);
    cache_.emplace(key, Entry{id, q, lru_.begin()});
    by_id_.emplace(id, key);
    msg.cache_inserts.push_back({id, q.name, q.process_set});
  }

  // A new capacity (the autotuner switching the cache off or on): entries beyond it are evicted
  // in `msg`, least recently used first, and retire like any other eviction.
  void set_capacity(std::int64_t capacity, ResponseMessage& msg, std::uint64_t seq) {
    capacity_ = capacity;
    while (!lru_.empty() && static_cast<std::int64_t>(cache_.size()) > std::max<std::int64_t>(capacity_, 0))
      evict(lru_.back(), msg, seq);
  }

  // Forgets retired ids once every rank has applied (per rank: `applied`) the message that evicted
  // them.
  void retire(const std::vector<std::uint64_t>& applied) {
    if (retired_.empty()) return;
    const std::uint64_t oldest = *std::min_element(applied.begin(), applied.end());
    std::erase_if(retired_, [&](const auto& kv) { return kv.second.evicted_in < oldest; });
  }

 private:
  struct Entry {
    std::uint64_t id;
    Request meta;
    std::list<OpKey>::iterator lru;
  };
  struct Retired {
    Request meta;
    std::uint64_t evicted_in;  // sequence number of the message that evicted it
  };

  void evict(OpKey key, ResponseMessage& msg, std::uint64_t seq) {
    auto it = cache_.find(key);
    const std::uint64_t id = it->second.id;
    retired_.emplace(id, Retired{it->second.meta, seq});
    by_id_.erase(id);
    lru_.erase(it->second.lru);
    cache_.erase(it);
    msg.cache_evictions.push_back(id);
  }

  std::int64_t capacity_;
  std::unordered_map<OpKey, Entry, OpKeyHash> cache_;
  std::unordered_map<std::uint64_t, OpKey> by_id_;
  std::map<std::uint64_t, Retired> retired_;
  std::list<OpKey> lru_;
  std::uint64_t next_id_ = 1;
};

// An engine's half: the ids the coordinator has announced, applied in the order it sent them.
class CacheMirror {
 public:
  // The id to send instead of `q`, when the coordinator knows `q` by name with the same metadata.
  std::optional<std::uint64_t> id_for(const Request& q) const {
    if (!q.rejected.empty()) return std::nullopt;
    auto it = by_name_.find(OpKey::of(q));
    if (it == by_name_.end() || !it->second.request.same_metadata(q)) return std::nullopt;
    return it->second.id;
  }

  void insert(std::uint64_t id, const Request& q) {
    by_name_[OpKey::of(q)] = Known{id, q};
    names_[id] = OpKey::of(q);
  }

  void evict(std::uint64_t id) {
    auto it = names_.find(id);
    if (it == names_.end()) return;
    if (auto m = by_name_.find(it->second); m != by_name_.end() && m->second.id == id)
      by_name_.erase(m);
    names_.erase(it);
  }

 private:
  struct Known {
    std::uint64_t id;
    Request request;
  };
  std::unordered_map<OpKey, Known, OpKeyHash> by_name_;
  std::unordered_map<std::uint64_t, OpKey> names_;
};

}  // namespace dtrain::detail
