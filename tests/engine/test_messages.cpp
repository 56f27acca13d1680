// The control messages on the wire: every field of every message survives encode and decode
// (each message names its fields once, in tie_fields; a field left out of that list would come
// back with its default and fail here), and bytes that do not decode fail with a clear error.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "dtrain/runtime/negotiation/messages.hpp"

namespace {

using namespace dtrain;
using namespace dtrain::detail;

// Every field differs from its default.
Request full_request() {
  Request q;
  q.name = "layer1.weight";
  q.kind = OpKind::reducescatter;
  q.dtype = DataType::bfloat16;
  q.device = Device::cuda(3);
  q.reduce_op = ReduceOp::Max;
  q.prescale = 0.5;
  q.postscale = 0.25;
  q.root = 2;
  q.shape = {3, 5, 7};
  q.group = "grads";
  q.group_size = 4;
  q.process_set = 3;
  q.set_ranks = {0, 2};
  q.rejected = "shape differs";
  return q;
}

Response full_response() {
  Response s;
  s.kind = OpKind::allgather;
  s.names = {"a", "b"};
  s.numels = {6, 8};
  s.dtype = DataType::float64;
  s.device = Device::cuda(1);
  s.reduce_op = ReduceOp::Min;
  s.prescale = 2.0;
  s.postscale = 0.125;
  s.root = 1;
  s.shape = {2, 3};
  s.rank_rows = {2, 0, 4};
  s.row_numels = {3, 5};
  s.active_ranks = 2;
  s.process_set = 2;
  s.set_ranks = {1, 3};
  s.last_joined_rank = 1;
  s.error = ErrorKind::mismatch;
  s.error_message = "dtrain: shapes differ";
  s.error_ranks = {0, 2};
  return s;
}

template <class M>
M round_trip(const M& m) {
  return decode<M>(encode(m));
}

TEST_SUITE("unit") {

TEST_CASE("every field of a request message survives the wire") {
  RequestMessage m;
  m.rank = 5;
  m.responses_applied = 12345;
  m.requests = {full_request(), full_request()};
  m.requests[1].name = "layer2.bias";
  m.cached = {4, 9, 1ull << 40};
  m.shutdown = true;
  m.fatal = "dtrain: rank 5 made an unnamed allreduce from a thread other than the init thread";
  m.last = true;
  CHECK(round_trip(m) == m);
  CHECK(round_trip(RequestMessage{}) == RequestMessage{});
}

TEST_CASE("every field of a response message survives the wire") {
  ResponseMessage m;
  m.seq = 77;
  m.responses = {full_response(), Response{}};
  m.cache_inserts = {{.id = 3, .name = "a"}, {.id = 8, .name = "b", .process_set = 2}};
  m.cache_evictions = {1, 2};
  m.fatal = "dtrain: rank 2 was lost";
  m.shutdown_complete = true;
  m.tuned = {.generation = 4, .fusion_pipeline = false, .hierarchical_allreduce = true};
  CHECK(round_trip(m) == m);
  CHECK(round_trip(ResponseMessage{}) == ResponseMessage{});
}

TEST_CASE("the response cache compares the metadata, not the name or the refusal") {
  const Request a = full_request();
  Request b = a;
  b.name = "other";
  b.rejected.clear();
  CHECK(a.same_metadata(b));
  for (auto change : std::vector<void (*)(Request&)>{
           [](Request& q) { q.kind = OpKind::allreduce; },
           [](Request& q) { q.dtype = DataType::float32; },
           [](Request& q) { q.device = Device::cpu(); },
           [](Request& q) { q.reduce_op = ReduceOp::Sum; },
           [](Request& q) { q.prescale = 1.0; },
           [](Request& q) { q.postscale = 1.0; },
           [](Request& q) { q.root = 0; },
           [](Request& q) { q.shape = {3, 5}; },
           [](Request& q) { q.group = "other"; },
           [](Request& q) { q.group_size = 2; },
           [](Request& q) { q.process_set = 1; },
           [](Request& q) { q.set_ranks = {0, 1}; }}) {
    Request c = a;
    change(c);
    CHECK_FALSE(a.same_metadata(c));
  }
}

TEST_CASE("bytes that do not decode are an error, not a wrong message") {
  ResponseMessage m;
  m.responses = {full_response()};
  std::vector<char> bytes = encode(m);
  bytes.resize(bytes.size() / 2);
  CHECK_THROWS_WITH_AS(decode<ResponseMessage>(bytes),
                       doctest::Contains("control message does not decode"), Error);
  std::vector<char> longer = encode(RequestMessage{});
  longer.push_back(0);
  CHECK_THROWS_AS(decode<RequestMessage>(longer), Error);

  // A length whose byte count wraps around 64 bits (here 2^61 ids of 8 bytes) is refused before
  // anything is allocated.
  RequestMessage ids;
  ids.cached = {1};
  std::vector<char> corrupt = encode(ids);
  const std::size_t at = sizeof(ids.rank) + sizeof(ids.responses_applied) + sizeof(std::uint64_t);
  const std::uint64_t huge = std::uint64_t{1} << 61;
  std::memcpy(corrupt.data() + at, &huge, sizeof(huge));
  CHECK_THROWS_WITH_AS(decode<RequestMessage>(corrupt),
                       doctest::Contains("control message does not decode"), Error);
}

}  // TEST_SUITE

}  // namespace
