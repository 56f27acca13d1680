#pragma once
// Note [Generated names]
// An op without a name is called "<kind>.<n>" after a per-kind call count, so ranks pair their
// n-th unnamed allreduce. That holds only while every rank counts the same calls in the same
// order: one thread's program order gives that, several threads' interleaving does not (it
// differs from rank to rank, and so would which thread happens to call first). So unnamed calls
// belong to the thread that called dtrain::init(), which is the same thread of the program on
// every rank; other threads name their ops. An unnamed call from another thread is not counted
// (counting it would shift the owner's later names by a different amount on each rank) and ends
// the job on every rank (RequestMessage::fatal): the program expected that call to pair with
// one on each peer, and a peer that made it from its init thread would otherwise go on pairing
// its calls with unrelated ones.
//
// Each process set counts its own calls: its n-th unnamed allreduce pairs with the n-th of each
// other member, whatever else each member calls on other sets. Names are unique per set (Note
// [In-flight table]), so two sets' "allreduce.0" are two ops.
//
// A rank that joined (Note [Join] in runtime/negotiation/join_tracker.hpp) takes part in the
// others' ops without calling them, so its counts fall behind theirs: after the join its next
// unnamed op would pair with a different one (a wrong sum, or a stall). The coordinator sees every
// generated name (the name, or for a group's members the group's, reads "<kind>.<n>"), so a join's
// response carries, per kind, one past the highest count any member used on the set, and every
// member moves its counts up to that before join() returns. Generated names ("<kind>.<n>", and a
// generated group's members "<kind>.<n>.<i>") are reserved: a user's "allreduce.1" would otherwise
// take the place of the init thread's second unnamed allreduce on one rank and not on another.
#include <algorithm>
#include <array>
#include <charconv>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

#include <fmt/format.h>

#include "dtrain/runtime/negotiation/request.hpp"

namespace dtrain::detail {

inline constexpr std::size_t kOpKinds = 8;
// Per OpKind: how many generated names of that kind a set has used.
using NameCounts = std::array<std::uint64_t, kOpKinds>;

inline constexpr OpKind kAllOpKinds[kOpKinds] = {
    OpKind::allreduce, OpKind::allgather, OpKind::broadcast, OpKind::alltoall,
    OpKind::reducescatter, OpKind::barrier, OpKind::join, OpKind::process_set};

// The kind and count of a generated name "<kind>.<n>", or of a name made from one by appending
// ".<anything>" (a grouped op's members, an object's parts): nothing for any other name.
inline std::optional<std::pair<OpKind, std::uint64_t>> parse_generated_name(std::string_view name) {
  for (OpKind kind : kAllOpKinds) {
    const std::string_view k = to_string(kind);
    if (name.size() <= k.size() + 1 || name.substr(0, k.size()) != k || name[k.size()] != '.')
      continue;
    std::string_view digits = name.substr(k.size() + 1);
    digits = digits.substr(0, digits.find('.'));
    std::uint64_t n = 0;
    auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), n);
    if (!digits.empty() && ec == std::errc() && end == digits.data() + digits.size())
      return std::pair{kind, n};
  }
  return std::nullopt;
}

// Whether a user may not give `name`: it is a generated name ("<kind>.<n>") or the name of a
// generated group's member ("<kind>.<n>.<i>"), which it could take the place of (Note [Generated
// names]). Names built on a generated one with words ("broadcast.3.size") stay free: dtrain's own
// object collectives name their parts so.
inline bool is_reserved_name(std::string_view name) {
  if (!parse_generated_name(name)) return false;
  const std::string_view rest = name.substr(name.find('.') + 1);
  const auto dot = rest.find('.');
  if (dot == std::string_view::npos) return true;
  const std::string_view member = rest.substr(dot + 1);
  return !member.empty() &&
         member.find_first_not_of("0123456789") == std::string_view::npos;
}

inline std::string why_reserved(std::string_view name, OpKind kind) {
  return fmt::format("dtrain: {} '{}': names of the form '<op kind>.<number>' (e.g. 'allreduce.3', "
                     "and a grouped op's 'allreduce.3.0') are reserved for ops without a name, "
                     "whose generated names they could take the place of; choose another name",
                     kind, name);
}

class OpNamer {
 public:
  // The owner of unnamed ops is the thread that constructs the namer (the init thread).
  OpNamer() = default;

  // The next generated name of `kind` on `process_set`, or nothing when the calling thread may
  // not make unnamed ops (the caller then ends the job with why_refused()).
  std::optional<std::string> next(OpKind kind, std::int32_t process_set = 0) {
    if (std::this_thread::get_id() != owner_) return std::nullopt;
    std::lock_guard lock(mutex_);
    const auto n = counters_[process_set][static_cast<std::size_t>(kind)]++;
    return fmt::format("{}.{}", kind, n);
  }

  // A join on `process_set` ended: no count falls below the set's (Note [Generated names]).
  void catch_up(std::int32_t process_set, std::span<const std::uint64_t> counts) {
    std::lock_guard lock(mutex_);
    NameCounts& mine = counters_[process_set];
    for (std::size_t k = 0; k < counts.size() && k < mine.size(); ++k)
      mine[k] = std::max(mine[k], counts[k]);
  }

  static std::string why_refused(int rank, OpKind kind) {
    return fmt::format(
        "dtrain: rank {} made an unnamed {} from a thread other than the one that called "
        "dtrain::init(). Unnamed ops are paired across ranks by the order in which the init "
        "thread makes them, so a call from another thread cannot be paired safely, and dtrain "
        "stops on every rank. Give ops called from other threads explicit names "
        "(AllreduceOptions::name, the name argument).",
        rank, kind);
  }

 private:
  const std::thread::id owner_ = std::this_thread::get_id();
  std::mutex mutex_;  // the owner counts; the engine thread catches up after a join
  std::map<std::int32_t, NameCounts> counters_;  // by process set
};

}  // namespace dtrain::detail
