#pragma once
// An op the coordinator has settled: every rank it waits for has submitted it, or it failed before
// that. Validation across ranks (runtime/negotiation/cross_rank_validation.hpp) and the failed-op
// verdicts (runtime/negotiation/failed_ops.hpp) produce these; the fusion planner
// (runtime/negotiation/fusion_planner.hpp) turns them, in order, into the responses of the next
// message.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "dtrain/runtime/negotiation/messages.hpp"

namespace dtrain::detail {

// The error an op fails with, on every rank it concerns.
struct Verdict {
  ErrorKind error = ErrorKind::none;
  std::string message;
};

struct ReadyOp {
  Request request;                        // canonical: the first submitting rank's request
  std::vector<std::int64_t> rank_rows;    // allgather: dim 0 of every member, in set rank order
  std::int32_t contributors = 0;          // ranks that submitted it; the others have joined
  ErrorKind error = ErrorKind::none;
  std::string message;
  std::vector<std::int32_t> error_ranks;  // empty: every rank

  // `q` failing with `verdict` on ranks `error_ranks` (empty: every rank).
  static ReadyOp failure(const Request& q, const Verdict& verdict,
                         std::vector<std::int32_t> error_ranks) {
    ReadyOp op;
    op.request = q;
    op.error = verdict.error;
    op.message = verdict.message;
    op.error_ranks = std::move(error_ranks);
    return op;
  }

  bool failed() const noexcept { return error != ErrorKind::none; }
  // What the op adds to a fusion buffer: its tensor, or for an allgather every rank's rows.
  std::int64_t bytes() const {
    std::int64_t elements = request.numel();
    if (request.kind == OpKind::allgather && !failed()) {
      elements = 0;
      for (std::int64_t rows : rank_rows) elements += rows * request.row_numel();
    }
    return elements * static_cast<std::int64_t>(element_size(request.dtype));
  }
};

}  // namespace dtrain::detail
