#pragma once
// What a collective takes besides its tensors: options structs, written with designated
// initializers (`allreduce(t, {.op = ReduceOp::Sum, .name = "grad"})`). Every op has a name
// (empty: generated, Note [Generated names] in runtime/negotiation/op_names.hpp) and a process set
// (the world unless given; runtime/process_set.hpp).
#include <string>

#include "dtrain/comm/reduce_op.hpp"
#include "dtrain/runtime/process_set.hpp"

namespace dtrain {

// allreduce and grouped_allreduce.
struct AllreduceOptions {
  ReduceOp op = ReduceOp::Average;
  double prescale = 1.0;   // multiplies the input before the reduction
  double postscale = 1.0;  // multiplies the result
  std::string name = {};   // empty: generated
  ProcessSet process_set = {};
};

// reducescatter and grouped_reducescatter: the same reduction, then each rank keeps its slice.
struct ReducescatterOptions {
  ReduceOp op = ReduceOp::Average;
  double prescale = 1.0;   // multiplies the input before the reduction
  double postscale = 1.0;  // multiplies this rank's slice of the result
  std::string name = {};   // empty: generated
  ProcessSet process_set = {};
};

// Ops with nothing else to choose: allgather, grouped_allgather, broadcast (its root stays an
// argument), alltoall (with its splits), barrier.
struct CollectiveOptions {
  std::string name = {};  // empty: generated
  ProcessSet process_set = {};
};

}  // namespace dtrain
