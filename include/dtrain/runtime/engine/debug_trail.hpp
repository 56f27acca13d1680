#pragma once
// The debug trail (DTRAIN_LOG_LEVEL=debug): what each rank submitted and what it was told to run,
// so a mismatch or a stall can be traced rank by rank.
#include <string>

#include <fmt/format.h>

#include "dtrain/core/logging.hpp"
#include "dtrain/runtime/negotiation/messages.hpp"

namespace dtrain::detail {

inline void log_submission(int rank, const Request& q) {
  if (!q.rejected.empty()) {
    log(LogLevel::debug, "rank {} submits {} '{}' rejected here: {}", rank, q.kind, q.name,
        q.rejected);
    return;
  }
  log(LogLevel::debug, "rank {} submits {} '{}'{}{}: {} [{}] on {}{}", rank, q.kind, q.name,
      q.process_set == 0 ? "" : fmt::format(" on process set {}", q.process_set),
      q.group.empty() ? "" : fmt::format(" (group '{}')", q.group), q.dtype,
      fmt::join(q.shape, ", "), q.device,
      q.kind == OpKind::allreduce || q.kind == OpKind::reducescatter
          ? fmt::format(", {}", q.reduce_op)
      : q.kind == OpKind::broadcast ? fmt::format(", root {}", q.root)
                                    : std::string());
}

inline void log_response(int rank, const Response& r) {
  if (r.error != ErrorKind::none) {
    log(LogLevel::debug, "rank {} is told {} [{}] failed: {}", rank, r.kind,
        fmt::join(r.names, ", "), r.error_message);
    return;
  }
  log(LogLevel::debug, "rank {} runs {} of {} tensor(s) [{}]{}: {} elements of {}",
      rank, r.kind, r.names.size(), fmt::join(r.names, ", "),
      r.process_set == 0 || r.kind == OpKind::process_set
          ? std::string()
          : fmt::format(" on process set {}", r.process_set),
      r.total_numel(), r.dtype);
}

}  // namespace dtrain::detail
