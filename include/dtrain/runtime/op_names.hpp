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
#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <thread>

#include <fmt/format.h>

#include "dtrain/runtime/request.hpp"

namespace dtrain::detail {

class OpNamer {
 public:
  // The owner of unnamed ops is the thread that constructs the namer (the init thread).
  OpNamer() = default;

  // The next generated name of `kind` on `process_set`, or nothing when the calling thread may
  // not make unnamed ops (the caller then ends the job with why_refused()).
  std::optional<std::string> next(OpKind kind, std::int32_t process_set = 0) {
    if (std::this_thread::get_id() != owner_) return std::nullopt;
    const auto n = counters_[process_set][static_cast<std::size_t>(kind)]++;
    return fmt::format("{}.{}", kind, n);
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
  // By process set, then by OpKind; only the owner thread touches them.
  std::map<std::int32_t, std::array<std::uint64_t, 8>> counters_;
};

}  // namespace dtrain::detail
