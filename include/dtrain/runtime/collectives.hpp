#pragma once
// The public collectives. Every op is collective over the world and matched across ranks by name
// (given, or generated from the op kind and a per-kind call count), so ranks may submit in
// different orders. `_async` forms return a handle; sync forms wait on it. In-place ops
// (allreduce, broadcast) write into the caller's tensor, which must stay alive and untouched until
// the op completes.
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
#include "dtrain/runtime/device_registry.hpp"
#include "dtrain/runtime/handle.hpp"
#include "dtrain/runtime/op_checks.hpp"
#include "dtrain/runtime/submission.hpp"
#include "dtrain/tensor/traits.hpp"
#include "dtrain/tensor/view.hpp"

namespace dtrain {

struct AllreduceOptions {
  ReduceOp op = ReduceOp::Average;
  double prescale = 1.0;   // multiplies the input before the reduction
  double postscale = 1.0;  // multiplies the result
  std::string name = {};   // empty: generated
};

template <class T>
using output_t = typename traits_of<T>::output_type;

template <class T>
struct AlltoallResult {
  output_t<T> output;                        // rows received, grouped by source rank
  std::vector<std::int64_t> received_splits; // rows received from each rank
};

namespace detail {

template <class T>
Request describe(const T& t, OpKind kind, std::string name) {
  Request q;
  q.name = std::move(name);
  q.kind = kind;
  q.dtype = traits_of<T>::dtype(t);
  q.device = traits_of<T>::device(t);
  q.shape = shape_of(t);
  check_tensor(q, traits_of<T>::numel(t), traits_of<T>::data(t) != nullptr);
  return q;
}

// An op about to be submitted: the engine it goes to and its name (given or generated).
struct NamedOp {
  std::shared_ptr<Engine> engine;
  std::string name;
  OpKind kind;
  bool generated;
  std::string group = {};  // grouped_allreduce: a rejection fails the whole group
};

inline NamedOp name_op(std::string_view given, OpKind kind, std::string_view caller) {
  auto eng = engine(caller);
  const bool generated = given.empty();
  std::string name = generated ? generate_name(*eng, kind) : std::string(given);
  return NamedOp{std::move(eng), std::move(name), kind, generated};
}

// Runs the local checks of `op`. One that fails submits the name as rejected, so the peers' ops of
// that name fail at once instead of waiting for this rank (Note [Failed ops]), then rethrows.
template <class F>
decltype(auto) checked(const NamedOp& op, F&& checks) {
  try {
    return checks();
  } catch (const InvalidArgumentError& e) {
    reject(*op.engine, op.name, op.kind, e.what(), op.group);
    throw;
  }
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
    const auto op = detail::name_op(options.name, detail::OpKind::allreduce, "allreduce");
    auto q = detail::checked(op, [&] {
      auto q = detail::describe(tensor, op.kind, op.name);
      detail::check_reduction(q, options.op, options.prescale, options.postscale);
      return q;
    });
    q.reduce_op = options.op;
    q.prescale = options.prescale;
    q.postscale = options.postscale;
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

// Reduces every tensor of `tensors` (any range of tensors) as one group: the group is negotiated
// as a unit and its members are fused together. Member i is named "<name>.<i>".
template <Range R>
Handle grouped_allreduce_async(R&& tensors, const AllreduceOptions& options = {}) {
  using T = range_value_t<R>;
  DTRAIN_REQUIRE_MUTABLE_TENSOR(T);
  if constexpr (MutableTensor<T>) {
    const auto op = detail::name_op(options.name, detail::OpKind::allreduce, "grouped_allreduce");
    const std::string& group = op.name;
    const auto count = static_cast<std::int32_t>(std::distance(std::begin(tensors), std::end(tensors)));
    std::vector<std::shared_ptr<detail::Entry>> entries;
    // A rejection fails the whole group on the peers (Note [Failed ops]).
    detail::NamedOp member = op;
    member.name = group + ".rejected";
    member.group = group;
    std::int32_t i = 0;
    for (auto& t : tensors) {
      auto q = detail::checked(member, [&] {
        auto q = detail::describe(t, op.kind, fmt::format("{}.{}", group, i));
        detail::check_reduction(q, options.op, options.prescale, options.postscale);
        return q;
      });
      ++i;
      q.reduce_op = options.op;
      q.prescale = options.prescale;
      q.postscale = options.postscale;
      q.group = group;
      q.group_size = count;
      auto e = detail::new_entry(std::move(q));
      e->data = traits_of<T>::mutable_data(t);
      e->stream = detail::stream_of(t);
      entries.push_back(std::move(e));
    }
    if (count == 0) {
      // An empty group still takes part, so a rank whose group is not empty is told they differ.
      detail::Request q;
      q.name = group + ".empty";
      q.kind = op.kind;
      q.reduce_op = ReduceOp::Sum;
      q.shape = {0};
      q.group = group;
      q.group_size = 0;
      entries.push_back(detail::new_entry(std::move(q)));
    }
    // The group's handle completes when the last member does, with the first member's error.
    std::vector<std::shared_ptr<detail::OpState>> states;
    for (const auto& e : entries) states.push_back(e->state);
    auto all = detail::complete_together(states);
    detail::submit_all(*op.engine, std::move(entries));
    return Handle(all);
  }
}

template <Range R>
void grouped_allreduce(R&& tensors, const AllreduceOptions& options = {}) {
  grouped_allreduce_async(std::forward<R>(tensors), options).wait();
}

// ---- allgather --------------------------------------------------------------------------------

// Concatenation of every rank's tensor along dim 0, in rank order; dim 0 may differ per rank.
template <class T>
ResultHandle<output_t<T>> allgather_async(const T& tensor, std::string_view name = {}) {
  DTRAIN_REQUIRE_TENSOR(T);
  DTRAIN_REQUIRE_OUTPUT(T);
  if constexpr (TensorWithOutput<T>) {
    const auto op = detail::name_op(name, detail::OpKind::allgather, "allgather");
    auto q = detail::checked(op, [&] { return detail::describe(tensor, op.kind, op.name); });
    auto e = detail::new_entry(std::move(q));
    auto slot = detail::attach_output(*e, tensor);
    ResultHandle<output_t<T>> h(e->state, slot);
    detail::submit(*op.engine, std::move(e));
    return h;
  }
}

template <class T>
output_t<T> allgather(const T& tensor, std::string_view name = {}) {
  return allgather_async(tensor, name).get();
}

// ---- broadcast --------------------------------------------------------------------------------

template <class T>
Handle broadcast_async(T& tensor, int root_rank, std::string_view name = {}) {
  DTRAIN_REQUIRE_MUTABLE_TENSOR(T);
  if constexpr (MutableTensor<T>) {
    const auto op = detail::name_op(name, detail::OpKind::broadcast, "broadcast");
    auto q = detail::checked(op, [&] {
      auto q = detail::describe(tensor, op.kind, op.name);
      detail::check_root(q, root_rank, detail::world_size(*op.engine));
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
void broadcast(T& tensor, int root_rank, std::string_view name = {}) {
  broadcast_async(tensor, root_rank, name).wait();
}

// ---- alltoall ---------------------------------------------------------------------------------

// Sends splits[r] rows (dim 0) to rank r, in order; receives the rows every rank sent here.
template <class T, Range Splits>
  requires std::integral<range_value_t<Splits>>
ResultHandle<AlltoallResult<T>> alltoall_async(const T& tensor, const Splits& splits,
                                               std::string_view name = {}) {
  DTRAIN_REQUIRE_TENSOR(T);
  DTRAIN_REQUIRE_OUTPUT(T);
  if constexpr (TensorWithOutput<T>) {
    const auto op = detail::name_op(name, detail::OpKind::alltoall, "alltoall");
    std::vector<std::int64_t> s;
    for (auto v : splits) s.push_back(static_cast<std::int64_t>(v));
    auto q = detail::checked(op, [&] {
      auto q = detail::describe(tensor, op.kind, op.name);
      detail::check_splits(q, s, detail::world_size(*op.engine));
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
AlltoallResult<T> alltoall(const T& tensor, const Splits& splits, std::string_view name = {}) {
  return alltoall_async(tensor, splits, name).get();
}

// ---- reducescatter ----------------------------------------------------------------------------

// Reduces across ranks and returns this rank's slice of dim 0: rows are split evenly, and the
// first (rows % size) ranks take one extra row.
template <class T>
ResultHandle<output_t<T>> reducescatter_async(const T& tensor, ReduceOp op = ReduceOp::Average,
                                              std::string_view name = {}) {
  DTRAIN_REQUIRE_TENSOR(T);
  DTRAIN_REQUIRE_OUTPUT(T);
  if constexpr (TensorWithOutput<T>) {
    const auto named = detail::name_op(name, detail::OpKind::reducescatter, "reducescatter");
    auto q = detail::checked(named, [&] {
      auto q = detail::describe(tensor, named.kind, named.name);
      detail::check_reduction(q, op, 1.0, 1.0);
      return q;
    });
    q.reduce_op = op;
    auto e = detail::new_entry(std::move(q));
    auto slot = detail::attach_output(*e, tensor);
    ResultHandle<output_t<T>> h(e->state, slot);
    detail::submit(*named.engine, std::move(e));
    return h;
  }
}

template <class T>
output_t<T> reducescatter(const T& tensor, ReduceOp op = ReduceOp::Average,
                          std::string_view name = {}) {
  return reducescatter_async(tensor, op, name).get();
}

// ---- barrier and join -------------------------------------------------------------------------

inline Handle barrier_async(std::string_view name = {}) {
  const auto op = detail::name_op(name, detail::OpKind::barrier, "barrier");
  detail::checked(op, [] {});
  detail::Request q;
  q.kind = op.kind;
  q.name = op.name;
  q.dtype = DataType::uint8;
  q.shape = {0};
  auto e = detail::new_entry(std::move(q));
  Handle h(e->state);
  detail::submit(*op.engine, std::move(e));
  return h;
}
inline void barrier() { barrier_async().wait(); }

// Declares that this rank has no more data for this round. Until every rank has joined, it keeps
// taking part in allreduce (contributing zeros: Average divides by the ranks that did not join),
// allgather (contributing no rows) and broadcast. Returns the last rank to join.
inline int join() {
  auto eng = detail::engine("join");
  detail::Request q;
  q.kind = detail::OpKind::join;
  q.name = "join";
  q.dtype = DataType::uint8;
  q.shape = {0};
  auto e = detail::new_entry(std::move(q));
  auto last = std::make_shared<std::optional<int>>();
  e->set_last_joined = [last](int rank) { *last = rank; };
  ResultHandle<int> h(e->state, last);
  detail::submit(*eng, std::move(e));
  return h.get();
}

}  // namespace dtrain
