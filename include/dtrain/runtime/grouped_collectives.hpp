#pragma once
// The grouped collectives: one op over a range of tensors, negotiated as a unit and completed
// together. Member i of group "<name>" is named "<name>.<i>"; every rank must pass the same
// number of tensors, and a local error in any member fails the whole group on every rank (Note
// [Failed ops] in runtime/negotiation/failed_ops.hpp). Members that may fuse do (Note [Fusion
// planning]).
#include <cstdint>
#include <iterator>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "dtrain/core/range.hpp"
#include "dtrain/runtime/collectives.hpp"

namespace dtrain {
namespace detail {

// One member of a group whose op returns new tensors, as the compiled part sees it (Note
// [Compiled submission]): member i makes its output into element i of the group's outputs.
struct GroupMember {
  TensorSource tensor;
  OutputMaker make_output;
};

DTRAIN_API Handle submit_grouped_allreduce(std::vector<TensorSource> members,
                                           const AllreduceOptions& options);
DTRAIN_API std::shared_ptr<OpState> submit_grouped_allgather(std::vector<GroupMember> members,
                                                             const CollectiveOptions& options);
DTRAIN_API std::shared_ptr<OpState> submit_grouped_reducescatter(
    std::vector<GroupMember> members, const ReducescatterOptions& options);

template <class T>
using GroupOutputs = std::shared_ptr<std::optional<std::vector<output_t<T>>>>;

// The members of `tensors`, each making its output into its element of `outputs`.
template <class T, Range R>
std::vector<GroupMember> members_with_outputs(R& tensors, GroupOutputs<T>& outputs) {
  outputs = std::make_shared<std::optional<std::vector<output_t<T>>>>();
  outputs->emplace(static_cast<std::size_t>(std::distance(std::begin(tensors), std::end(tensors))));
  std::vector<GroupMember> members;
  std::size_t i = 0;
  for (const auto& t : tensors) {
    members.push_back({TensorSource::input(t), [outputs, like = &t, i](const Shape& s) -> void* {
                         auto& out = (**outputs)[i];
                         out = traits_of<T>::make_output(*like, s);
                         return traits_of<T>::output_data(out);
                       }});
    ++i;
  }
  return members;
}

}  // namespace detail

// ---- grouped allreduce ------------------------------------------------------------------------

// Reduces every tensor of `tensors` (any range of tensors) as one group, fused together.
template <Range R>
Handle grouped_allreduce_async(R&& tensors, const AllreduceOptions& options = {}) {
  using T = range_value_t<R>;
  DTRAIN_REQUIRE_MUTABLE_TENSOR(T);
  if constexpr (MutableTensor<T>) {
    std::vector<detail::TensorSource> members;
    for (auto& t : tensors) members.push_back(detail::TensorSource::in_place(t));
    return detail::submit_grouped_allreduce(std::move(members), options);
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
    detail::GroupOutputs<T> outputs;
    auto members = detail::members_with_outputs<T>(tensors, outputs);
    return {detail::submit_grouped_allgather(std::move(members), options), std::move(outputs)};
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
    detail::GroupOutputs<T> outputs;
    auto members = detail::members_with_outputs<T>(tensors, outputs);
    return {detail::submit_grouped_reducescatter(std::move(members), options), std::move(outputs)};
  }
}

template <Range R>
std::vector<output_t<range_value_t<R>>> grouped_reducescatter(
    R&& tensors, const ReducescatterOptions& options = {}) {
  return grouped_reducescatter_async(std::forward<R>(tensors), options).get();
}

}  // namespace dtrain

#ifdef DTRAIN_HEADER_ONLY
#include "dtrain/runtime/detail/grouped_collectives_impl.hpp"
#endif
