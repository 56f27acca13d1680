#pragma once
// What ranks tell the coordinator (requests) and what the coordinator tells every rank
// (responses). See Note [Negotiation] in runtime/negotiation/coordinator.hpp. Each message names
// its fields once, in `tie_fields`, which the serializer (core/serialize.hpp) writes and reads in
// order; a field missing there is a field that never crosses the wire, and a test checks every
// field survives the round trip.
#include <cstdint>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "dtrain/core/serialize.hpp"
#include "dtrain/runtime/negotiation/request.hpp"

namespace dtrain::detail {

enum class ErrorKind : std::uint8_t { none, mismatch, invalid_argument, shutdown, timeout };

// One unit of work every rank executes in the same order: a (possibly fused) collective, a join
// completion, or an error for the named ops. The members of its process set run it; the other
// ranks skip it (Note [Process sets] in runtime/negotiation/coordinator.hpp).
struct Response {
  OpKind kind = OpKind::allreduce;
  std::vector<std::string> names;
  std::vector<std::int64_t> numels;     // per name: elements (lets joined ranks contribute zeros)
  DataType dtype = DataType::float32;
  Device device = Device::cpu();
  ReduceOp reduce_op = ReduceOp::Sum;
  double prescale = 1.0;
  double postscale = 1.0;
  std::int32_t root = 0;                // broadcast: the root's rank within the process set
  std::vector<std::int64_t> shape;      // allgather/broadcast: shape of the first rank's tensor
  // allgather: dim 0 of every member, in set rank order (0 for joined ranks), for each name in
  // turn: names.size() x set size entries.
  std::vector<std::int64_t> rank_rows;
  std::vector<std::int64_t> row_numels;  // allgather: per name, elements of one dim-0 row
  std::int32_t active_ranks = 0;        // ranks that did not join; Average divides by this
  // The process set that runs it. add_process_set: the id of the set it creates, whose world
  // ranks (ascending) are `set_ranks`; every rank of the world runs it.
  std::int32_t process_set = 0;
  std::vector<std::int32_t> set_ranks;
  std::int32_t last_joined_rank = -1;   // join
  // join: per OpKind, one past the highest generated count any member used on the set; members
  // catch up to it (Note [Generated names] in runtime/negotiation/op_names.hpp)
  std::vector<std::uint64_t> name_counts;
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
  template <class Self>
  static auto tie_fields(Self& s) {
    return std::tie(s.kind, s.names, s.numels, s.dtype, s.device, s.reduce_op, s.prescale,
                    s.postscale, s.root, s.shape, s.rank_rows, s.row_numels, s.active_ranks,
                    s.process_set, s.set_ranks, s.last_joined_rank, s.name_counts, s.error,
                    s.error_message, s.error_ranks);
  }
  friend bool operator==(const Response&, const Response&) = default;
};

// Rank -> coordinator.
struct RequestMessage {
  std::int32_t rank = 0;
  std::uint64_t responses_applied = 0;   // lets the coordinator retire evicted cache entries
  std::vector<Request> requests;         // full descriptions (cache misses)
  std::vector<std::uint64_t> cached;     // response-cache ids standing for full descriptions
  bool shutdown = false;                 // this rank called dtrain::shutdown()
  std::string fatal;                     // non-empty: this rank ends the job on every rank, and why
  bool last = false;  // the job ended: this rank's engine stopped and sends nothing after this

  template <class Self>
  static auto tie_fields(Self& m) {
    return std::tie(m.rank, m.responses_applied, m.requests, m.cached, m.shutdown, m.fatal,
                    m.last);
  }
  friend bool operator==(const RequestMessage&, const RequestMessage&) = default;
};

struct CacheInsert {
  std::uint64_t id = 0;
  std::string name;
  std::int32_t process_set = 0;

  template <class Self>
  static auto tie_fields(Self& c) {
    return std::tie(c.id, c.name, c.process_set);
  }
  friend bool operator==(const CacheInsert&, const CacheInsert&) = default;
};

// Settings the autotuner changes on every rank at the same message (Note [Configuration
// generations] in autotune/tuner.hpp). The coordinator's own knobs (fusion threshold, cycle time,
// response cache) change on rank 0 alone; these shape what every rank does with a response.
struct TunedSettings {
  std::uint64_t generation = 0;  // 0: no change in this message
  bool fusion_pipeline = true;
  bool hierarchical_allreduce = false;
  int pieces_in_flight = 2;  // local to each rank, but switched with the rest at one message
  friend bool operator==(const TunedSettings&, const TunedSettings&) = default;
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

  template <class Self>
  static auto tie_fields(Self& m) {
    return std::tie(m.seq, m.responses, m.cache_inserts, m.cache_evictions, m.fatal,
                    m.shutdown_complete, m.tuned);
  }
  friend bool operator==(const ResponseMessage&, const ResponseMessage&) = default;
};

template <class M>
std::vector<char> encode(const M& m) {
  return serialize_object(m);
}
template <class M>
M decode(const std::vector<char>& bytes) {
  try {
    return deserialize_object<M>(bytes.data(), bytes.size());
  } catch (const InvalidArgumentError&) {
    throw Error("dtrain: internal error: a control message does not decode (ranks running "
                "different dtrain versions?)");
  }
}

}  // namespace dtrain::detail
