#pragma once
// The plain reference of a reduction across ranks, computed on the host in double: what a
// collective's result is checked against.

#include <algorithm>

#include "dtrain/comm/reduce_op.hpp"

namespace dtrain::test {

// value_of(r) is rank r's contribution; Average divides the sum by the number of ranks.
template <class ValueOf>
double reference_reduce(dtrain::ReduceOp op, int size, ValueOf&& value_of) {
  double acc = value_of(0);
  for (int r = 1; r < size; ++r) {
    const double v = value_of(r);
    switch (op) {
      case dtrain::ReduceOp::Average:
      case dtrain::ReduceOp::Sum: acc += v; break;
      case dtrain::ReduceOp::Min: acc = std::min(acc, v); break;
      case dtrain::ReduceOp::Max: acc = std::max(acc, v); break;
      case dtrain::ReduceOp::Product: acc *= v; break;
      case dtrain::ReduceOp::Adasum: break;  // not element-wise: tests/mpi/test_adasum.cpp
    }
  }
  if (op == dtrain::ReduceOp::Average) acc /= size;
  return acc;
}

}  // namespace dtrain::test
