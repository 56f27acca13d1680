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
// runtime/negotiation/join_tracker.hpp) fail as invalid arguments instead: a broadcast whose root
// has joined, alltoall and reducescatter, and a device allreduce by Min, Max or Product, whose
// joined ranks would need an identity filled in on the device. The verdict is a function of the
// requests alone: rank 0 reaches it and every rank applies it.
//
// An op of a process set is compared among the set's members only; ranks outside the set never
// submit it and are never waited for, and messages name the set after the op.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dtrain/runtime/negotiation/messages.hpp"
#include "dtrain/runtime/negotiation/ready_op.hpp"
#include "dtrain/runtime/negotiation/set_members.hpp"

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

// The members of `members` that have not submitted the op, ascending.
inline std::vector<std::int32_t> absent_ranks(const PerRankRequests& per_rank,
                                              const SetMembers& members) {
  std::vector<std::int32_t> out;
  for (std::int32_t r : members.ranks())
    if (!per_rank[static_cast<std::size_t>(r)]) out.push_back(r);
  return out;
}
// The ranks of the world that have not submitted the op, ascending.
inline std::vector<std::int32_t> absent_ranks(const PerRankRequests& per_rank) {
  return absent_ranks(per_rank, SetMembers::world(static_cast<int>(per_rank.size())));
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

// The ready op named `name` of the set `members`, or its failure, from the requests of the ranks
// that submitted it (Note [Validation across ranks]). Every member absent from `per_rank` has
// joined; at least one is present.
inline ReadyOp validate_across_ranks(std::string_view name, const PerRankRequests& per_rank,
                                     const SetMembers& members) {
  ReadyOp out;
  out.request = first_submission(per_rank);
  out.contributors = static_cast<std::int32_t>(submitting_ranks(per_rank).size());
  const std::string& on_set = members.label();
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
                    fmt::format("dtrain: ranks disagree on the {} of {} '{}'{}: {}. Run with "
                                "DTRAIN_LOG_LEVEL=debug to see what each rank submitted.",
                                field, out.request.kind, name, on_set,
                                ranks_by_value(per_rank, text)));
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
                  fmt::format("dtrain: broadcast '{}'{} has root rank {}, which has already joined",
                              name, on_set, root));
  }
  if (auto e = mismatch("group", group_text)) return *e;
  if (kind == OpKind::process_set) {
    auto ranks_text = [](const Request& q) {
      return fmt::format("[{}]", fmt::join(q.set_ranks, ", "));
    };
    if (auto e = mismatch("ranks", ranks_text)) return *e;
  }
  const bool someone_joined = out.contributors < members.count();
  if (someone_joined && (kind == OpKind::alltoall || kind == OpKind::reducescatter ||
                         kind == OpKind::process_set)) {
    return fail(ErrorKind::invalid_argument,
                fmt::format("dtrain: {} '{}'{} cannot run while ranks [{}] have joined: only "
                            "allreduce, allgather, broadcast and barrier accept joined ranks",
                            kind, name, on_set, fmt::join(absent_ranks(per_rank, members), ", ")));
  }
  // A joined rank contributes the op's identity (0, 1, +inf or -inf) from host memory; the
  // device path has no such fill, so there only Sum and Average accept joined ranks.
  if (someone_joined && kind == OpKind::allreduce && out.request.device.is_cuda() &&
      out.request.reduce_op != ReduceOp::Sum && out.request.reduce_op != ReduceOp::Average) {
    return fail(ErrorKind::invalid_argument,
                fmt::format("dtrain: allreduce '{}'{} with ReduceOp::{} on {} cannot run while "
                            "ranks [{}] have joined: device tensors accept joined ranks for Sum "
                            "and Average only",
                            name, on_set, out.request.reduce_op, out.request.device,
                            fmt::join(absent_ranks(per_rank, members), ", ")));
  }
  if (kind == OpKind::allgather) {
    for (std::int32_t r : members.ranks()) {
      const auto& q = per_rank[static_cast<std::size_t>(r)];
      out.rank_rows.push_back(q ? q->dim0() : 0);
    }
  }
  return out;
}

// The same for an op of the world.
inline ReadyOp validate_across_ranks(std::string_view name, const PerRankRequests& per_rank) {
  return validate_across_ranks(name, per_rank,
                               SetMembers::world(static_cast<int>(per_rank.size())));
}

}  // namespace dtrain::detail
