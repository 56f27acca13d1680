#pragma once
// The coordinator's stall inspector: when to warn that ranks wait for others, and when to give up.
//
// Note [Stall inspection]
// Something waits for ranks from a moment on: an op from its first submission, the join from the
// last request of the ranks it waits for (Note [Join] in runtime/negotiation/join_tracker.hpp). A
// warning is due DTRAIN_STALL_CHECK_TIME_SECONDS after the later of that moment and the previous
// warning, and one warning reports everything pending; the job stops
// DTRAIN_STALL_SHUTDOWN_TIME_SECONDS (if set) after that moment. Both thresholds are therefore
// reached first by the oldest waiter, and the inspector needs only its start and the time of the
// last warning, never a clock per op.
#include <algorithm>
#include <chrono>
#include <optional>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "dtrain/core/config.hpp"

namespace dtrain::detail {

class StallInspector {
 public:
  using Clock = std::chrono::steady_clock;
  enum class Verdict { none, warn, shut_down };

  explicit StallInspector(const StallSettings& o) : options_(o) {}

  // For waits of which the oldest began at `oldest`.
  Verdict judge(Clock::time_point oldest, Clock::time_point now) const {
    if (options_.stall_shutdown_time_seconds > 0 && now - oldest >= seconds(options_.stall_shutdown_time_seconds))
      return Verdict::shut_down;
    if (!options_.stall_check_disable &&
        now - std::max(oldest, last_warning_) >= seconds(options_.stall_check_time_seconds))
      return Verdict::warn;
    return Verdict::none;
  }

  // When judge() next changes its mind for waits of which the oldest began at `oldest`.
  std::optional<Clock::time_point> next_deadline(Clock::time_point oldest) const {
    std::optional<Clock::time_point> t;
    if (!options_.stall_check_disable) t = std::max(oldest, last_warning_) + seconds(options_.stall_check_time_seconds);
    if (options_.stall_shutdown_time_seconds > 0) {
      const auto stop = oldest + seconds(options_.stall_shutdown_time_seconds);
      if (!t || stop < *t) t = stop;
    }
    return t;
  }

  // The warning for `report` (what is pending and who is missing), issued at `now`.
  std::string warn(std::string_view report, Clock::time_point now) {
    last_warning_ = now;
    return fmt::format(
        "dtrain: stalled ops: some ranks have been waiting more than {} s for others to submit "
        "the same op (DTRAIN_STALL_CHECK_TIME_SECONDS):{}\nRun with DTRAIN_LOG_LEVEL=debug to "
        "see what each rank submitted.",
        options_.stall_check_time_seconds, report);
  }

  // The error every pending op fails with at a stall shutdown.
  std::string shutdown_message(std::string_view report) const {
    return fmt::format(
        "dtrain: stall shutdown: ops have waited more than {} s "
        "(DTRAIN_STALL_SHUTDOWN_TIME_SECONDS) for ranks that never submitted them:{}\n"
        "One or more ranks took a different code path (e.g. skipped a step or an op) or are "
        "stuck; every rank must submit every op with the same name. Run with "
        "DTRAIN_LOG_LEVEL=debug to see what each rank submitted.",
        options_.stall_shutdown_time_seconds, report);
  }

 private:
  static Clock::duration seconds(double s) {
    return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
  }

  StallSettings options_;
  Clock::time_point last_warning_{};  // epoch: none yet
};

}  // namespace dtrain::detail
