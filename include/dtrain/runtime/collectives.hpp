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
#include <ranges>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dtrain/runtime/runtime.hpp"
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
  const std::int64_t numel = traits_of<T>::numel(t);
  const auto op = to_string(kind);
  if (numel < 0)
    throw InvalidArgumentError(fmt::format("dtrain: {} '{}': negative element count {}", op, q.name, numel));
  if (!is_valid(q.dtype))
    throw InvalidArgumentError(fmt::format("dtrain: {} '{}': invalid dtype value {}", op, q.name,
                                           static_cast<int>(q.dtype)));
  std::int64_t product = numel;
  try {
    if (!q.shape.empty()) product = detail::numel(q.shape);
  } catch (const InvalidArgumentError& e) {
    // Name the op and the tensor too: the shape alone does not say which call was wrong.
    constexpr std::string_view prefix = "dtrain: ";
    std::string_view why = e.what();
    if (why.starts_with(prefix)) why.remove_prefix(prefix.size());
    throw InvalidArgumentError(fmt::format("dtrain: {} '{}': {}", op, q.name, why));
  }
  if (q.shape.empty()) q.shape = {numel};
  else if (product != numel)
    throw InvalidArgumentError(fmt::format(
        "dtrain: {} '{}': shape [{}] has {} elements but the tensor reports {}", op, q.name,
        fmt::join(q.shape, ", "), product, numel));
  if (numel > 0 && traits_of<T>::data(t) == nullptr)
    throw InvalidArgumentError(fmt::format("dtrain: {} '{}': tensor data is null but it has {} elements",
                                           op, q.name, numel));
  if (q.device.is_cuda() && !device_backend_factory())
    throw InvalidArgumentError(fmt::format(
        "dtrain: {} '{}': the tensor is on {}, but this program was built without dtrain's CUDA "
        "support: include <dtrain/cuda.hpp> and link dtrain::cuda",
        op, q.name, q.device));
  return q;
}

inline void check_reduction(const Request& q, ReduceOp op, double prescale, double postscale) {
  for (const auto& [label, factor] : {std::pair{"prescale", prescale}, std::pair{"postscale", postscale}})
    if (!std::isfinite(factor))
      throw InvalidArgumentError(fmt::format("dtrain: {} '{}': the {} factor is {}; scale factors "
                                             "must be finite numbers",
                                             q.kind, q.name, label, factor));
  if (!is_floating_point(q.dtype) && (op == ReduceOp::Average || prescale != 1.0 || postscale != 1.0))
    throw InvalidArgumentError(fmt::format(
        "dtrain: {} '{}': {} on an integer tensor ({}): Average and scale factors are defined for "
        "floating-point tensors only (they would truncate). Use ReduceOp::Sum and divide yourself.",
        q.kind, q.name,
        op == ReduceOp::Average ? "ReduceOp::Average" : "a scale factor other than 1",
        q.dtype));
  if (static_cast<int>(op) > static_cast<int>(ReduceOp::Product))
    throw InvalidArgumentError(fmt::format("dtrain: {} '{}': invalid ReduceOp value {}",
                                           q.kind, q.name, static_cast<int>(op)));
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
  std::string name = generated ? eng->generate_name(kind) : std::string(given);
  return NamedOp{std::move(eng), std::move(name), kind, generated};
}

// Runs the local checks of `op`. One that fails submits the name as rejected, so the peers' ops of
// that name fail at once instead of waiting for this rank (Note [Failed ops]), then rethrows.
template <class F>
decltype(auto) checked(const NamedOp& op, F&& checks) {
  try {
    return checks();
  } catch (const InvalidArgumentError& e) {
    op.engine->reject(op.name, op.kind, e.what(), op.group);
    throw;
  }
}

template <class T>
std::shared_ptr<Entry> make_entry(Request q) {
  auto e = std::make_shared<Entry>();
  e->request = std::move(q);
  e->state = std::make_shared<OpState>();
  return e;
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
    auto e = detail::make_entry<T>(std::move(q));
    e->data = traits_of<T>::mutable_data(tensor);
    e->stream = detail::stream_of(tensor);
    Handle h(e->state);
    op.engine->submit(std::move(e));
    return h;
  }
}

template <class T>
void allreduce(T& tensor, const AllreduceOptions& options = {}) {
  allreduce_async(tensor, options).wait();
}

// Reduces every tensor of `tensors` (any range of tensors) as one group: the group is negotiated
// as a unit and its members are fused together. Member i is named "<name>.<i>".
template <std::ranges::range R>
Handle grouped_allreduce_async(R&& tensors, const AllreduceOptions& options = {}) {
  using T = std::ranges::range_value_t<R>;
  DTRAIN_REQUIRE_MUTABLE_TENSOR(T);
  if constexpr (MutableTensor<T>) {
    const auto op = detail::name_op(options.name, detail::OpKind::allreduce, "grouped_allreduce");
    const std::string& group = op.name;
    const auto count = static_cast<std::int32_t>(std::ranges::distance(tensors));
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
      auto e = detail::make_entry<T>(std::move(q));
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
      entries.push_back(detail::make_entry<void>(std::move(q)));
    }
    // The group's handle completes when the last member does, with the first member error.
    auto all = std::make_shared<detail::OpState>();
    auto remaining = std::make_shared<std::atomic<std::int32_t>>(static_cast<std::int32_t>(entries.size()));
    auto first_error = std::make_shared<std::exception_ptr>();
    auto error_mutex = std::make_shared<std::mutex>();
    for (auto& e : entries) {
      e->state->then = [all, remaining, first_error, error_mutex](std::exception_ptr err) {
        if (err) {
          std::lock_guard lock(*error_mutex);
          if (!*first_error) *first_error = err;
        }
        if (remaining->fetch_sub(1) == 1) {
          std::lock_guard lock(*error_mutex);
          all->complete(*first_error);
        }
      };
    }
    op.engine->submit_all(std::move(entries));
    return Handle(all);
  }
}

template <std::ranges::range R>
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
    auto e = detail::make_entry<T>(std::move(q));
    auto slot = detail::attach_output(*e, tensor);
    ResultHandle<output_t<T>> h(e->state, slot);
    op.engine->submit(std::move(e));
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
      const int size = op.engine->size();
      if (root_rank < 0 || root_rank >= size)
        throw InvalidArgumentError(fmt::format(
            "dtrain: broadcast '{}': root rank {} is out of range: the world has {} ranks (0..{})",
            q.name, root_rank, size, size - 1));
      return q;
    });
    q.root = root_rank;
    auto e = detail::make_entry<T>(std::move(q));
    e->data = traits_of<T>::mutable_data(tensor);
    e->stream = detail::stream_of(tensor);
    Handle h(e->state);
    op.engine->submit(std::move(e));
    return h;
  }
}

template <class T>
void broadcast(T& tensor, int root_rank, std::string_view name = {}) {
  broadcast_async(tensor, root_rank, name).wait();
}

// ---- alltoall ---------------------------------------------------------------------------------

// Sends splits[r] rows (dim 0) to rank r, in order; receives the rows every rank sent here.
template <class T, std::ranges::range Splits>
  requires std::integral<std::ranges::range_value_t<Splits>>
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
      std::int64_t sum = 0;
      for (auto v : s) {
        if (v < 0)
          throw InvalidArgumentError(fmt::format("dtrain: alltoall '{}': negative split in [{}]",
                                                 q.name, fmt::join(s, ", ")));
        sum += v;
      }
      const int size = op.engine->size();
      if (static_cast<int>(s.size()) != size)
        throw InvalidArgumentError(fmt::format(
            "dtrain: alltoall '{}': {} splits given but the world has {} ranks: give one row "
            "count per destination rank",
            q.name, s.size(), size));
      if (sum != q.dim0())
        throw InvalidArgumentError(fmt::format(
            "dtrain: alltoall '{}': splits [{}] add up to {} rows but the tensor has {} rows (dim 0)",
            q.name, fmt::join(s, ", "), sum, q.dim0()));
      return q;
    });
    auto e = detail::make_entry<T>(std::move(q));
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
    op.engine->submit(std::move(e));
    return h;
  }
}

template <class T, std::ranges::range Splits>
  requires std::integral<std::ranges::range_value_t<Splits>>
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
    auto e = detail::make_entry<T>(std::move(q));
    auto slot = detail::attach_output(*e, tensor);
    ResultHandle<output_t<T>> h(e->state, slot);
    named.engine->submit(std::move(e));
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
  auto e = detail::make_entry<void>(std::move(q));
  Handle h(e->state);
  op.engine->submit(std::move(e));
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
  auto e = detail::make_entry<void>(std::move(q));
  auto last = std::make_shared<std::optional<int>>();
  e->set_last_joined = [last](int rank) { *last = rank; };
  ResultHandle<int> h(e->state, last);
  eng->submit(std::move(e));
  return h.get();
}

}  // namespace dtrain
