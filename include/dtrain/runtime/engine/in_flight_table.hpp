#pragma once
// Note [In-flight table]
// The ops this rank has submitted and not yet completed, by name within their process set, plus
// the queue of those the engine thread has not yet sent to the coordinator and this rank's joins
// (one per set). Names are unique among a set's in-flight ops: a second submission of a name
// still in flight on the same set is refused, all or nothing for a group, and leaves the first
// untouched (SPEC §4). One exception: a name this rank rejected (Note
// [Failed ops] in runtime/negotiation/failed_ops.hpp) is settled by the coordinator within a round
// trip, so its successor waits for that instead of failing. The table is not thread-safe: the
// engine holds its mutex around every call.
//
// A second submission from the thread that made the first is refused on every rank alike: one
// thread's program order is the same everywhere. From another thread it is not: which of two
// threads gets there first differs from rank to rank, so each rank would refuse a different one
// and the survivors would pair with each other, summing unrelated tensors with no error. So a name
// in flight from another thread ends the job on every rank (NameInFlightOnAnotherThread; the
// engine hands the cause to the coordinator), as an unnamed op from a foreign thread does (Note
// [Generated names]). Names must differ between threads.
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "dtrain/core/error.hpp"
#include "dtrain/runtime/execution/entry.hpp"
#include "dtrain/runtime/execution/op_state.hpp"
#include "dtrain/runtime/negotiation/op_key.hpp"

namespace dtrain::detail {

// A name submitted while an op of that name is in flight from another thread of this rank.
class NameInFlightOnAnotherThread : public InvalidArgumentError {
 public:
  using InvalidArgumentError::InvalidArgumentError;
};

class InFlightTable {
 public:
  using Clock = std::chrono::steady_clock;

  // Adds `entries` (all or none) and queues them for the engine thread. Returns the state of a
  // rejection of one of their names that is still being settled: nothing was added, and the caller
  // waits for it and tries again. Throws InvalidArgumentError for a name already in flight (or
  // twice in `entries`) and for a second join; NameInFlightOnAnotherThread for a name in flight
  // from another thread.
  std::shared_ptr<OpState> add(const std::vector<std::shared_ptr<Entry>>& entries, int rank,
                               Clock::time_point now) {
    for (std::size_t i = 0; i < entries.size(); ++i) {
      const auto& q = entries[i]->request;
      if (q.kind == OpKind::join) {
        if (joins_.contains(q.process_set))
          throw InvalidArgumentError(fmt::format(
              "dtrain: join() is already in flight on this rank{}", set_text(q.process_set)));
        continue;
      }
      auto it = by_name_.find(OpKey::of(q));
      if (it != by_name_.end() && !it->second->request.rejected.empty()) return it->second->state;
      if (it != by_name_.end() && it->second->submitter != std::this_thread::get_id())
        throw NameInFlightOnAnotherThread(fmt::format(
            "dtrain: rank {}: two threads use the op name '{}'{}: it was submitted from one "
            "thread while the same name, submitted from another, was still in flight. Which "
            "thread's op pairs with which of a peer's depends on timing, so results could be "
            "summed with unrelated tensors; dtrain stops on every rank. Ops submitted from "
            "different threads must have different names (e.g. prefix each with its thread's "
            "role).",
            rank, q.name, set_text(q.process_set)));
      bool repeated = it != by_name_.end();
      for (std::size_t j = 0; j < i && !repeated; ++j)
        repeated = OpKey::of(entries[j]->request) == OpKey::of(q);
      if (repeated)
        throw InvalidArgumentError(fmt::format(
            "dtrain: an op named '{}' is already in flight on rank {}{}: names must be unique "
            "among in-flight ops (wait for the first one, or give the second a different name)",
            q.name, rank, set_text(q.process_set)));
    }
    for (const auto& e : entries) {
      e->submitted = now;
      e->submitter = std::this_thread::get_id();
      if (e->request.kind == OpKind::join) joins_.emplace(e->request.process_set, e);
      else by_name_.emplace(OpKey::of(e->request), e);
      queued_.push_back(e);
    }
    return nullptr;
  }

  // The entries added since the last call, for the engine thread to send.
  std::vector<std::shared_ptr<Entry>> take_queued() { return std::exchange(queued_, {}); }
  bool has_queued() const noexcept { return !queued_.empty(); }

  // Removes and returns the in-flight op `key` (null: none, e.g. this rank joined).
  std::shared_ptr<Entry> take(const OpKey& key) {
    auto it = by_name_.find(key);
    if (it == by_name_.end()) return nullptr;
    auto e = std::move(it->second);
    by_name_.erase(it);
    return e;
  }
  const Entry* find(const OpKey& key) const {
    auto it = by_name_.find(key);
    return it == by_name_.end() ? nullptr : it->second.get();
  }

  // Removes and returns this rank's join of `process_set` (null: none).
  std::shared_ptr<Entry> take_join(std::int32_t process_set) {
    auto it = joins_.find(process_set);
    if (it == joins_.end()) return nullptr;
    auto e = std::move(it->second);
    joins_.erase(it);
    return e;
  }

  // Whether anything awaits the peers.
  bool awaiting() const noexcept { return !by_name_.empty() || !joins_.empty(); }

  // Removes and returns everything, for failing it.
  std::vector<std::shared_ptr<Entry>> drain() {
    std::vector<std::shared_ptr<Entry>> all;
    for (auto& [key, e] : by_name_) all.push_back(std::move(e));
    by_name_.clear();
    queued_.clear();  // each queued entry is in by_name_, or is a join
    for (auto& [set, e] : joins_) all.push_back(std::move(e));
    joins_.clear();
    return all;
  }

 private:
  static std::string set_text(std::int32_t process_set) {
    return process_set == 0 ? std::string() : fmt::format(" on process set {}", process_set);
  }

  std::unordered_map<OpKey, std::shared_ptr<Entry>, OpKeyHash> by_name_;
  std::vector<std::shared_ptr<Entry>> queued_;
  std::unordered_map<std::int32_t, std::shared_ptr<Entry>> joins_;  // by process set
};

}  // namespace dtrain::detail
