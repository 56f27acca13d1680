#pragma once
// What ranks tell the coordinator (requests) and what the coordinator tells every rank
// (responses). See Note [Negotiation] in runtime/coordinator.hpp.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "dtrain/comm/reduce_op.hpp"
#include "dtrain/runtime/wire.hpp"
#include "dtrain/tensor/device.hpp"
#include "dtrain/tensor/dtype.hpp"
#include "dtrain/tensor/shape.hpp"

namespace dtrain::detail {

enum class OpKind : std::uint8_t { allreduce, allgather, broadcast, alltoall, reducescatter, barrier, join };

constexpr std::string_view to_string(OpKind k) noexcept {
  switch (k) {
    case OpKind::allreduce: return "allreduce";
    case OpKind::allgather: return "allgather";
    case OpKind::broadcast: return "broadcast";
    case OpKind::alltoall: return "alltoall";
    case OpKind::reducescatter: return "reducescatter";
    case OpKind::barrier: return "barrier";
    case OpKind::join: return "join";
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
  std::string group;             // grouped_allreduce: members complete together
  std::int32_t group_size = 0;
  std::string rejected;          // non-empty: the rank refused its own call, and why (Note [Failed ops])

  std::int64_t numel() const { return detail::numel(shape); }
  std::int64_t dim0() const noexcept { return shape.empty() ? 1 : shape[0]; }
  std::int64_t row_numel() const { return detail::row_numel(shape); }

  void write(WireWriter& w) const {
    w.put(name); w.put(kind); w.put(dtype); w.put(device); w.put(reduce_op);
    w.put(prescale); w.put(postscale); w.put(root); w.put(shape); w.put(group); w.put(group_size);
    w.put(rejected);
  }
  void read(WireReader& r) {
    r.get(name); r.get(kind); r.get(dtype); r.get(device); r.get(reduce_op);
    r.get(prescale); r.get(postscale); r.get(root); r.get(shape); r.get(group); r.get(group_size);
    r.get(rejected);
  }
  // Same negotiated metadata (the name aside): what the response cache compares.
  bool same_metadata(const Request& o) const noexcept {
    return kind == o.kind && dtype == o.dtype && device == o.device && reduce_op == o.reduce_op &&
           prescale == o.prescale && postscale == o.postscale && root == o.root &&
           shape == o.shape && group == o.group && group_size == o.group_size;
  }
};

enum class ErrorKind : std::uint8_t { none, mismatch, invalid_argument, shutdown, timeout };

// One unit of work every rank executes in the same order: a (possibly fused) collective, a join
// completion, or an error for the named ops.
struct Response {
  OpKind kind = OpKind::allreduce;
  std::vector<std::string> names;
  std::vector<std::int64_t> numels;     // per name: elements (lets joined ranks contribute zeros)
  DataType dtype = DataType::float32;
  Device device = Device::cpu();
  ReduceOp reduce_op = ReduceOp::Sum;
  double prescale = 1.0;
  double postscale = 1.0;
  std::int32_t root = 0;
  std::vector<std::int64_t> shape;      // allgather/broadcast: shape of rank `root`'s tensor
  std::vector<std::int64_t> rank_rows;  // allgather: dim 0 of every rank (0 for joined ranks)
  std::int32_t active_ranks = 0;        // ranks that did not join; Average divides by this
  std::int32_t last_joined_rank = -1;   // join
  ErrorKind error = ErrorKind::none;
  std::string error_message;
  // An error applies to these ranks only (empty: to every rank): a rank whose submission of the
  // name has not reached the coordinator yet, or that has submitted the name again since, must
  // not have that other op failed (Note [Failed ops]).
  std::vector<std::int32_t> error_ranks;

  bool applies_to(int rank) const noexcept {
    if (error == ErrorKind::none || error_ranks.empty()) return true;
    for (auto r : error_ranks)
      if (r == rank) return true;
    return false;
  }

  std::int64_t total_numel() const noexcept {
    std::int64_t n = 0;
    for (auto x : numels) n += x;
    return n;
  }
  void write(WireWriter& w) const {
    w.put(kind); w.put(names); w.put(numels); w.put(dtype); w.put(device); w.put(reduce_op);
    w.put(prescale); w.put(postscale); w.put(root); w.put(shape); w.put(rank_rows);
    w.put(active_ranks); w.put(last_joined_rank); w.put(error); w.put(error_message);
    w.put(error_ranks);
  }
  void read(WireReader& r) {
    r.get(kind); r.get(names); r.get(numels); r.get(dtype); r.get(device); r.get(reduce_op);
    r.get(prescale); r.get(postscale); r.get(root); r.get(shape); r.get(rank_rows);
    r.get(active_ranks); r.get(last_joined_rank); r.get(error); r.get(error_message);
    r.get(error_ranks);
  }
};

// Rank -> coordinator.
struct RequestMessage {
  std::int32_t rank = 0;
  std::uint64_t responses_applied = 0;   // lets the coordinator retire evicted cache entries
  std::vector<Request> requests;         // full descriptions (cache misses)
  std::vector<std::uint64_t> cached;     // response-cache ids standing for full descriptions
  bool shutdown = false;                 // this rank called dtrain::shutdown()

  void write(WireWriter& w) const {
    w.put(rank); w.put(responses_applied); w.put(static_cast<std::uint32_t>(requests.size()));
    for (const auto& q : requests) q.write(w);
    w.put(cached); w.put(shutdown);
  }
  void read(WireReader& r) {
    std::uint32_t n = 0;
    r.get(rank); r.get(responses_applied); r.get(n);
    requests.resize(n);
    for (auto& q : requests) q.read(r);
    r.get(cached); r.get(shutdown);
  }
};

struct CacheInsert {
  std::uint64_t id = 0;
  std::string name;
};

// Settings the autotuner changes on every rank at the same message (Note [Configuration
// generations] in autotune/tuner.hpp). The coordinator's own knobs (fusion threshold, cycle time,
// response cache) change on rank 0 alone; these shape what every rank does with a response.
struct TunedSettings {
  std::uint64_t generation = 0;  // 0: no change in this message
  bool fusion_pipeline = true;
  bool hierarchical_allreduce = false;
};

// Coordinator -> every rank.
struct ResponseMessage {
  std::uint64_t seq = 0;
  std::vector<Response> responses;
  std::vector<CacheInsert> cache_inserts;   // applied before the responses
  std::vector<std::uint64_t> cache_evictions;
  std::string fatal;                        // non-empty: the engine stops; every op fails with it
  bool shutdown_complete = false;           // every rank called shutdown: engines exit
  TunedSettings tuned;                      // applied before the responses

  void write(WireWriter& w) const {
    w.put(seq); w.put(static_cast<std::uint32_t>(responses.size()));
    for (const auto& s : responses) s.write(w);
    w.put(static_cast<std::uint32_t>(cache_inserts.size()));
    for (const auto& c : cache_inserts) { w.put(c.id); w.put(c.name); }
    w.put(cache_evictions); w.put(fatal); w.put(shutdown_complete); w.put(tuned);
  }
  void read(WireReader& r) {
    std::uint32_t n = 0;
    r.get(seq); r.get(n);
    responses.resize(n);
    for (auto& s : responses) s.read(r);
    r.get(n);
    cache_inserts.resize(n);
    for (auto& c : cache_inserts) { r.get(c.id); r.get(c.name); }
    r.get(cache_evictions); r.get(fatal); r.get(shutdown_complete); r.get(tuned);
  }
};

template <class M>
std::vector<char> encode(const M& m) {
  std::vector<char> out;
  WireWriter w(out);
  m.write(w);
  return out;
}
template <class M>
M decode(const std::vector<char>& bytes) {
  M m;
  WireReader r(bytes.data(), bytes.size());
  m.read(r);
  return m;
}

}  // namespace dtrain::detail
