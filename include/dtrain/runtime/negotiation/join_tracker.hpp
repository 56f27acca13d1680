#pragma once
// The coordinator's side of join(): which ranks have joined, and when the join completes, fails
// or times out.
//
// Note [Join]
// A rank that joined takes part in every allreduce, allgather and broadcast with nothing of its own
// until every rank has joined. The join is waiting on the ranks that have not joined; it stalls
// when all of them have gone quiet (no request for the stall check time), it times out after
// DTRAIN_OP_TIMEOUT_SECONDS of such silence, and it fails at once when one of them shuts down
// without joining, so neither a stalled peer nor a shut-down one leaves the joined ranks waiting.
//
// An op is therefore ready once every rank that has not joined has submitted it (Note
// [Negotiation] in runtime/negotiation/coordinator.hpp), and which ops accept joined ranks is Note
// [Validation across ranks] (runtime/negotiation/cross_rank_validation.hpp). Once the join is over,
// by completing or failing, every rank counts again.
//
// Each process set has a join of its own, among its members: a rank that joined one set still
// takes part in the others' ops, and join() on the world is the world's.
#include <algorithm>
#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dtrain/runtime/negotiation/messages.hpp"
#include "dtrain/runtime/negotiation/set_members.hpp"

namespace dtrain::detail {

class JoinTracker {
 public:
  using Clock = std::chrono::steady_clock;

  // For the members of a process set; the join times out after `op_timeout_seconds` of silence
  // from the ranks it waits for (0: never).
  JoinTracker(const SetMembers& members, double op_timeout_seconds)
      : op_timeout_seconds_(op_timeout_seconds), process_set_(members.id()),
        on_set_(members.label()), member_(static_cast<std::size_t>(members.world_size()), false),
        joined_(member_.size(), false), last_heard_(member_.size()) {
    for (std::int32_t r : members.ranks()) member_[static_cast<std::size_t>(r)] = true;
    member_count_ = members.count();
  }
  // For a world of `size` ranks.
  JoinTracker(int size, double op_timeout_seconds)
      : JoinTracker(SetMembers::world(size), op_timeout_seconds) {}

  // Rank `rank` sent requests at `now`: it is not silent.
  void heard_from(int rank, Clock::time_point now) { last_heard_[rank] = now; }

  void join(int rank, Clock::time_point now) {
    if (joined_[rank]) return;
    if (joined_count_ == 0) started_ = now;
    joined_[rank] = true;
    ++joined_count_;
    last_joined_ = rank;
  }

  bool has_joined(int rank) const { return joined_[rank]; }
  // Whether a join is under way: some rank has joined, and not all have been told it is over.
  bool active() const noexcept { return joined_count_ > 0; }

  // Since when every rank the join waits for has been quiet.
  Clock::time_point quiet_since() const {
    Clock::time_point t = started_;
    for (std::size_t r = 0; r < joined_.size(); ++r)
      if (member_[r] && !joined_[r]) t = std::max(t, last_heard_[r]);
    return t;
  }

  // When the join times out unless a rank it waits for is heard from, if it can time out.
  std::optional<Clock::time_point> timeout_deadline() const {
    if (!active() || op_timeout_seconds_ <= 0) return std::nullopt;
    return quiet_since() + op_timeout();
  }

  // The join's response when it is over at `now` (then a new join may begin): every rank has
  // joined, a rank it waits for has shut down (per rank: `shut_down`), or those ranks have been
  // quiet for the op timeout. nullopt while it waits.
  std::optional<Response> conclude(Clock::time_point now, const std::vector<bool>& shut_down) {
    if (!active()) return std::nullopt;
    Response j;
    j.kind = OpKind::join;
    j.names = {"join"};
    j.process_set = process_set_;
    if (joined_count_ == member_count_) {
      j.last_joined_rank = last_joined_;
    } else {
      std::vector<int> gone;
      for (int r : ranks(false))
        if (shut_down[static_cast<std::size_t>(r)]) gone.push_back(r);
      if (!gone.empty()) {
        j.error = ErrorKind::shutdown;
        j.error_message = fmt::format(
            "dtrain: join(){} can never complete: ranks [{}] called dtrain::shutdown() without "
            "joining (joined: ranks [{}])",
            on_set_, fmt::join(gone, ", "), fmt::join(ranks(true), ", "));
      } else if (op_timeout_seconds_ > 0 && now - quiet_since() >= op_timeout()) {
        j.error = ErrorKind::timeout;
        j.error_message = fmt::format(
            "dtrain: join(){} timed out after {} s (DTRAIN_OP_TIMEOUT_SECONDS): ranks [{}] have "
            "neither joined nor submitted any op for that long (joined: ranks [{}])",
            on_set_, op_timeout_seconds_, fmt::join(ranks(false), ", "),
            fmt::join(ranks(true), ", "));
      } else {
        return std::nullopt;
      }
    }
    if (j.error != ErrorKind::none)
      for (int r : ranks(true)) j.error_ranks.push_back(r);
    std::fill(joined_.begin(), joined_.end(), false);
    joined_count_ = 0;
    return j;
  }

  // The join's line in the coordinator's report of what is pending, or "" when none is under way.
  std::string describe(Clock::time_point now) const {
    if (!active()) return {};
    return fmt::format("\n  join{}: joined by ranks [{}], waiting for ranks [{}], from which no "
                       "request has come for {:.1f} s",
                       on_set_, fmt::join(ranks(true), ", "), fmt::join(ranks(false), ", "),
                       std::chrono::duration<double>(now - quiet_since()).count());
  }

 private:
  Clock::duration op_timeout() const {
    return std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double>(op_timeout_seconds_));
  }
  // The members that have joined (`joined`: true) or not, ascending.
  std::vector<int> ranks(bool joined) const {
    std::vector<int> out;
    for (std::size_t r = 0; r < joined_.size(); ++r)
      if (member_[r] && joined_[r] == joined) out.push_back(static_cast<int>(r));
    return out;
  }

  double op_timeout_seconds_;
  std::int32_t process_set_;
  std::string on_set_;        // SetMembers::label()
  std::vector<bool> member_;  // by world rank
  int member_count_ = 0;
  std::vector<bool> joined_;
  int joined_count_ = 0;
  int last_joined_ = -1;
  Clock::time_point started_;
  std::vector<Clock::time_point> last_heard_;  // per rank: its last request
};

}  // namespace dtrain::detail
