#pragma once
// The public collectives. Every op is collective over its process set (the world unless its
// options name one: runtime/process_set.hpp) and matched across the set's ranks by name (given,
// or generated from the op kind and a per-kind call count), so ranks may submit in different
// orders. `_async` forms return a handle; sync forms wait on it. In-place ops (allreduce,
// broadcast) write into the caller's tensor, which must stay alive and untouched until the op
// completes. The grouped forms are in runtime/grouped_collectives.hpp.
#include <cmath>
#include <concepts>
#include <cstdint>
#include <memory>
#include <optional>
#include <iterator>
#include <type_traits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "dtrain/core/error.hpp"
#include "dtrain/core/range.hpp"
#include "dtrain/runtime/collective_options.hpp"
#include "dtrain/runtime/device_registry.hpp"
#include "dtrain/runtime/handle.hpp"
#include "dtrain/runtime/op_checks.hpp"
#include "dtrain/runtime/process_set.hpp"
#include "dtrain/runtime/submission.hpp"
#include "dtrain/tensor/traits.hpp"
#include "dtrain/tensor/view.hpp"

namespace dtrain {

template <class T>
using output_t = typename traits_of<T>::output_type;

template <class T>
struct AlltoallResult {
  output_t<T> output;                        // rows received, grouped by source rank
  std::vector<std::int64_t> received_splits; // rows received from each rank
};

namespace detail {

// An op about to be submitted: the engine it goes to, its name (given or generated) and its set.
struct NamedOp {
  std::shared_ptr<Engine> engine;
  std::string name;
  OpKind kind;
  bool generated;
  std::string group = {};  // grouped ops: a rejection fails the whole group
  SetOfOp set = {};
};

// Refuses a set this rank may not use before a name is drawn or anything is submitted.
inline NamedOp name_op(std::string_view given, OpKind kind, std::string_view caller,
                       const ProcessSet& process_set = {}) {
  auto eng = engine(caller);
  SetOfOp set = enter_process_set(*eng, process_set, kind, given);
  const bool generated = given.empty();
  std::string name = generated ? generate_name(*eng, kind, set.id) : std::string(given);
  return NamedOp{std::move(eng), std::move(name), kind, generated, {}, std::move(set)};
}

// The request of `op` for tensor `t`, named `name` (a group member's) or the op's own.
template <class T>
Request describe(const T& t, const NamedOp& op, std::string name = {}) {
  Request q;
  q.name = name.empty() ? op.name : std::move(name);
  q.kind = op.kind;
  q.process_set = op.set.id;
  q.dtype = traits_of<T>::dtype(t);
  q.device = traits_of<T>::device(t);
  q.shape = shape_of(t);
  check_tensor(q, traits_of<T>::numel(t), traits_of<T>::data(t) != nullptr);
  return q;
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

// Entries of ops that produce a new tensor allocate it on the engine thread, once the sizes are
// negotiated, through tensor_traits<T>::make_output.
template <class T>
std::shared_ptr<std::optional<output_t<T>>> attach_output(Entry& e, const T& like) {
  auto slot = std::make_shared<std::optional<output_t<T>>>();
  e.input = traits_of<T>::data(like);
  e.stream = stream_of(like);
  e.make_output = [slot, like_ptr = &like](const Shape& s) -> void* {
    slot->emplace(traits_of<T>::make_output(*like_ptr, s));
    return traits_of<T>::output_data(**slot);
  };
  return slot;
}

#define DTRAIN_REQUIRE_OUTPUT(T)                                                                 \
  static_assert(::dtrain::TensorWithOutput<T>,                                                   \
                "dtrain: this op returns a new tensor: dtrain::tensor_traits<T> must define "     \
                "output_type, make_output(like, shape) and output_data(output)")

}  // namespace detail

// ---- allreduce --------------------------------------------------------------------------------

template <class T>
Handle allreduce_async(T& tensor, const AllreduceOptions& options = {}) {
  DTRAIN_REQUIRE_MUTABLE_TENSOR(T);
  if constexpr (MutableTensor<T>) {
    const auto op = detail::name_op(options.name, detail::OpKind::allreduce, "allreduce",
                                    options.process_set);
    auto q = detail::checked(
        op, [&] { return detail::reduction(detail::describe(tensor, op), options); });
    auto e = detail::new_entry(std::move(q));
    e->data = traits_of<T>::mutable_data(tensor);
    e->stream = detail::stream_of(tensor);
    Handle h(e->state);
    detail::submit(*op.engine, std::move(e));
    return h;
  }
}

template <class T>
void allreduce(T& tensor, const AllreduceOptions& options = {}) {
  allreduce_async(tensor, options).wait();
}

// ---- allgather --------------------------------------------------------------------------------

// Concatenation of every member's tensor along dim 0, in rank order; dim 0 may differ per rank.
// Allgathers that are ready together are fused into one collective (Note [Fused allgather]).
template <class T>
ResultHandle<output_t<T>> allgather_async(const T& tensor, const CollectiveOptions& options) {
  DTRAIN_REQUIRE_TENSOR(T);
  DTRAIN_REQUIRE_OUTPUT(T);
  if constexpr (TensorWithOutput<T>) {
    const auto op = detail::name_op(options.name, detail::OpKind::allgather, "allgather",
                                    options.process_set);
    auto q = detail::checked(op, [&] { return detail::describe(tensor, op); });
    auto e = detail::new_entry(std::move(q));
    auto slot = detail::attach_output(*e, tensor);
    ResultHandle<output_t<T>> h(e->state, slot);
    detail::submit(*op.engine, std::move(e));
    return h;
  }
}
template <class T>
ResultHandle<output_t<T>> allgather_async(const T& tensor, std::string_view name = {}) {
  return allgather_async(tensor, CollectiveOptions{std::string(name)});
}

template <class T>
output_t<T> allgather(const T& tensor, const CollectiveOptions& options) {
  return allgather_async(tensor, options).get();
}
template <class T>
output_t<T> allgather(const T& tensor, std::string_view name = {}) {
  return allgather_async(tensor, name).get();
}

// ---- broadcast --------------------------------------------------------------------------------

// `root_rank` is a world rank (dtrain::rank()) and, on a process set, one of its members.
template <class T>
Handle broadcast_async(T& tensor, int root_rank, const CollectiveOptions& options) {
  DTRAIN_REQUIRE_MUTABLE_TENSOR(T);
  if constexpr (MutableTensor<T>) {
    const auto op = detail::name_op(options.name, detail::OpKind::broadcast, "broadcast",
                                    options.process_set);
    auto q = detail::checked(op, [&] {
      auto q = detail::describe(tensor, op);
      detail::check_root(q, root_rank, op.set);
      return q;
    });
    q.root = root_rank;
    auto e = detail::new_entry(std::move(q));
    e->data = traits_of<T>::mutable_data(tensor);
    e->stream = detail::stream_of(tensor);
    Handle h(e->state);
    detail::submit(*op.engine, std::move(e));
    return h;
  }
}
template <class T>
Handle broadcast_async(T& tensor, int root_rank, std::string_view name = {}) {
  return broadcast_async(tensor, root_rank, CollectiveOptions{std::string(name)});
}

template <class T>
void broadcast(T& tensor, int root_rank, const CollectiveOptions& options) {
  broadcast_async(tensor, root_rank, options).wait();
}
template <class T>
void broadcast(T& tensor, int root_rank, std::string_view name = {}) {
  broadcast_async(tensor, root_rank, name).wait();
}

// ---- alltoall ---------------------------------------------------------------------------------

// Sends splits[r] rows (dim 0) to the r-th member (rank r of the world, or of the process set), in
// order; receives the rows every member sent here.
template <class T, Range Splits>
  requires std::integral<range_value_t<Splits>>
ResultHandle<AlltoallResult<T>> alltoall_async(const T& tensor, const Splits& splits,
                                               const CollectiveOptions& options) {
  DTRAIN_REQUIRE_TENSOR(T);
  DTRAIN_REQUIRE_OUTPUT(T);
  if constexpr (TensorWithOutput<T>) {
    const auto op = detail::name_op(options.name, detail::OpKind::alltoall, "alltoall",
                                    options.process_set);
    std::vector<std::int64_t> s;
    for (auto v : splits) s.push_back(static_cast<std::int64_t>(v));
    auto q = detail::checked(op, [&] {
      auto q = detail::describe(tensor, op);
      detail::check_splits(q, s, op.set);
      return q;
    });
    auto e = detail::new_entry(std::move(q));
    e->splits = std::move(s);
    auto result = std::make_shared<std::optional<AlltoallResult<T>>>();
    result->emplace();
    e->input = traits_of<T>::data(tensor);
    e->stream = detail::stream_of(tensor);
    e->make_output = [result, like = &tensor](const Shape& shape) -> void* {
      (*result)->output = traits_of<T>::make_output(*like, shape);
      return traits_of<T>::output_data((*result)->output);
    };
    e->set_received_splits = [result](std::vector<std::int64_t> r) {
      (*result)->received_splits = std::move(r);
    };
    ResultHandle<AlltoallResult<T>> h(e->state, result);
    detail::submit(*op.engine, std::move(e));
    return h;
  }
}
template <class T, Range Splits>
  requires std::integral<range_value_t<Splits>>
ResultHandle<AlltoallResult<T>> alltoall_async(const T& tensor, const Splits& splits,
                                               std::string_view name = {}) {
  return alltoall_async(tensor, splits, CollectiveOptions{std::string(name)});
}

template <class T, Range Splits>
  requires std::integral<range_value_t<Splits>>
AlltoallResult<T> alltoall(const T& tensor, const Splits& splits,
                           const CollectiveOptions& options) {
  return alltoall_async(tensor, splits, options).get();
}
template <class T, Range Splits>
  requires std::integral<range_value_t<Splits>>
AlltoallResult<T> alltoall(const T& tensor, const Splits& splits, std::string_view name = {}) {
  return alltoall_async(tensor, splits, name).get();
}

// ---- reducescatter ----------------------------------------------------------------------------

// Reduces across the members (prescale, the reduction, postscale, as allreduce does) and returns
// this rank's slice of dim 0: rows are split evenly, and the first (rows % members) members take
// one extra row.
template <class T>
ResultHandle<output_t<T>> reducescatter_async(const T& tensor,
                                              const ReducescatterOptions& options) {
  DTRAIN_REQUIRE_TENSOR(T);
  DTRAIN_REQUIRE_OUTPUT(T);
  if constexpr (TensorWithOutput<T>) {
    const auto op = detail::name_op(options.name, detail::OpKind::reducescatter, "reducescatter",
                                    options.process_set);
    auto q = detail::checked(
        op, [&] { return detail::reduction(detail::describe(tensor, op), options); });
    auto e = detail::new_entry(std::move(q));
    auto slot = detail::attach_output(*e, tensor);
    ResultHandle<output_t<T>> h(e->state, slot);
    detail::submit(*op.engine, std::move(e));
    return h;
  }
}
template <class T>
ResultHandle<output_t<T>> reducescatter_async(const T& tensor, ReduceOp op = ReduceOp::Average,
                                              std::string_view name = {}) {
  return reducescatter_async(tensor, ReducescatterOptions{.op = op, .name = std::string(name)});
}

template <class T>
output_t<T> reducescatter(const T& tensor, const ReducescatterOptions& options) {
  return reducescatter_async(tensor, options).get();
}
template <class T>
output_t<T> reducescatter(const T& tensor, ReduceOp op = ReduceOp::Average,
                          std::string_view name = {}) {
  return reducescatter_async(tensor, op, name).get();
}

// ---- barrier and join -------------------------------------------------------------------------

inline Handle barrier_async(const CollectiveOptions& options) {
  const auto op = detail::name_op(options.name, detail::OpKind::barrier, "barrier",
                                  options.process_set);
  detail::checked(op, [] {});
  auto e = detail::new_entry(detail::bare_request(op));
  Handle h(e->state);
  detail::submit(*op.engine, std::move(e));
  return h;
}
inline Handle barrier_async(std::string_view name = {}) {
  return barrier_async(CollectiveOptions{std::string(name)});
}
inline void barrier(const CollectiveOptions& options) { barrier_async(options).wait(); }
inline void barrier() { barrier_async().wait(); }

// Declares that this rank has no more data for this round on `process_set` (the world unless
// given). Until every member has joined, it keeps taking part in the set's allreduce
// (contributing zeros: Average divides by the ranks that did not join), allgather (contributing no
// rows) and broadcast. The handle's result is the world rank of the last member to join.
inline ResultHandle<int> join_async(const ProcessSet& process_set = {}) {
  const auto op = detail::name_op("join", detail::OpKind::join, "join", process_set);
  auto e = detail::new_entry(detail::bare_request(op));
  auto last = std::make_shared<std::optional<int>>();
  e->set_last_joined = [last](int rank) { *last = rank; };
  ResultHandle<int> h(e->state, last);
  detail::submit(*op.engine, std::move(e));
  return h;
}
inline int join(const ProcessSet& process_set = {}) { return join_async(process_set).get(); }

}  // namespace dtrain

#include "dtrain/runtime/grouped_collectives.hpp"
