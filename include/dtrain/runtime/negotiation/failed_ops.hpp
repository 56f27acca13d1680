#pragma once
// Failed-op verdicts: what the coordinator remembers of ops that failed before every rank had
// submitted them, and what each rank said about the size of a group still being negotiated.
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
// A group fails as a whole, and its verdict is kept by group: a rank submits every member of a
// group in one message, so the verdict is settled for that rank once the whole message has been
// read (message_read()), and each member it submitted fails with it.
//
// Each process set keeps its own verdicts, and waits only for its members: a rank outside the set
// never submits the name, so it holds no verdict open.
#include <algorithm>
#include <cstdint>
#include <iterator>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dtrain/runtime/negotiation/messages.hpp"
#include "dtrain/runtime/negotiation/ready_op.hpp"

namespace dtrain::detail {

// Each verdict names the op's process set after the op with `on_set` (SetMembers::label()).

// The verdict on `q`, which rank `rank` refused to submit (Request::rejected).
inline Verdict rejected_verdict(int rank, const Request& q, std::string_view on_set = {}) {
  return {ErrorKind::invalid_argument,
          fmt::format("dtrain: {}{} '{}'{} was rejected on rank {}: {}",
                      q.group.empty() ? "" : "grouped_", q.kind,
                      q.group.empty() ? q.name : q.group, on_set, rank, q.rejected)};
}

// The verdict on op `name`, which ranks `absent` have not submitted within the op timeout.
inline Verdict timed_out_verdict(OpKind kind, std::string_view name, double op_timeout_seconds,
                                 std::span<const std::int32_t> absent,
                                 std::span<const std::int32_t> submitted,
                                 std::string_view on_set = {}) {
  return {ErrorKind::timeout,
          fmt::format("dtrain: {} '{}'{} timed out after {} s (DTRAIN_OP_TIMEOUT_SECONDS): ranks "
                      "[{}] never submitted it (submitted by ranks [{}]). Those ranks took a "
                      "different code path, are stuck, or are still busy; if a rank "
                      "legitimately works alone for that long, raise DTRAIN_OP_TIMEOUT_SECONDS.",
                      kind, name, on_set, op_timeout_seconds, fmt::join(absent, ", "),
                      fmt::join(submitted, ", "))};
}

// The verdict on op `name`, which ranks `gone` shut down without submitting.
inline Verdict shut_down_verdict(OpKind kind, std::string_view name, std::span<const int> gone,
                                 std::string_view on_set = {}) {
  return {ErrorKind::shutdown,
          fmt::format("dtrain: {} '{}'{} can never complete: ranks [{}] called dtrain::shutdown() "
                      "without submitting it",
                      kind, name, on_set, fmt::join(gone, ", "))};
}

class FailedOps {
 public:
  // For ops of the world ranks marked in `members` (by world rank).
  explicit FailedOps(std::vector<bool> members)
      : size_(static_cast<int>(members.size())), outside_(std::move(members)) {
    outside_.flip();
  }
  // For ops of a world of `size` ranks.
  explicit FailedOps(int size)
      : FailedOps(std::vector<bool>(static_cast<std::size_t>(size), true)) {}

  // The verdict that rank `rank`, submitting `q`, gets at once: its name or its group failed
  // before this rank submitted it. nullopt: `q` is a new op.
  std::optional<Verdict> verdict_for(int rank, const Request& q) {
    if (auto it = by_name_.find(q.name); it != by_name_.end() && !it->second.settled[rank]) {
      Verdict v = it->second.verdict;
      settle(by_name_, q.name, rank);
      return v;
    }
    if (q.group.empty()) return std::nullopt;
    auto g = by_group_.find(q.group);
    if (g == by_group_.end() || g->second.settled[rank]) return std::nullopt;
    settling_.emplace_back(q.group, rank);
    return g->second.verdict;
  }

  // A rank's whole message has been read: the group verdicts it was handed are settled for it.
  void message_read() {
    for (const auto& [group, rank] : settling_) settle(by_group_, group, rank);
    settling_.clear();
  }

  // Records the size of `q.group` that rank `rank` states with `q`. When the ranks that stated it
  // disagree: the error the whole group fails with (fail_group()).
  std::optional<std::string> group_size_mismatch(int rank, const Request& q) {
    GroupSizes& sizes = group_sizes_[q.group];
    if (sizes.empty()) sizes.resize(size_);
    if (!sizes[rank]) sizes[rank] = q.group_size;
    // An empty group's stand-in is a barrier: the error names the kind its members have.
    if (q.group_size > 0) group_kinds_.try_emplace(q.group, q.kind);
    const bool agree = std::all_of(sizes.begin(), sizes.end(), [&](const auto& n) {
      return !n || *n == q.group_size;
    });
    if (agree) return std::nullopt;
    std::map<std::int32_t, std::vector<int>> by_size;
    for (int k = 0; k < size_; ++k)
      if (sizes[k]) by_size[*sizes[k]].push_back(k);
    std::string values;
    for (const auto& [n, ranks] : by_size)
      values += fmt::format("{}{} on ranks [{}]", values.empty() ? "" : "; ", n,
                            fmt::join(ranks, ", "));
    return fmt::format("dtrain: ranks disagree on the number of tensors in grouped_{} "
                       "'{}': {}. Every rank must pass the same number of tensors.",
                       group_kinds_.contains(q.group) ? group_kinds_.at(q.group) : q.kind,
                       q.group, values);
  }

  // Every rank has submitted every member of `group`: its size is settled.
  void group_complete(const std::string& group) {
    group_sizes_.erase(group);
    group_kinds_.erase(group);
  }

  // Remembers that op `name` failed, for the ranks other than `told` (those that submitted it, and
  // fail now) that have not shut down.
  void fail_name(const std::string& name, Verdict verdict, std::span<const std::int32_t> told,
                 const std::vector<bool>& shut_down) {
    Remembered f{std::move(verdict), outside_};
    for (std::int32_t r : told) f.settled[r] = true;
    remember(by_name_, name, std::move(f), shut_down);
  }

  // Remembers that `group` failed, for the ranks that have not stated its size. `arriving_rank`
  // is the rank whose message is being read (its members fail now, and the verdict is settled
  // for it once the message is read); -1 when none is.
  void fail_group(const std::string& group, Verdict verdict, int arriving_rank,
                  const std::vector<bool>& shut_down) {
    Remembered f{std::move(verdict), outside_};
    if (auto g = group_sizes_.find(group); g != group_sizes_.end()) {
      // A rank that stated the group's size has submitted all its members already.
      for (int k = 0; k < size_; ++k)
        f.settled[k] = outside_[k] || (k != arriving_rank && g->second[k].has_value());
      group_sizes_.erase(g);
    }
    group_kinds_.erase(group);
    if (arriving_rank >= 0) {
      settling_.emplace_back(group, arriving_rank);
      by_group_[group] = std::move(f);
    } else {
      remember(by_group_, group, std::move(f), shut_down);
    }
  }

  // A rank that shut down will never submit: it no longer holds a remembered verdict open.
  void rank_shut_down(int rank) {
    for (auto* verdicts : {&by_name_, &by_group_}) {
      for (auto it = verdicts->begin(); it != verdicts->end();) {
        it->second.settled[rank] = true;
        it = all_settled(it->second) ? verdicts->erase(it) : std::next(it);
      }
    }
  }

  // Verdicts still waiting for ranks that have not submitted the name or group.
  std::size_t remembered() const noexcept { return by_name_.size() + by_group_.size(); }

 private:
  struct Remembered {
    Verdict verdict;
    std::vector<bool> settled;  // per rank: has submitted the name (or shut down)
  };
  using Verdicts = std::unordered_map<std::string, Remembered>;
  using GroupSizes = std::vector<std::optional<std::int32_t>>;  // per rank, once stated

  static bool all_settled(const Remembered& f) {
    return std::all_of(f.settled.begin(), f.settled.end(), [](bool b) { return b; });
  }
  static void settle(Verdicts& verdicts, const std::string& key, int rank) {
    auto it = verdicts.find(key);
    if (it == verdicts.end()) return;
    it->second.settled[rank] = true;
    if (all_settled(it->second)) verdicts.erase(it);
  }
  void remember(Verdicts& verdicts, const std::string& key, Remembered f,
                const std::vector<bool>& shut_down) {
    for (int k = 0; k < size_; ++k) f.settled[k] = f.settled[k] || shut_down[k] || outside_[k];
    if (!all_settled(f)) verdicts[key] = std::move(f);
  }

  int size_;
  std::vector<bool> outside_;  // by world rank: not a member, never submits
  Verdicts by_name_;
  Verdicts by_group_;
  std::unordered_map<std::string, GroupSizes> group_sizes_;
  std::unordered_map<std::string, OpKind> group_kinds_;  // of the members, where any is known
  std::vector<std::pair<std::string, int>> settling_;  // (group, rank) settled after a message
};

}  // namespace dtrain::detail
