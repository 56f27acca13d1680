#pragma once
// Validation across ranks: whether the ranks that submitted an op agree on what it is.
//
// Note [Validation across ranks]
// Each rank checks its own call (runtime/collectives.hpp), but only the coordinator sees every
// rank's request, so only it can tell that the ranks disagree, and it must tell them before any
// of them enters a collective that would mix tensors of different sizes or types. Once an op is
// ready (every rank that has not joined has submitted it), each rank's request is compared with
// the first submitting rank's: the op kind, dtype and device always; the reduce op and scale
// factors of a reduction; the shape where every rank holds the same tensor; for allgather and
// alltoall, whose dim 0 may differ, the number of dimensions and the dimensions beyond 0; the root
// of a broadcast; the group. The first field that differs fails the op with a mismatch naming the
// tensor, the field, and each value with the ranks that submitted it, so the user sees which ranks
// took a different code path. Ops that cannot take joined ranks (Note [Join] in
// runtime/join_tracker.hpp) fail as invalid arguments instead: a broadcast whose root has joined,
// alltoall and reducescatter, and a device allreduce by Min, Max or Product, whose joined ranks
// would need an identity filled in on the device. The verdict is a function of the requests
// alone: rank 0 reaches it and every rank applies it.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dtrain/runtime/messages.hpp"
#include "dtrain/runtime/ready_op.hpp"

namespace dtrain::detail {

// One op's request from each rank of the world, by rank; empty for a rank that has not submitted
// it.
using PerRankRequests = std::vector<std::optional<Request>>;

// The ranks that have submitted the op, ascending.
inline std::vector<std::int32_t> submitting_ranks(const PerRankRequests& per_rank) {
  std::vector<std::int32_t> out;
  for (std::size_t r = 0; r < per_rank.size(); ++r)
    if (per_rank[r]) out.push_back(static_cast<std::int32_t>(r));
  return out;
}

// The ranks that have not submitted the op, ascending.
inline std::vector<std::int32_t> absent_ranks(const PerRankRequests& per_rank) {
  std::vector<std::int32_t> out;
  for (std::size_t r = 0; r < per_rank.size(); ++r)
    if (!per_rank[r]) out.push_back(static_cast<std::int32_t>(r));
  return out;
}

// The lowest rank's request: the canonical one. At least one rank has submitted the op.
inline const Request& first_submission(const PerRankRequests& per_rank) {
  std::size_t first = 0;
  while (!per_rank[first]) ++first;
  return *per_rank[first];
}

// "float32 on ranks [0, 1]; float64 on ranks [2]": each value of a field, as `field_text` writes
// it, with the ranks that submitted it; values in the order of their text.
template <class FieldText>
std::string ranks_by_value(const PerRankRequests& per_rank, FieldText&& field_text) {
  std::map<std::string, std::vector<int>> groups;
  for (std::size_t r = 0; r < per_rank.size(); ++r)
    if (per_rank[r]) groups[field_text(*per_rank[r])].push_back(static_cast<int>(r));
  std::string out;
  for (const auto& [value, ranks] : groups)
    out += fmt::format("{}{} on ranks [{}]", out.empty() ? "" : "; ", value,
                       fmt::join(ranks, ", "));
  return out;
}

// The ready op named `name`, or its failure, from the requests of the ranks that submitted it
// (Note [Validation across ranks]). Every rank absent from `per_rank` has joined; at least one is
// present.
inline ReadyOp validate_across_ranks(std::string_view name, const PerRankRequests& per_rank) {
  ReadyOp out;
  out.request = first_submission(per_rank);
  out.contributors = static_cast<std::int32_t>(submitting_ranks(per_rank).size());
  auto fail = [&](ErrorKind kind, std::string message) {
    out.error = kind;
    out.message = std::move(message);
    return out;
  };
  auto mismatch = [&](std::string_view field, auto&& get) -> std::optional<ReadyOp> {
    const auto reference = get(out.request);
    for (const auto& q : per_rank) {
      if (q && get(*q) != reference) {
        auto text = [&](const Request& each) { return fmt::format("{}", get(each)); };
        return fail(ErrorKind::mismatch,
                    fmt::format("dtrain: ranks disagree on the {} of {} '{}': {}. Run with "
                                "DTRAIN_LOG_LEVEL=debug to see what each rank submitted.",
                                field, out.request.kind, name, ranks_by_value(per_rank, text)));
      }
    }
    return std::nullopt;
  };
  auto shape_text = [](const Request& q) { return fmt::format("[{}]", fmt::join(q.shape, ", ")); };
  auto row_shape_text = [](const Request& q) {
    return q.shape.size() <= 1
               ? std::string("[]")
               : fmt::format("[{}]", fmt::join(q.shape.begin() + 1, q.shape.end(), ", "));
  };
  auto group_text = [](const Request& q) {
    return q.group + "/" + std::to_string(q.group_size);
  };
  const OpKind kind = out.request.kind;
  const bool reduces = kind == OpKind::allreduce || kind == OpKind::reducescatter;
  if (auto e = mismatch("op kind", [](const Request& q) { return q.kind; })) return *e;
  if (auto e = mismatch("dtype", [](const Request& q) { return q.dtype; })) return *e;
  if (auto e = mismatch("device", [](const Request& q) { return q.device; })) return *e;
  if (reduces) {
    if (auto e = mismatch("reduce op", [](const Request& q) { return q.reduce_op; })) return *e;
    if (auto e = mismatch("prescale factor", [](const Request& q) { return q.prescale; }))
      return *e;
    if (auto e = mismatch("postscale factor", [](const Request& q) { return q.postscale; }))
      return *e;
  }
  if (reduces || kind == OpKind::broadcast) {
    if (auto e = mismatch("shape", shape_text)) return *e;
  }
  if (kind == OpKind::allgather || kind == OpKind::alltoall) {
    if (auto e = mismatch("number of dimensions", [](const Request& q) { return q.shape.size(); }))
      return *e;
    if (auto e = mismatch("shape beyond dim 0", row_shape_text)) return *e;
  }
  if (kind == OpKind::broadcast) {
    if (auto e = mismatch("root rank", [](const Request& q) { return q.root; })) return *e;
    const std::int32_t root = out.request.root;
    const bool root_in_world = root >= 0 && static_cast<std::size_t>(root) < per_rank.size();
    if (root_in_world && !per_rank[root])
      return fail(ErrorKind::invalid_argument,
                  fmt::format("dtrain: broadcast '{}' has root rank {}, which has already joined",
                              name, root));
  }
  if (auto e = mismatch("group", group_text)) return *e;
  const bool someone_joined = static_cast<std::size_t>(out.contributors) < per_rank.size();
  if (someone_joined && (kind == OpKind::alltoall || kind == OpKind::reducescatter)) {
    return fail(ErrorKind::invalid_argument,
                fmt::format("dtrain: {} '{}' cannot run while ranks [{}] have joined: only "
                            "allreduce, allgather, broadcast and barrier accept joined ranks",
                            kind, name, fmt::join(absent_ranks(per_rank), ", ")));
  }
  // A joined rank contributes the op's identity (0, 1, +inf or -inf) from host memory; the
  // device path has no such fill, so there only Sum and Average accept joined ranks.
  if (someone_joined && kind == OpKind::allreduce && out.request.device.is_cuda() &&
      out.request.reduce_op != ReduceOp::Sum && out.request.reduce_op != ReduceOp::Average) {
    return fail(ErrorKind::invalid_argument,
                fmt::format("dtrain: allreduce '{}' with ReduceOp::{} on {} cannot run while "
                            "ranks [{}] have joined: device tensors accept joined ranks for Sum "
                            "and Average only",
                            name, out.request.reduce_op, out.request.device,
                            fmt::join(absent_ranks(per_rank), ", ")));
  }
  if (kind == OpKind::allgather) {
    out.rank_rows.assign(per_rank.size(), 0);
    for (std::size_t r = 0; r < per_rank.size(); ++r)
      if (per_rank[r]) out.rank_rows[r] = per_rank[r]->dim0();
  }
  return out;
}

}  // namespace dtrain::detail
