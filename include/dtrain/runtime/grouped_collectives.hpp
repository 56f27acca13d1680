#pragma once
// The grouped collectives: one op over a range of tensors, negotiated as a unit and completed
// together. Member i of group "<name>" is named "<name>.<i>"; every rank must pass the same
// number of tensors, and a local error in any member fails the whole group on every rank (Note
// [Failed ops] in runtime/failed_ops.hpp). Members that may fuse do (Note [Fusion planning]).
#include <cstdint>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "dtrain/core/range.hpp"
#include "dtrain/runtime/collectives.hpp"

namespace dtrain {
namespace detail {

// Submits group `op` of `tensors`, all or nothing: `member(t, name)` checks tensor `t` and
// returns member `name`'s request (its checks reject the whole group), `attach(t, entry, i)`
// gives entry i its memory. Returns the group's state: done when the last member is, with the
// first member's error.
template <Range R, class Member, class Attach>
std::shared_ptr<OpState> submit_group(const NamedOp& op, R&& tensors, Member&& member,
                                      Attach&& attach) {
  const std::string& group = op.name;
  const auto count =
      static_cast<std::int32_t>(std::distance(std::begin(tensors), std::end(tensors)));
  NamedOp rejecting = op;
  rejecting.name = group + ".rejected";
  rejecting.group = group;
  std::vector<std::shared_ptr<Entry>> entries;
  std::int32_t i = 0;
  for (auto& t : tensors) {
    Request q = checked(rejecting, [&] { return member(t, fmt::format("{}.{}", group, i)); });
    q.group = group;
    q.group_size = count;
    auto e = new_entry(std::move(q));
    attach(t, *e, i++);
    entries.push_back(std::move(e));
  }
  if (count == 0) {
    // An empty group still takes part, so a rank whose group is not empty is told they differ.
    NamedOp stand_in = op;
    stand_in.kind = OpKind::barrier;
    Request q = bare_request(stand_in, group + ".empty");
    q.group = group;
    q.group_size = 0;
    entries.push_back(new_entry(std::move(q)));
  }
  std::vector<std::shared_ptr<OpState>> states;
  for (const auto& e : entries) states.push_back(e->state);
  auto all = complete_together(states);
  submit_all(*op.engine, std::move(entries));
  return all;
}

// One output per member of a group, each made on the engine thread once its shape is negotiated.
template <class T>
using GroupOutputs = std::shared_ptr<std::optional<std::vector<output_t<T>>>>;

template <class T, Range R>
GroupOutputs<T> group_outputs(R& tensors) {
  auto outputs = std::make_shared<std::optional<std::vector<output_t<T>>>>();
  outputs->emplace(static_cast<std::size_t>(std::distance(std::begin(tensors), std::end(tensors))));
  return outputs;
}

// attach_output() for member `i` of a group: its output is element `i` of `outputs`.
template <class T>
void attach_group_output(const GroupOutputs<T>& outputs, const T& like, Entry& e, std::int32_t i) {
  e.input = traits_of<T>::data(like);
  e.stream = stream_of(like);
  e.make_output = [outputs, like_ptr = &like, i](const Shape& s) -> void* {
    auto& out = (**outputs)[static_cast<std::size_t>(i)];
    out = traits_of<T>::make_output(*like_ptr, s);
    return traits_of<T>::output_data(out);
  };
}

}  // namespace detail

// ---- grouped allreduce ------------------------------------------------------------------------

// Reduces every tensor of `tensors` (any range of tensors) as one group, fused together.
template <Range R>
Handle grouped_allreduce_async(R&& tensors, const AllreduceOptions& options = {}) {
  using T = range_value_t<R>;
  DTRAIN_REQUIRE_MUTABLE_TENSOR(T);
  if constexpr (MutableTensor<T>) {
    const auto op = detail::name_op(options.name, detail::OpKind::allreduce, "grouped_allreduce",
                                    options.process_set);
    auto member = [&](const T& t, std::string name) {
      return detail::reduction(detail::describe(t, op, std::move(name)), options);
    };
    auto attach = [](T& t, detail::Entry& e, std::int32_t) {
      e.data = traits_of<T>::mutable_data(t);
      e.stream = detail::stream_of(t);
    };
    return Handle(detail::submit_group(op, tensors, member, attach));
  }
}

template <Range R>
void grouped_allreduce(R&& tensors, const AllreduceOptions& options = {}) {
  grouped_allreduce_async(std::forward<R>(tensors), options).wait();
}

// ---- grouped allgather ------------------------------------------------------------------------

// allgather of every tensor of `tensors`, as one group; the result holds each tensor's gather, in
// the order of `tensors`. Members of host memory are gathered in one collective where they fit
// the fusion buffer together (Note [Fused allgather]).
template <Range R>
ResultHandle<std::vector<output_t<range_value_t<R>>>> grouped_allgather_async(
    R&& tensors, const CollectiveOptions& options = {}) {
  using T = range_value_t<R>;
  DTRAIN_REQUIRE_TENSOR(T);
  DTRAIN_REQUIRE_OUTPUT(T);
  if constexpr (TensorWithOutput<T>) {
    const auto op = detail::name_op(options.name, detail::OpKind::allgather, "grouped_allgather",
                                    options.process_set);
    auto outputs = detail::group_outputs<T>(tensors);
    auto member = [&](const T& t, std::string name) {
      return detail::describe(t, op, std::move(name));
    };
    auto attach = [&](const T& t, detail::Entry& e, std::int32_t i) {
      detail::attach_group_output(outputs, t, e, i);
    };
    return {detail::submit_group(op, tensors, member, attach), outputs};
  }
}

template <Range R>
std::vector<output_t<range_value_t<R>>> grouped_allgather(R&& tensors,
                                                          const CollectiveOptions& options = {}) {
  return grouped_allgather_async(std::forward<R>(tensors), options).get();
}

// ---- grouped reducescatter --------------------------------------------------------------------

// reducescatter of every tensor of `tensors`, as one group; the result holds this rank's slice of
// each, in the order of `tensors`.
template <Range R>
ResultHandle<std::vector<output_t<range_value_t<R>>>> grouped_reducescatter_async(
    R&& tensors, const ReducescatterOptions& options = {}) {
  using T = range_value_t<R>;
  DTRAIN_REQUIRE_TENSOR(T);
  DTRAIN_REQUIRE_OUTPUT(T);
  if constexpr (TensorWithOutput<T>) {
    const auto op = detail::name_op(options.name, detail::OpKind::reducescatter,
                                    "grouped_reducescatter", options.process_set);
    auto outputs = detail::group_outputs<T>(tensors);
    auto member = [&](const T& t, std::string name) {
      return detail::reduction(detail::describe(t, op, std::move(name)), options);
    };
    auto attach = [&](const T& t, detail::Entry& e, std::int32_t i) {
      detail::attach_group_output(outputs, t, e, i);
    };
    return {detail::submit_group(op, tensors, member, attach), outputs};
  }
}

template <Range R>
std::vector<output_t<range_value_t<R>>> grouped_reducescatter(
    R&& tensors, const ReducescatterOptions& options = {}) {
  return grouped_reducescatter_async(std::forward<R>(tensors), options).get();
}

}  // namespace dtrain
