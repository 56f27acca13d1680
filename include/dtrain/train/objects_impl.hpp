#pragma once
#include <string>
#include <string_view>

#include "dtrain/runtime/detail/collectives_impl.hpp"
#include "dtrain/train/objects.hpp"

namespace dtrain::detail {

inline std::string object_op_name(std::string_view given, OpKind kind, std::string_view caller) {
  NamedOp op = name_op(given, kind, caller);
  const std::string base = op.name;
  // The collective the peers wait on first.
  op.name = base + (kind == OpKind::broadcast ? ".size" : ".sizes");
  checked(op, [] {});
  return base;
}

DTRAIN_API std::string broadcast_object_name(std::string_view given) {
  return object_op_name(given, OpKind::broadcast, "broadcast_object");
}

DTRAIN_API std::string allgather_object_name(std::string_view given) {
  return object_op_name(given, OpKind::allgather, "allgather_object");
}

}  // namespace dtrain::detail
