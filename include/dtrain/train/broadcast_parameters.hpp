#pragma once
// broadcast_parameters: make every rank start from root's weights.
//
// Before any data moves, every rank's parameter list (count, names, dtypes, shapes) is compared
// with root's; a difference raises the same MismatchError on every rank, naming the first
// parameter that differs, instead of a hang or silently mixed-up weights.
#include <algorithm>
#include <cstdint>
#include <iterator>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "dtrain/core/build_mode.hpp"
#include "dtrain/core/range.hpp"
#include "dtrain/runtime/collectives.hpp"

namespace dtrain {
namespace detail {

struct ParamDescriptor {
  std::string name;
  DataType dtype;
  std::vector<std::int64_t> shape;
  friend bool operator==(const ParamDescriptor&, const ParamDescriptor&) = default;

  template <class Self>
  static auto tie_fields(Self& d) {
    return std::tie(d.name, d.dtype, d.shape);
  }
};

// Collective. `local_error` (empty if none) is a problem this rank found in its own list, such as
// a duplicate name: it travels with the descriptors, so every rank throws instead of the others
// waiting forever in a broadcast the failing rank never submits.
DTRAIN_API void check_same_parameters(const std::vector<ParamDescriptor>& mine, int root_rank,
                                      std::string_view what, std::string local_error = {});

template <class T>
ParamDescriptor descriptor(std::string name, const T& t) {
  return {std::move(name), traits_of<T>::dtype(t), shape_of(t)};
}

template <class NamedRange>
void broadcast_named(NamedRange&& named, int root_rank, std::string_view what) {
  std::vector<std::string> names;
  for (auto&& [n, t] : named) names.emplace_back(n);
  std::vector<std::string> sorted = names;
  std::sort(sorted.begin(), sorted.end());
  std::string error;
  if (!sorted.empty() && sorted.front().empty())
    error = "a parameter has an empty name: every parameter needs a unique, non-empty name";
  else if (auto dup = std::adjacent_find(sorted.begin(), sorted.end()); dup != sorted.end())
    error = fmt::format("parameter name '{}' appears twice: names must be unique", *dup);
  // Sorting by name makes the order rank-independent whatever order the container yields.
  using Ref = std::pair<std::string, std::remove_reference_t<decltype(std::get<1>(*std::begin(named)))>*>;
  std::vector<Ref> refs;
  for (auto&& [n, t] : named) refs.emplace_back(std::string(n), &t);
  std::sort(refs.begin(), refs.end(), [](const Ref& a, const Ref& b) { return a.first < b.first; });
  std::vector<ParamDescriptor> mine;
  for (auto& [n, t] : refs) mine.push_back(descriptor(n, *t));
  check_same_parameters(mine, root_rank, what, std::move(error));
  std::vector<Handle> handles;
  handles.reserve(refs.size());
  for (auto& [n, t] : refs) handles.push_back(broadcast_async(*t, root_rank, fmt::format("{}.{}", what, n)));
  for (auto& h : handles) h.wait();
}

}  // namespace detail

// Broadcasts each tensor of `params` from root_rank, in place. Either a range of tensors (the
// order must be the same on every rank), or a range of (name, tensor) pairs or of items with
// key()/value() such as libtorch's named_parameters() (sorted by name first, so any container
// order works). With pairs, the tensors in the container must share memory with the model's
// (libtorch tensors and spans do; copies of std::vectors do not).
template <Range R>
void broadcast_parameters(R&& params, int root_rank = 0) {
  using V = range_value_t<R>;
  if constexpr (requires(V v) { std::get<0>(v); std::get<1>(v); }) {
    detail::broadcast_named(std::forward<R>(params), root_rank, "broadcast_parameters");
  } else if constexpr (requires(V v) { std::string(v.key()); v.value(); }) {
    // Ordered dictionaries such as libtorch's named_parameters(): items with key() and value().
    using T = std::remove_cvref_t<decltype(std::declval<V&>().value())>;
    std::vector<std::pair<std::string, T>> pairs;
    for (auto&& item : params) pairs.emplace_back(std::string(item.key()), item.value());
    detail::broadcast_named(pairs, root_rank, "broadcast_parameters");
  } else {
    DTRAIN_REQUIRE_MUTABLE_TENSOR(V);
    std::vector<detail::ParamDescriptor> mine;
    std::size_t i = 0;
    for (auto& t : params) mine.push_back(detail::descriptor(fmt::format("#{}", i++), t));
    detail::check_same_parameters(mine, root_rank, "broadcast_parameters");
    std::vector<Handle> handles;
    i = 0;
    for (auto& t : params)
      handles.push_back(broadcast_async(t, root_rank, fmt::format("broadcast_parameters.{}", i++)));
    for (auto& h : handles) h.wait();
  }
}

}  // namespace dtrain

#ifdef DTRAIN_HEADER_ONLY
#include "dtrain/train/broadcast_parameters_impl.hpp"
#endif
