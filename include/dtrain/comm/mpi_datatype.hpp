#pragma once
// DataType -> MPI_Datatype, ReduceOp -> MPI_Op. MPI has no 16-bit float types, so float16 and
// bfloat16 travel as MPI_UINT16_T and reduce through user-defined ops that widen each pair to
// float, apply the op and round back to nearest-even.
#include <mpi.h>

#include <array>

#include "dtrain/comm/local_reduce.hpp"
#include "dtrain/comm/mpi_error.hpp"

namespace dtrain::detail {

inline MPI_Datatype mpi_datatype(DataType dtype) {
  switch (dtype) {
    case DataType::uint8: return MPI_UINT8_T;
    case DataType::int8: return MPI_INT8_T;
    case DataType::int32: return MPI_INT32_T;
    case DataType::int64: return MPI_INT64_T;
    case DataType::float16:
    case DataType::bfloat16: return MPI_UINT16_T;
    case DataType::float32: return MPI_FLOAT;
    case DataType::float64: return MPI_DOUBLE;
  }
  throw InvalidArgumentError("dtrain: no MPI datatype for DataType " +
                             std::to_string(static_cast<int>(dtype)));
}

template <class T, ReduceOp Op>
void half_user_op(void* in, void* inout, int* len, MPI_Datatype*) {
  reduce_into<T>(Op, static_cast<const T*>(in), static_cast<T*>(inout), *len);
}

// User-defined MPI ops for the 16-bit float types, created once per MPI lifetime.
class HalfOps {
 public:
  void create() {
    if (created_) return;
    make<float16_t>(f16_);
    make<bfloat16_t>(bf16_);
    created_ = true;
  }
  void destroy() noexcept {
    if (!created_) return;
    for (auto* table : {&f16_, &bf16_})
      for (auto& op : *table)
        if (op != MPI_OP_NULL) MPI_Op_free(&op);
    created_ = false;
  }
  MPI_Op get(DataType dtype, ReduceOp op) const {
    if (!created_) throw Error("dtrain: internal error: 16-bit float MPI ops used before init");
    const auto& table = dtype == DataType::float16 ? f16_ : bf16_;
    return table[static_cast<int>(op)];
  }

 private:
  using Table = std::array<MPI_Op, 5>;
  template <class T>
  static void make(Table& t) {
    mpi_check(MPI_Op_create(&half_user_op<T, ReduceOp::Average>, 1, &t[0]), "MPI_Op_create");
    mpi_check(MPI_Op_create(&half_user_op<T, ReduceOp::Sum>, 1, &t[1]), "MPI_Op_create");
    mpi_check(MPI_Op_create(&half_user_op<T, ReduceOp::Min>, 1, &t[2]), "MPI_Op_create");
    mpi_check(MPI_Op_create(&half_user_op<T, ReduceOp::Max>, 1, &t[3]), "MPI_Op_create");
    mpi_check(MPI_Op_create(&half_user_op<T, ReduceOp::Product>, 1, &t[4]), "MPI_Op_create");
  }
  Table f16_{MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};
  Table bf16_{MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};
  bool created_ = false;
};

inline HalfOps& half_ops() {
  static HalfOps ops;
  return ops;
}

// Average is executed as Sum followed by a division folded into the postscale.
inline MPI_Op mpi_op(ReduceOp op, DataType dtype) {
  if (dtype == DataType::float16 || dtype == DataType::bfloat16)
    return half_ops().get(dtype, op == ReduceOp::Average ? ReduceOp::Sum : op);
  switch (op) {
    case ReduceOp::Average:
    case ReduceOp::Sum: return MPI_SUM;
    case ReduceOp::Min: return MPI_MIN;
    case ReduceOp::Max: return MPI_MAX;
    case ReduceOp::Product: return MPI_PROD;
    case ReduceOp::Adasum: break;  // never reaches MPI as an op (Note [Adasum tree])
  }
  return MPI_SUM;
}

}  // namespace dtrain::detail
