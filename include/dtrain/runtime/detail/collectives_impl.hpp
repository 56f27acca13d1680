#pragma once
// The compiled part of the collectives (Note [Compiled submission] in runtime/collectives.hpp):
// naming an op, its local checks, its entry and its submission, for single tensors and groups.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dtrain/core/error.hpp"
#include "dtrain/runtime/collectives.hpp"
#include "dtrain/runtime/detail/op_checks.hpp"
#include "dtrain/runtime/detail/submission.hpp"
#include "dtrain/runtime/execution/entry.hpp"
#include "dtrain/runtime/negotiation/op_names.hpp"

namespace dtrain::detail {

// An op about to be submitted: the engine it goes to, its name (given or generated) and its set.
struct NamedOp {
  std::shared_ptr<Engine> engine;
  std::string name;
  OpKind kind;
  std::string group = {};  // grouped ops: a rejection fails the whole group
  SetOfOp set = {};
};

// Refuses a set this rank may not use before a name is drawn or anything is submitted.
inline NamedOp name_op(std::string_view given, OpKind kind, std::string_view caller,
                       const ProcessSet& process_set = {}) {
  auto eng = engine(caller);
  SetOfOp set = enter_process_set(*eng, process_set, kind, given);
  // Every rank runs the same call, so every rank refuses it alike (Note [Generated names]).
  if (!given.empty() && is_reserved_name(given))
    throw InvalidArgumentError(why_reserved(given, kind));
  std::string name = given.empty() ? generate_name(*eng, kind, set.id) : std::string(given);
  return NamedOp{std::move(eng), std::move(name), kind, {}, std::move(set)};
}

// Runs the local checks of `op`. One that fails submits the name as rejected, so the peers' ops of
// that name fail at once instead of waiting for this rank (Note [Failed ops]), then rethrows.
template <class F>
decltype(auto) checked(const NamedOp& op, F&& checks) {
  try {
    return checks();
  } catch (const InvalidArgumentError& e) {
    reject(*op.engine, op.name, op.kind, e.what(), op.group, op.set.id);
    throw;
  }
}

// The request of `op` for a tensor described by `t`, named `name` (a group member's) or the op's.
inline Request describe(const TensorView& t, const NamedOp& op, std::string name = {}) {
  Request q;
  q.name = name.empty() ? op.name : std::move(name);
  q.kind = op.kind;
  q.process_set = op.set.id;
  q.dtype = t.dtype;
  q.device = t.device;
  q.shape = t.shape;
  check_tensor(q, t.numel, t.data != nullptr);
  return q;
}

// A request of `op` that carries no tensor (barrier, join, an empty group's stand-in).
inline Request bare_request(const NamedOp& op, std::string name = {}) {
  Request q;
  q.name = name.empty() ? op.name : std::move(name);
  q.kind = op.kind;
  q.process_set = op.set.id;
  q.dtype = DataType::uint8;
  q.shape = {0};
  return q;
}

// `q` as a reduction with `options`' op and scale factors, checked first.
template <class Options>
Request reduction(Request q, const Options& options) {
  check_reduction(q, options.op, options.prescale, options.postscale);
  q.reduce_op = options.op;
  q.prescale = options.prescale;
  q.postscale = options.postscale;
  return q;
}

// Reads `tensor` and makes its request within `op`'s checks; `more` adds the op's own checks to
// the request (or turns it into a reduction).
template <class More>
std::pair<TensorView, Request> read_checked(const NamedOp& op, const TensorSource& tensor,
                                            More&& more) {
  TensorView t;
  Request q = checked(op, [&] {
    t = tensor.read();
    return more(describe(t, op));
  });
  return {std::move(t), std::move(q)};
}

inline Request no_more_checks(Request q) { return q; }

// Submits the single entry made of `q`, after `attach` gave it its memory; returns its state.
template <class Attach>
std::shared_ptr<OpState> submit_one(const NamedOp& op, Request q, Attach&& attach) {
  auto e = new_entry(std::move(q));
  attach(*e);
  auto state = e->state;
  submit(*op.engine, std::move(e));
  return state;
}

// The entry of an in-place op works on `t`'s memory.
inline auto in_place(const TensorView& t) {
  return [&t](Entry& e) {
    e.data = t.data;
    e.stream = t.stream;
  };
}

// The entry of an op with a new output reads `t` and makes its output with `make_output`.
inline auto with_output(const TensorView& t, OutputMaker& make_output) {
  return [&](Entry& e) {
    e.input = t.data;
    e.stream = t.stream;
    e.make_output = std::move(make_output);
  };
}

// An allreduce or grouped_allreduce of `tensors` with ReduceOp::Adasum, a sequence of other ops
// (runtime/detail/adasum_impl.hpp, included at the end).
inline Handle submit_adasum(const NamedOp& op, const std::vector<TensorSource>& tensors,
                            const AllreduceOptions& options, bool grouped);

DTRAIN_API Handle submit_allreduce(TensorSource tensor, const AllreduceOptions& options) {
  const auto op = name_op(options.name, OpKind::allreduce, "allreduce", options.process_set);
  if (options.op == ReduceOp::Adasum) return submit_adasum(op, {tensor}, options, false);
  auto [t, q] = read_checked(op, tensor, [&](Request r) {
    return reduction(std::move(r), options);
  });
  return Handle(submit_one(op, std::move(q), in_place(t)));
}

DTRAIN_API Handle submit_broadcast(TensorSource tensor, int root_rank,
                                   const CollectiveOptions& options) {
  const auto op = name_op(options.name, OpKind::broadcast, "broadcast", options.process_set);
  auto [t, q] = read_checked(op, tensor, [&](Request r) {
    check_root(r, root_rank, op.set);
    return r;
  });
  q.root = root_rank;
  return Handle(submit_one(op, std::move(q), in_place(t)));
}

DTRAIN_API std::shared_ptr<OpState> submit_allgather(TensorSource tensor, OutputMaker make_output,
                                                     const CollectiveOptions& options) {
  const auto op = name_op(options.name, OpKind::allgather, "allgather", options.process_set);
  auto [t, q] = read_checked(op, tensor, no_more_checks);
  return submit_one(op, std::move(q), with_output(t, make_output));
}

DTRAIN_API std::shared_ptr<OpState> submit_reducescatter(TensorSource tensor,
                                                         OutputMaker make_output,
                                                         const ReducescatterOptions& options) {
  const auto op =
      name_op(options.name, OpKind::reducescatter, "reducescatter", options.process_set);
  auto [t, q] = read_checked(op, tensor, [&](Request r) {
    return reduction(std::move(r), options);
  });
  return submit_one(op, std::move(q), with_output(t, make_output));
}

DTRAIN_API std::shared_ptr<OpState> submit_alltoall(
    TensorSource tensor, std::vector<std::int64_t> splits, OutputMaker make_output,
    std::function<void(std::vector<std::int64_t>)> set_received_splits,
    const CollectiveOptions& options) {
  const auto op = name_op(options.name, OpKind::alltoall, "alltoall", options.process_set);
  auto [t, q] = read_checked(op, tensor, [&](Request r) {
    check_splits(r, splits, op.set);
    return r;
  });
  return submit_one(op, std::move(q), [&](Entry& e) {
    with_output(t, make_output)(e);
    e.splits = std::move(splits);
    e.set_received_splits = std::move(set_received_splits);
  });
}

DTRAIN_API void reject_allreduce(const std::string& name, const std::string& why,
                                 std::string_view caller) {
  reject(*engine(caller), name, OpKind::allreduce, why, "", /*process_set=*/0);
}

}  // namespace dtrain::detail

namespace dtrain {

DTRAIN_API Handle barrier_async(const CollectiveOptions& options) {
  const auto op =
      detail::name_op(options.name, detail::OpKind::barrier, "barrier", options.process_set);
  detail::checked(op, [] {});
  return Handle(detail::submit_one(op, detail::bare_request(op), [](detail::Entry&) {}));
}

DTRAIN_API ResultHandle<int> join_async(const ProcessSet& process_set) {
  const auto op = detail::name_op("join", detail::OpKind::join, "join", process_set);
  auto last = std::make_shared<std::optional<int>>();
  auto state = detail::submit_one(op, detail::bare_request(op), [&](detail::Entry& e) {
    e.set_last_joined = [last](int rank) { *last = rank; };
  });
  return ResultHandle<int>(std::move(state), std::move(last));
}

}  // namespace dtrain

#include "dtrain/runtime/detail/adasum_impl.hpp"
