#pragma once
// The fusion planner: which ready ops share a response, and in what order responses run.
//
// Note [Fusion planning]
// The coordinator hands the planner the ops that became ready since its last message, in the
// order they became ready, and sends the plan to every rank, which executes it in that order
// (Note [Negotiation] in runtime/negotiation/coordinator.hpp): a plan is made once, on rank 0,
// never by each rank for itself. Like the bucket assignment of PyTorch's c10d Reducer, the plan is
// a function of its inputs alone (the ready ops and the fusion threshold) with no state carried
// from one plan to the next, so the same ready ops always give the same responses.
//
// Successful allreduces fuse with ops of the same dtype, device, reduce op, prescale and
// postscale factors and number of contributing ranks: one collective must do the same arithmetic
// on every element, and Average divides by the contributors. Successful allgathers of host memory
// fuse with allgathers of the same dtype and contributors (Note [Fused allgather] in
// runtime/execution/host_backend.hpp); what they add to the buffer is every rank's rows. Each such
// op joins the first response opened before it that it matches and that stays within the threshold
// with it; otherwise it opens a response of its own. An op larger than the threshold, or any op
// when the threshold is 0, goes alone, as does every other kind of op and every failed one.
// Responses keep the order in which they were opened, and the names in a response the order of the
// ready ops, so a fused buffer has the same layout on every rank. The coordinator plans each
// process set on its own, so ops of different sets never share a response.
#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "dtrain/runtime/negotiation/messages.hpp"
#include "dtrain/runtime/negotiation/ready_op.hpp"

namespace dtrain::detail {

// Whether `op` may share a response with others (Note [Fusion planning]).
inline bool fusable(const ReadyOp& op) noexcept {
  if (op.failed()) return false;
  return op.request.kind == OpKind::allreduce ||
         (op.request.kind == OpKind::allgather && !op.request.device.is_cuda());
}

// The response that runs (or fails) `op` on its own.
inline Response response_for(const ReadyOp& op) {
  const Request& q = op.request;
  Response s;
  s.kind = q.kind;
  s.names = {q.name};
  s.numels = {q.numel()};
  s.dtype = q.dtype;
  s.device = q.device;
  s.reduce_op = q.reduce_op;
  s.prescale = q.prescale;
  s.postscale = q.postscale;
  s.root = q.root;
  s.shape = q.shape;
  s.rank_rows = op.rank_rows;
  if (q.kind == OpKind::allgather) s.row_numels = {q.row_numel()};
  s.active_ranks = op.contributors;
  s.process_set = q.process_set;
  s.set_ranks = q.set_ranks;
  s.error = op.error;
  s.error_message = op.message;
  s.error_ranks = op.error_ranks;
  return s;
}

// The responses that run `ready` (in the order the ops became ready), fusing into buffers of at
// most `fusion_threshold_bytes` (0: no fusion) (Note [Fusion planning]).
inline std::vector<Response> plan_responses(std::span<const ReadyOp> ready,
                                            std::int64_t fusion_threshold_bytes) {
  struct Open {
    std::size_t index;   // into the plan
    std::int64_t bytes;  // what its buffer holds so far
  };
  std::vector<Response> plan;
  std::vector<Open> open;  // fusable responses that can still take tensors
  for (const ReadyOp& op : ready) {
    const Request& q = op.request;
    const std::int64_t bytes = op.bytes();
    if (fusable(op) && fusion_threshold_bytes > 0 && bytes <= fusion_threshold_bytes) {
      auto takes = [&](const Open& o) {
        const Response& s = plan[o.index];
        return s.kind == q.kind && s.dtype == q.dtype && s.device == q.device &&
               s.reduce_op == q.reduce_op &&
               s.prescale == q.prescale && s.postscale == q.postscale &&
               s.active_ranks == op.contributors && o.bytes + bytes <= fusion_threshold_bytes;
      };
      if (auto o = std::find_if(open.begin(), open.end(), takes); o != open.end()) {
        Response& s = plan[o->index];
        s.names.push_back(q.name);
        s.numels.push_back(q.numel());
        if (q.kind == OpKind::allgather) {
          s.row_numels.push_back(q.row_numel());
          s.rank_rows.insert(s.rank_rows.end(), op.rank_rows.begin(), op.rank_rows.end());
        }
        o->bytes += bytes;
        continue;
      }
      open.push_back({plan.size(), bytes});
    }
    plan.push_back(response_for(op));
  }
  return plan;
}

}  // namespace dtrain::detail
