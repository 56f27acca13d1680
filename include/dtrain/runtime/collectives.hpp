#pragma once
// The public collectives. Every op is collective over its process set (the world unless its
// options name one: runtime/process_set.hpp) and matched across the set's ranks by name (given,
// or generated from the op kind and a per-kind call count), so ranks may submit in different
// orders. `_async` forms return a handle; sync forms wait on it. In-place ops (allreduce,
// broadcast) write into the caller's tensor, which must stay alive and untouched until the op
// completes. The grouped forms are in runtime/grouped_collectives.hpp.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "dtrain/core/build_mode.hpp"
#include "dtrain/core/range.hpp"
#include "dtrain/runtime/collective_options.hpp"
#include "dtrain/runtime/handle.hpp"
#include "dtrain/runtime/process_set.hpp"
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

class OpState;

// Note [Compiled submission]
// The templates below do only what needs the caller's tensor type: they hand the compiled part a
// TensorSource (the tensor and the function that reads it through its tensor_traits) and, for ops
// that return a new tensor, an OutputMaker. Naming, the local checks, the entry and the
// submission are in collectives_impl.hpp, compiled once (dtrain::dtrain) instead of in every file
// that calls a collective. The compiled part reads the tensor inside the op's checks, so a tensor
// its traits refuse fails the op on every rank (Note [Failed ops]) like any other local error.

// The compiled part sees a tensor as a TensorView, its shape always filled in: of the tensor's
// writable memory for an in-place op (in_place), of memory only read for an op with a new output
// (input), whose pointer the entry keeps as const (Entry::input).
class TensorSource {
 public:
  template <class T>
  static TensorSource in_place(T& tensor) {
    return TensorSource(&tensor, [](const void* p) {
      auto& t = const_cast<T&>(*static_cast<const T*>(p));  // taken as T&: not a const object
      return view_of(t, traits_of<T>::mutable_data(t));
    });
  }
  template <class T>
  static TensorSource input(const T& tensor) {
    return TensorSource(&tensor, [](const void* p) {
      const T& t = *static_cast<const T*>(p);
      return view_of(t, const_cast<void*>(traits_of<T>::data(t)));
    });
  }

  TensorView read() const { return read_(tensor_); }

 private:
  using Reader = TensorView (*)(const void*);
  TensorSource(const void* tensor, Reader read) : tensor_(tensor), read_(read) {}

  template <class T>
  static TensorView view_of(const T& t, void* data) {
    const DataType dtype = traits_of<T>::dtype(t);
    const Device device = traits_of<T>::device(t);
    Shape shape = shape_of(t);
    return TensorView(data, static_cast<std::int64_t>(traits_of<T>::numel(t)), dtype, device,
                      std::move(shape), stream_of(t));
  }

  const void* tensor_;
  Reader read_;
};

// Allocates an op's new tensor on the engine thread, once its shape is negotiated, and returns its
// memory.
using OutputMaker = std::function<void*(const Shape&)>;

template <class T>
using OutputSlot = std::shared_ptr<std::optional<output_t<T>>>;

// An OutputMaker that makes `like`'s output type into `slot`.
template <class T>
OutputMaker output_into(OutputSlot<T> slot, const T& like) {
  return [slot = std::move(slot), like_ptr = &like](const Shape& s) -> void* {
    slot->emplace(traits_of<T>::make_output(*like_ptr, s));
    return traits_of<T>::output_data(**slot);
  };
}

DTRAIN_API Handle submit_allreduce(TensorSource tensor, const AllreduceOptions& options);
DTRAIN_API Handle submit_broadcast(TensorSource tensor, int root_rank,
                                   const CollectiveOptions& options);
DTRAIN_API std::shared_ptr<OpState> submit_allgather(TensorSource tensor, OutputMaker make_output,
                                                     const CollectiveOptions& options);
DTRAIN_API std::shared_ptr<OpState> submit_reducescatter(TensorSource tensor,
                                                         OutputMaker make_output,
                                                         const ReducescatterOptions& options);
DTRAIN_API std::shared_ptr<OpState> submit_alltoall(
    TensorSource tensor, std::vector<std::int64_t> splits, OutputMaker make_output,
    std::function<void(std::vector<std::int64_t>)> set_received_splits,
    const CollectiveOptions& options);

// Fails the world's allreduce `name` on every rank with `why`, for an op whose own checks failed
// before it submitted: the peers' ops of that name fail at once (Note [Failed ops]).
DTRAIN_API void reject_allreduce(const std::string& name, const std::string& why,
                                 std::string_view caller);

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
    return detail::submit_allreduce(detail::TensorSource::in_place(tensor), options);
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
    auto slot = std::make_shared<std::optional<output_t<T>>>();
    auto state = detail::submit_allgather(detail::TensorSource::input(tensor),
                                          detail::output_into(slot, tensor), options);
    return ResultHandle<output_t<T>>(std::move(state), std::move(slot));
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
    return detail::submit_broadcast(detail::TensorSource::in_place(tensor), root_rank, options);
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
    std::vector<std::int64_t> s;
    for (auto v : splits) s.push_back(static_cast<std::int64_t>(v));
    auto result = std::make_shared<std::optional<AlltoallResult<T>>>();
    result->emplace();
    auto make_output = [result, like = &tensor](const Shape& shape) -> void* {
      (*result)->output = traits_of<T>::make_output(*like, shape);
      return traits_of<T>::output_data((*result)->output);
    };
    auto set_received_splits = [result](std::vector<std::int64_t> r) {
      (*result)->received_splits = std::move(r);
    };
    auto state = detail::submit_alltoall(detail::TensorSource::input(tensor), std::move(s),
                                         std::move(make_output), std::move(set_received_splits),
                                         options);
    return ResultHandle<AlltoallResult<T>>(std::move(state), std::move(result));
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
    auto slot = std::make_shared<std::optional<output_t<T>>>();
    auto state = detail::submit_reducescatter(detail::TensorSource::input(tensor),
                                              detail::output_into(slot, tensor), options);
    return ResultHandle<output_t<T>>(std::move(state), std::move(slot));
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

DTRAIN_API Handle barrier_async(const CollectiveOptions& options);
inline Handle barrier_async(std::string_view name = {}) {
  return barrier_async(CollectiveOptions{std::string(name)});
}
inline void barrier(const CollectiveOptions& options) { barrier_async(options).wait(); }
inline void barrier() { barrier_async().wait(); }

// Declares that this rank has no more data for this round on `process_set` (the world unless
// given). Until every member has joined, it keeps taking part in the set's allreduce
// (contributing zeros: Average divides by the ranks that did not join), allgather (contributing no
// rows) and broadcast. The handle's result is the world rank of the last member to join.
DTRAIN_API ResultHandle<int> join_async(const ProcessSet& process_set = {});
inline int join(const ProcessSet& process_set = {}) { return join_async(process_set).get(); }

}  // namespace dtrain

#include "dtrain/runtime/grouped_collectives.hpp"

#ifdef DTRAIN_HEADER_ONLY
#include "dtrain/runtime/detail/collectives_impl.hpp"
#endif
