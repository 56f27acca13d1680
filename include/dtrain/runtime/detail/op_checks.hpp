#pragma once
// The local checks of a submission: what one rank can tell is wrong with its own call before any
// peer is asked. Declared here for the collectives' templates and defined once with the engine
// (runtime/detail/op_checks_impl.hpp; Note [Build modes] in core/build_mode.hpp), so the messages'
// formatting is not compiled in every file that calls a collective. Each throws
// InvalidArgumentError naming the op, the tensor and what is wrong.
#include <cstdint>
#include <memory>
#include <span>

#include "dtrain/comm/reduce_op.hpp"
#include "dtrain/core/build_mode.hpp"
#include "dtrain/runtime/execution/entry.hpp"
#include "dtrain/runtime/negotiation/request.hpp"
#include "dtrain/runtime/process_set.hpp"

namespace dtrain::detail {

// `q` as built from a tensor of `numel` elements whose data pointer is null or not: element count,
// dtype, shape against the count, data, device support. Fills an empty shape with {numel}.
DTRAIN_API void check_tensor(Request& q, std::int64_t numel, bool has_data);

// Reduce op and scale factors for the tensor of `q`.
DTRAIN_API void check_reduction(const Request& q, ReduceOp op, double prescale, double postscale);

// A broadcast root: a world rank that is a member of the op's process set `set`.
DTRAIN_API void check_root(const Request& q, int root_rank, const SetOfOp& set);

// Alltoall splits: one non-negative row count per member of `set`, adding up to the tensor's
// rows.
DTRAIN_API void check_splits(const Request& q, std::span<const std::int64_t> splits,
                             const SetOfOp& set);

// A new entry for `q`, with a fresh completion state.
DTRAIN_API std::shared_ptr<Entry> new_entry(Request q);

}  // namespace dtrain::detail

#ifdef DTRAIN_HEADER_ONLY
#include "dtrain/runtime/detail/op_checks_impl.hpp"
#endif
