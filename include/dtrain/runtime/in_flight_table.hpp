#pragma once
// Note [In-flight table]
// The ops this rank has submitted and not yet completed, by name, plus the queue of those the
// engine thread has not yet sent to the coordinator and this rank's join. Names are unique among
// in-flight ops: a second submission of a name still in flight is refused, all or nothing for a
// group, and leaves the first untouched (SPEC §4). One exception: a name this rank rejected (Note
// [Failed ops] in runtime/failed_ops.hpp) is settled by the coordinator within a round trip, so
// its successor waits for that instead of failing. The table is not thread-safe: the engine holds
// its mutex around every call.
#include <chrono>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "dtrain/core/error.hpp"
#include "dtrain/runtime/entry.hpp"
#include "dtrain/runtime/op_state.hpp"

namespace dtrain::detail {

class InFlightTable {
 public:
  using Clock = std::chrono::steady_clock;

  // Adds `entries` (all or none) and queues them for the engine thread. Returns the state of a
  // rejection of one of their names that is still being settled: nothing was added, and the caller
  // waits for it and tries again. Throws InvalidArgumentError for a name already in flight (or
  // twice in `entries`) and for a second join.
  std::shared_ptr<OpState> add(const std::vector<std::shared_ptr<Entry>>& entries, int rank,
                               Clock::time_point now) {
    for (std::size_t i = 0; i < entries.size(); ++i) {
      const auto& q = entries[i]->request;
      if (q.kind == OpKind::join) {
        if (join_) throw InvalidArgumentError("dtrain: join() is already in flight on this rank");
        continue;
      }
      auto it = by_name_.find(q.name);
      if (it != by_name_.end() && !it->second->request.rejected.empty()) return it->second->state;
      bool repeated = it != by_name_.end();
      for (std::size_t j = 0; j < i && !repeated; ++j) repeated = entries[j]->request.name == q.name;
      if (repeated)
        throw InvalidArgumentError(fmt::format(
            "dtrain: an op named '{}' is already in flight on rank {}: names must be unique "
            "among in-flight ops (wait for the first one, or give the second a different name)",
            q.name, rank));
    }
    for (const auto& e : entries) {
      e->submitted = now;
      if (e->request.kind == OpKind::join) join_ = e;
      else by_name_.emplace(e->request.name, e);
      queued_.push_back(e);
    }
    return nullptr;
  }

  // The entries added since the last call, for the engine thread to send.
  std::vector<std::shared_ptr<Entry>> take_queued() { return std::exchange(queued_, {}); }
  bool has_queued() const noexcept { return !queued_.empty(); }

  // Removes and returns the in-flight op `name` (null: none, e.g. this rank joined).
  std::shared_ptr<Entry> take(const std::string& name) {
    auto it = by_name_.find(name);
    if (it == by_name_.end()) return nullptr;
    auto e = std::move(it->second);
    by_name_.erase(it);
    return e;
  }
  const Entry* find(const std::string& name) const {
    auto it = by_name_.find(name);
    return it == by_name_.end() ? nullptr : it->second.get();
  }

  std::shared_ptr<Entry> take_join() { return std::move(join_); }

  // Whether anything awaits the peers.
  bool awaiting() const noexcept { return !by_name_.empty() || join_ != nullptr; }

  // Removes and returns everything, for failing it.
  std::vector<std::shared_ptr<Entry>> drain() {
    std::vector<std::shared_ptr<Entry>> all;
    for (auto& [name, e] : by_name_) all.push_back(std::move(e));
    by_name_.clear();
    queued_.clear();  // each queued entry is in by_name_, or is the join
    if (join_) all.push_back(std::move(join_));
    return all;
  }

 private:
  std::unordered_map<std::string, std::shared_ptr<Entry>> by_name_;
  std::vector<std::shared_ptr<Entry>> queued_;
  std::shared_ptr<Entry> join_;
};

}  // namespace dtrain::detail
