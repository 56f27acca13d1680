#pragma once
// What one rank submits for one op: its kind and the metadata every rank must agree on. Public
// (collectives build it); how it travels to the coordinator is runtime/negotiation/messages.hpp's
// concern.
#include <cstdint>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "dtrain/comm/reduce_op.hpp"
#include "dtrain/tensor/device.hpp"
#include "dtrain/tensor/dtype.hpp"
#include "dtrain/tensor/shape.hpp"

namespace dtrain::detail {

enum class OpKind : std::uint8_t {
  allreduce, allgather, broadcast, alltoall, reducescatter, barrier, join, process_set
};

constexpr std::string_view to_string(OpKind k) noexcept {
  switch (k) {
    case OpKind::allreduce: return "allreduce";
    case OpKind::allgather: return "allgather";
    case OpKind::broadcast: return "broadcast";
    case OpKind::alltoall: return "alltoall";
    case OpKind::reducescatter: return "reducescatter";
    case OpKind::barrier: return "barrier";
    case OpKind::join: return "join";
    case OpKind::process_set: return "add_process_set";
  }
  return "unknown";
}

}  // namespace dtrain::detail

// `{}` writes to_string(k), the op's name in messages ("allreduce", "alltoall", ...).
template <>
struct fmt::formatter<dtrain::detail::OpKind> : fmt::formatter<std::string_view> {
  auto format(dtrain::detail::OpKind k, fmt::format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(dtrain::detail::to_string(k), ctx);
  }
};

namespace dtrain::detail {

// The negotiated description of one op as submitted on one rank.
struct Request {
  std::string name;
  OpKind kind = OpKind::allreduce;
  DataType dtype = DataType::float32;
  Device device = Device::cpu();
  ReduceOp reduce_op = ReduceOp::Average;
  double prescale = 1.0;
  double postscale = 1.0;
  std::int32_t root = 0;
  std::vector<std::int64_t> shape;
  std::string group;             // grouped ops: members complete together
  std::int32_t group_size = 0;
  std::int32_t process_set = 0;  // the set it runs on (0: the world); names are unique per set
  std::vector<std::int32_t> set_ranks;  // add_process_set: the new set's world ranks, ascending
  std::string rejected;          // non-empty: the rank refused its own call, and why (Note [Failed ops])

  std::int64_t numel() const { return detail::numel(shape); }
  std::int64_t dim0() const noexcept { return shape.empty() ? 1 : shape[0]; }
  std::int64_t row_numel() const { return detail::row_numel(shape); }

  // The negotiated metadata (everything but the name and the refusal): what the response cache
  // compares, and what every rank must agree on.
  template <class Self>
  static auto tie_metadata(Self& q) {
    return std::tie(q.kind, q.dtype, q.device, q.reduce_op, q.prescale, q.postscale, q.root,
                    q.shape, q.group, q.group_size, q.process_set, q.set_ranks);
  }
  template <class Self>
  static auto tie_fields(Self& q) {
    return std::tuple_cat(std::tie(q.name), tie_metadata(q), std::tie(q.rejected));
  }
  bool same_metadata(const Request& o) const { return tie_metadata(*this) == tie_metadata(o); }
  friend bool operator==(const Request&, const Request&) = default;
};

}  // namespace dtrain::detail
