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
#include <array>
#include <atomic>
#include <cstdint>
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

  // The next generated name of `kind`, or nothing when the calling thread may not make unnamed
  // ops (the caller then ends the job with why_refused()).
  std::optional<std::string> next(OpKind kind) {
    if (std::this_thread::get_id() != owner_) return std::nullopt;
    const auto n = counters_[static_cast<std::size_t>(kind)].fetch_add(1, std::memory_order_relaxed);
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
  std::array<std::atomic<std::uint64_t>, 8> counters_{};  // by OpKind
};

}  // namespace dtrain::detail
