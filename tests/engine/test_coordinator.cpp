// The coordinator on its own: request messages in, response messages out, with explicit time
// points (no MPI, no threads, no sleeping). See the Notes in runtime/negotiation/coordinator.hpp.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "dtrain/runtime/execution/host_backend.hpp"
#include "dtrain/runtime/negotiation/coordinator.hpp"

namespace {

using namespace dtrain;
using namespace dtrain::detail;
using namespace std::chrono_literals;

Request tensor(std::string name, std::vector<std::int64_t> shape = {4},
               DataType dtype = DataType::float32) {
  Request q;
  q.name = std::move(name);
  q.kind = OpKind::allreduce;
  q.dtype = dtype;
  q.shape = std::move(shape);
  q.reduce_op = ReduceOp::Sum;
  return q;
}

Request of_kind(std::string name, OpKind kind, std::vector<std::int64_t> shape = {4}) {
  Request q = tensor(std::move(name), std::move(shape));
  q.kind = kind;
  return q;
}

RequestMessage message(int rank, std::vector<Request> requests, std::uint64_t applied = 0) {
  RequestMessage m;
  m.rank = rank;
  m.requests = std::move(requests);
  m.responses_applied = applied;
  return m;
}

RequestMessage cached(int rank, std::vector<std::uint64_t> ids, std::uint64_t applied = 0) {
  RequestMessage m;
  m.rank = rank;
  m.cached = std::move(ids);
  m.responses_applied = applied;
  return m;
}

RequestMessage join_message(int rank) {
  return message(rank, {of_kind("join", OpKind::join, {0})});
}

RequestMessage shutdown_message(int rank) {
  RequestMessage m;
  m.rank = rank;
  m.shutdown = true;
  return m;
}

CoordinatorOptions options(int size = 3) {
  CoordinatorOptions o;
  o.size = size;
  o.cycle_time_ms = 0;         // most tests look at planning, not batching
  o.op_timeout_seconds = 0;    // nor at timeouts
  return o;
}

// Submits the same request from every rank.
void submit_all(Coordinator& c, const Request& q, Clock::time_point t, int size = 3) {
  for (int r = 0; r < size; ++r) c.on_message(message(r, {q}), t);
}

// Rank r submits per_rank[r], one message each, in rank order.
void submit_each(Coordinator& c, const std::vector<Request>& per_rank, Clock::time_point t) {
  for (std::size_t r = 0; r < per_rank.size(); ++r)
    c.on_message(message(static_cast<int>(r), {per_rank[r]}), t);
}

// The one response that a poll at `t` must give.
Response sole_response(Coordinator& c, Clock::time_point t) {
  auto out = c.poll(t);
  REQUIRE(out.has_value());
  REQUIRE(out->responses.size() == 1);
  return out->responses[0];
}

std::vector<std::string> all_names(const ResponseMessage& m) {
  std::vector<std::string> out;
  for (const auto& s : m.responses) out.insert(out.end(), s.names.begin(), s.names.end());
  return out;
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

const Clock::time_point t0 = Clock::time_point{} + std::chrono::hours(1);

}  // namespace

TEST_SUITE("coordinator") {

TEST_CASE("an op is ready only when every rank has submitted it") {
  Coordinator c(options());
  c.on_message(message(0, {tensor("a")}), t0);
  c.on_message(message(2, {tensor("a")}), t0);
  CHECK_FALSE(c.poll(t0 + 1h).has_value());
  CHECK(c.has_pending());
  c.on_message(message(1, {tensor("a")}), t0 + 1ms);
  const Response s = sole_response(c, t0 + 1ms);
  CHECK(s.kind == OpKind::allreduce);
  CHECK(s.names == std::vector<std::string>{"a"});
  CHECK(s.numels == std::vector<std::int64_t>{4});
  CHECK(s.error == ErrorKind::none);
  CHECK(s.active_ranks == 3);
  CHECK_FALSE(c.has_pending());
  CHECK_FALSE(c.poll(t0 + 2h).has_value());  // nothing twice
}

TEST_CASE("responses follow the order in which ops became ready, whatever each rank's order") {
  CoordinatorOptions o = options();
  o.fusion_threshold_bytes = 0;  // one response per op, so the order is visible
  Coordinator c(o);
  c.on_message(message(0, {tensor("a"), tensor("b"), tensor("c")}), t0);
  c.on_message(message(1, {tensor("c"), tensor("b"), tensor("a")}), t0);
  c.on_message(message(2, {tensor("b")}), t0);
  c.on_message(message(2, {tensor("c")}), t0);
  c.on_message(message(2, {tensor("a")}), t0);
  auto out = c.poll(t0);
  REQUIRE(out.has_value());
  CHECK(all_names(*out) == std::vector<std::string>{"b", "c", "a"});
  CHECK(out->responses.size() == 3);
  auto next = c.poll(t0);
  CHECK_FALSE(next.has_value());
}

TEST_CASE("message sequence numbers increase by one per message") {
  Coordinator c(options());
  submit_all(c, tensor("a"), t0);
  auto m1 = c.poll(t0);
  submit_all(c, tensor("b"), t0);
  auto m2 = c.poll(t0);
  REQUIRE(m1);
  REQUIRE(m2);
  CHECK(m2->seq == m1->seq + 1);
}

TEST_CASE("a disagreement on any field fails the op on every rank, naming tensor, field, ranks and values") {
  struct Case {
    const char* field;       // as the message spells it
    Request odd;             // what rank 2 submits; ranks 0 and 1 submit `base`
    const char* base_value;  // how the message shows the base value
    const char* odd_value;
  };
  const Request base = tensor("grad/w", {2, 3});
  auto with = [&](auto change) {
    Request q = base;
    change(q);
    return q;
  };
  Request bcast = of_kind("grad/w", OpKind::broadcast, {2, 3});
  const std::vector<Case> cases = {
      {"op kind", with([](Request& q) { q.kind = OpKind::broadcast; }), "allreduce", "broadcast"},
      {"dtype", with([](Request& q) { q.dtype = DataType::float64; }), "float32", "float64"},
      {"shape", with([](Request& q) { q.shape = {3, 2}; }), "[2, 3]", "[3, 2]"},
      {"reduce op", with([](Request& q) { q.reduce_op = ReduceOp::Max; }), "Sum", "Max"},
      {"prescale factor", with([](Request& q) { q.prescale = 0.5; }), "1", "0.5"},
      {"postscale factor", with([](Request& q) { q.postscale = 2; }), "1", "2"},
      {"device", with([](Request& q) { q.device = Device::cuda(1); }), "cpu", "cuda:1"},
      {"group", with([](Request& q) { q.group = "g"; q.group_size = 1; }), "/0", "g/1"},
  };
  for (const Case& k : cases) {
    CAPTURE(k.field);
    Coordinator c(options());
    submit_each(c, {base, base, k.odd}, t0);
    auto out = c.poll(t0);
    REQUIRE(out.has_value());
    REQUIRE(out->responses.size() == 1);
    const Response& s = out->responses[0];
    CHECK(s.error == ErrorKind::mismatch);
    CHECK(s.names == std::vector<std::string>{"grad/w"});  // every rank can fail its entry
    const std::string& m = s.error_message;
    CAPTURE(m);
    CHECK(contains(m, "'grad/w'"));
    CHECK(contains(m, std::string("the ") + k.field + " of"));
    CHECK(contains(m, std::string(k.base_value) + " on ranks [0, 1]"));
    CHECK(contains(m, std::string(k.odd_value) + " on ranks [2]"));
    // A failed op is not cached: the next submission must be negotiated in full.
    CHECK(out->cache_inserts.empty());
    CHECK(c.stats().responses == 0);
  }

  SUBCASE("root rank of a broadcast") {
    Coordinator c(options());
    Request odd = bcast;
    odd.root = 1;
    submit_each(c, {bcast, odd, bcast}, t0);
    const Response s = sole_response(c, t0);
    CHECK(s.error == ErrorKind::mismatch);
    const std::string& m = s.error_message;
    CAPTURE(m);
    CHECK(contains(m, "root rank"));
    CHECK(contains(m, "broadcast 'grad/w'"));
    CHECK(contains(m, "0 on ranks [0, 2]"));
    CHECK(contains(m, "1 on ranks [1]"));
  }

  SUBCASE("trailing dimensions of an allgather (dim 0 may differ)") {
    Coordinator c(options());
    submit_each(c, {of_kind("g", OpKind::allgather, {1, 3}), of_kind("g", OpKind::allgather, {5, 3}),
                    of_kind("g", OpKind::allgather, {2, 4})},
                t0);
    const Response s = sole_response(c, t0);
    CHECK(s.error == ErrorKind::mismatch);
    const std::string& m = s.error_message;
    CAPTURE(m);
    CHECK(contains(m, "[3] on ranks [0, 1]"));
    CHECK(contains(m, "[4] on ranks [2]"));
  }

  SUBCASE("allgather with different dim 0 is not a mismatch") {
    Coordinator c(options());
    submit_each(c, {of_kind("g", OpKind::allgather, {1, 3}), of_kind("g", OpKind::allgather, {5, 3}),
                    of_kind("g", OpKind::allgather, {0, 3})},
                t0);
    const Response s = sole_response(c, t0);
    CHECK(s.error == ErrorKind::none);
    CHECK(s.rank_rows == std::vector<std::int64_t>{1, 5, 0});
  }

  SUBCASE("a grouped op that one rank submits outside a group fails on every member") {
    Coordinator c(options());
    Request g0 = tensor("g.0"), g1 = tensor("g.1");
    g0.group = g1.group = "g";
    g0.group_size = g1.group_size = 2;
    for (int r = 0; r < 2; ++r) c.on_message(message(r, {g0, g1}), t0);
    c.on_message(message(2, {tensor("g.0"), tensor("g.1")}), t0);
    auto out = c.poll(t0);
    REQUIRE(out);
    REQUIRE(out->responses.size() == 2);
    for (const auto& s : out->responses) {
      CHECK(s.error == ErrorKind::mismatch);
      CHECK(contains(s.error_message, "group"));
      CHECK(contains(s.error_message, "g/2 on ranks [0, 1]"));
    }
  }
}

TEST_CASE("fusion") {
  const std::int64_t floats = 100;  // 400 bytes each
  SUBCASE("responses respect the threshold and cover every tensor once") {
    CoordinatorOptions o = options();
    o.fusion_threshold_bytes = 1000;
    Coordinator c(o);
    for (int i = 0; i < 10; ++i) submit_all(c, tensor("t" + std::to_string(i), {floats}), t0);
    auto out = c.poll(t0);
    REQUIRE(out);
    std::multiset<std::string> seen;
    for (const auto& s : out->responses) {
      CHECK(s.total_numel() * 4 <= 1000);
      CHECK(s.names.size() == s.numels.size());
      seen.insert(s.names.begin(), s.names.end());
    }
    CHECK(seen.size() == 10);
    CHECK(std::set<std::string>(seen.begin(), seen.end()).size() == 10);
    CHECK(out->responses.size() == 5);  // two 400-byte tensors per 1000-byte buffer
    CHECK(c.stats().responses == 5);
    CHECK(c.stats().fused_tensors == 10);
  }
  SUBCASE("a tensor larger than the threshold goes alone; the rest still fuse") {
    CoordinatorOptions o = options();
    o.fusion_threshold_bytes = 1000;
    Coordinator c(o);
    submit_all(c, tensor("small0", {floats}), t0);
    submit_all(c, tensor("huge", {1000}), t0);
    submit_all(c, tensor("small1", {floats}), t0);
    auto out = c.poll(t0);
    REQUIRE(out);
    REQUIRE(out->responses.size() == 2);
    std::map<std::string, std::vector<std::string>> by_first;
    for (const auto& s : out->responses) by_first[s.names[0]] = s.names;
    CHECK(by_first["small0"] == std::vector<std::string>{"small0", "small1"});
    CHECK(by_first["huge"] == std::vector<std::string>{"huge"});
  }
  SUBCASE("a threshold of 0 disables fusion") {
    CoordinatorOptions o = options();
    o.fusion_threshold_bytes = 0;
    Coordinator c(o);
    for (int i = 0; i < 6; ++i) submit_all(c, tensor("t" + std::to_string(i), {1}), t0);
    auto out = c.poll(t0);
    REQUIRE(out);
    CHECK(out->responses.size() == 6);
    for (const auto& s : out->responses) CHECK(s.names.size() == 1);
    CHECK(c.stats().fused_tensors == 0);
  }
  SUBCASE("tensors that differ in dtype, op, scale factors or kind are not fused") {
    // Allgathers fuse with allgathers (Note [Fused allgather]), never with allreduces.
    Coordinator c(options());
    Request f32 = tensor("f32a"), f32b = tensor("f32b"), f64 = tensor("f64", {4}, DataType::float64);
    Request max = tensor("max");
    max.reduce_op = ReduceOp::Max;
    Request pre = tensor("pre");
    pre.prescale = 0.5;
    Request post = tensor("post");
    post.postscale = 0.5;
    Request gather = of_kind("gather", OpKind::allgather);
    Request gather2 = of_kind("gather2", OpKind::allgather);
    Request bc = of_kind("bc", OpKind::broadcast);
    for (const auto& q : {f32, f64, max, pre, post, gather, gather2, bc, f32b}) submit_all(c, q, t0);
    auto out = c.poll(t0);
    REQUIRE(out);
    std::set<std::vector<std::string>> groups;
    for (const auto& s : out->responses) groups.insert(s.names);
    CHECK(groups == std::set<std::vector<std::string>>{
                        {"f32a", "f32b"}, {"f64"}, {"max"}, {"pre"}, {"post"},
                        {"gather", "gather2"}, {"bc"}});
  }
  SUBCASE("tensors with the same scale factors fuse and keep them") {
    Coordinator c(options());
    Request a = tensor("a"), b = tensor("b");
    a.prescale = b.prescale = 0.25;
    a.postscale = b.postscale = 4;
    submit_all(c, a, t0);
    submit_all(c, b, t0);
    const Response s = sole_response(c, t0);
    CHECK(s.names == std::vector<std::string>{"a", "b"});
    CHECK(s.prescale == 0.25);
    CHECK(s.postscale == 4);
  }
}

TEST_CASE("batching") {
  CoordinatorOptions o = options();
  o.cycle_time_ms = 5000;
  SUBCASE("a lone ready op is emitted at once, whatever the cycle time") {
    Coordinator c(o);
    submit_all(c, tensor("lone"), t0);
    auto out = c.poll(t0);
    REQUIRE(out);
    CHECK(all_names(*out) == std::vector<std::string>{"lone"});
  }
  SUBCASE("while other ops are partially submitted, a ready op waits for the cycle to fuse") {
    Coordinator c(o);
    submit_all(c, tensor("a"), t0);
    c.on_message(message(0, {tensor("b")}), t0);
    CHECK_FALSE(c.poll(t0).has_value());
    REQUIRE(c.next_deadline().has_value());
    CHECK(*c.next_deadline() == t0 + 5s);
    CHECK_FALSE(c.poll(t0 + 4999ms).has_value());
    auto out = c.poll(t0 + 5s);
    REQUIRE(out);
    CHECK(all_names(*out) == std::vector<std::string>{"a"});
  }
  SUBCASE("the window closes early once the burst is complete, and the burst fuses") {
    Coordinator c(o);
    submit_all(c, tensor("a"), t0);
    c.on_message(message(0, {tensor("b")}), t0);
    CHECK_FALSE(c.poll(t0 + 1ms).has_value());
    c.on_message(message(1, {tensor("b")}), t0 + 2ms);
    c.on_message(message(2, {tensor("b")}), t0 + 2ms);
    const Response s = sole_response(c, t0 + 2ms);
    CHECK(s.names == std::vector<std::string>{"a", "b"});
  }
  SUBCASE("the window closes early once ready ops fill the fusion buffer") {
    CoordinatorOptions small = o;
    small.fusion_threshold_bytes = 32;
    Coordinator c(small);
    submit_all(c, tensor("a", {8}), t0);  // 32 bytes: the buffer is full
    c.on_message(message(0, {tensor("b")}), t0);
    auto out = c.poll(t0);
    REQUIRE(out);
    CHECK(all_names(*out) == std::vector<std::string>{"a"});
  }
}

TEST_CASE("response cache") {
  SUBCASE("a successful op is announced with an id; the id stands for the full request") {
    Coordinator c(options());
    submit_all(c, tensor("w", {2, 2}), t0);
    auto first = c.poll(t0);
    REQUIRE(first);
    REQUIRE(first->cache_inserts.size() == 1);
    CHECK(first->cache_inserts[0].name == "w");
    const std::uint64_t id = first->cache_inserts[0].id;
    CHECK(c.cache_size() == 1);

    for (int r = 0; r < 3; ++r) c.on_message(cached(r, {id}, first->seq), t0 + 1s);
    CHECK(c.stats().cache_hits == 3);
    auto again = c.poll(t0 + 1s);
    REQUIRE(again);
    REQUIRE(again->responses.size() == 1);
    CHECK(again->responses[0].names == std::vector<std::string>{"w"});
    CHECK(again->responses[0].numels == std::vector<std::int64_t>{4});
    CHECK(again->responses[0].error == ErrorKind::none);
    CHECK(again->cache_inserts.empty());  // already cached: nothing new to announce
  }
  SUBCASE("cache ids and full requests mix in one negotiation") {
    Coordinator c(options());
    submit_all(c, tensor("w"), t0);
    auto first = c.poll(t0);
    REQUIRE(first);
    const std::uint64_t id = first->cache_inserts.at(0).id;
    c.on_message(cached(0, {id}), t0);
    c.on_message(message(1, {tensor("w")}), t0);  // e.g. a rank that had not applied it yet
    c.on_message(cached(2, {id}), t0);
    auto out = c.poll(t0);
    REQUIRE(out);
    CHECK(out->responses.at(0).error == ErrorKind::none);
    CHECK(c.stats().cache_hits == 2);
  }
  SUBCASE("the least recently used entry is evicted at capacity") {
    CoordinatorOptions o = options();
    o.cache_capacity = 2;
    Coordinator c(o);
    std::map<std::string, std::uint64_t> ids;
    auto run = [&](const std::string& name) {
      submit_all(c, tensor(name), t0);
      auto out = c.poll(t0);
      REQUIRE(out);
      for (const auto& ins : out->cache_inserts) ids[ins.name] = ins.id;
      return *out;
    };
    run("a");
    run("b");
    run("a");  // a is now more recently used than b
    auto m = run("c");
    CHECK(m.cache_evictions == std::vector<std::uint64_t>{ids.at("b")});
    CHECK(c.cache_size() == 2);
    auto m2 = run("d");
    CHECK(m2.cache_evictions == std::vector<std::uint64_t>{ids.at("a")});
    CHECK(c.cache_size() == 2);
  }
  SUBCASE("the same name with new metadata replaces its entry") {
    Coordinator c(options());
    submit_all(c, tensor("w", {4}), t0);
    auto first = c.poll(t0);
    REQUIRE(first);
    const std::uint64_t old_id = first->cache_inserts.at(0).id;
    submit_all(c, tensor("w", {8}), t0);
    auto second = c.poll(t0);
    REQUIRE(second);
    CHECK(second->cache_evictions == std::vector<std::uint64_t>{old_id});
    REQUIRE(second->cache_inserts.size() == 1);
    CHECK(second->cache_inserts[0].id != old_id);
    CHECK(c.cache_size() == 1);
  }
  SUBCASE("an evicted id stays resolvable until every rank has applied the eviction") {
    CoordinatorOptions o = options();
    o.cache_capacity = 1;
    Coordinator c(o);
    submit_all(c, tensor("a"), t0);
    auto m1 = c.poll(t0);
    REQUIRE(m1);
    const std::uint64_t id_a = m1->cache_inserts.at(0).id;
    submit_all(c, tensor("b"), t0);
    auto m2 = c.poll(t0);  // evicts a
    REQUIRE(m2);
    REQUIRE(m2->cache_evictions == std::vector<std::uint64_t>{id_a});

    // Rank 1 sent a's id before it applied m2; ranks 0 and 2 already know a was evicted.
    c.on_message(message(0, {tensor("a", {4})}, m2->seq), t0);
    c.on_message(cached(1, {id_a}, m1->seq), t0);
    c.on_message(message(2, {tensor("a", {4})}, m2->seq), t0);
    auto m3 = c.poll(t0);
    REQUIRE(m3);
    REQUIRE(m3->responses.size() == 1);
    CHECK(m3->responses[0].names == std::vector<std::string>{"a"});
    CHECK(m3->responses[0].error == ErrorKind::none);

    // Once every rank has applied everything, the retired id is gone.
    const std::uint64_t all_applied = m3->seq + 10;
    for (int r = 0; r < 3; ++r) c.on_message(message(r, {}, all_applied), t0);
    CHECK_THROWS_AS(c.on_message(cached(1, {id_a}, all_applied), t0), Error);
  }
  SUBCASE("capacity 0 disables the cache") {
    CoordinatorOptions o = options();
    o.cache_capacity = 0;
    Coordinator c(o);
    for (int i = 0; i < 3; ++i) {
      submit_all(c, tensor("w"), t0);
      auto out = c.poll(t0);
      REQUIRE(out);
      CHECK(out->cache_inserts.empty());
    }
    CHECK(c.cache_size() == 0);
  }
  SUBCASE("allgather and alltoall are not cached (their sizes change every call)") {
    Coordinator c(options());
    submit_all(c, of_kind("g", OpKind::allgather), t0);
    auto out = c.poll(t0);
    REQUIRE(out);
    CHECK(out->cache_inserts.empty());
  }
}

TEST_CASE("join") {
  SUBCASE("ops become ready without the joined rank, and Average divides by the contributors") {
    Coordinator c(options());
    c.on_message(join_message(1), t0);
    Request q = tensor("g");
    q.reduce_op = ReduceOp::Average;
    c.on_message(message(0, {q}), t0);
    c.on_message(message(2, {q}), t0);
    const Response s = sole_response(c, t0);
    CHECK(s.error == ErrorKind::none);
    CHECK(s.active_ranks == 2);
    CHECK(effective_op(s) == ReduceOp::Sum);
    CHECK(effective_postscale(s) == doctest::Approx(0.5));
  }
  SUBCASE("a rank joining releases the ops that waited only for it") {
    Coordinator c(options());
    c.on_message(message(0, {tensor("g")}), t0);
    c.on_message(message(1, {tensor("g")}), t0);
    CHECK_FALSE(c.poll(t0).has_value());
    c.on_message(join_message(2), t0);
    auto out = c.poll(t0);
    REQUIRE(out);
    CHECK(all_names(*out) == std::vector<std::string>{"g"});
    CHECK(out->responses[0].active_ranks == 2);
  }
  SUBCASE("ops with different contributor counts are not fused") {
    Coordinator c(options());
    submit_all(c, tensor("all"), t0);
    c.on_message(join_message(2), t0);
    c.on_message(message(0, {tensor("two")}), t0);
    c.on_message(message(1, {tensor("two")}), t0);
    auto out = c.poll(t0);
    REQUIRE(out);
    CHECK(out->responses.size() == 2);
  }
  SUBCASE("allgather takes no rows from a joined rank") {
    Coordinator c(options());
    c.on_message(join_message(0), t0);
    c.on_message(message(1, {of_kind("g", OpKind::allgather, {2, 3})}), t0);
    c.on_message(message(2, {of_kind("g", OpKind::allgather, {1, 3})}), t0);
    const Response s = sole_response(c, t0);
    CHECK(s.error == ErrorKind::none);
    CHECK(s.rank_rows == std::vector<std::int64_t>{0, 2, 1});
  }
  SUBCASE("alltoall and reducescatter with a joined rank fail, naming the joined ranks") {
    for (OpKind kind : {OpKind::alltoall, OpKind::reducescatter}) {
      CAPTURE(to_string(kind));
      Coordinator c(options());
      c.on_message(join_message(1), t0);
      c.on_message(message(0, {of_kind("x", kind)}), t0);
      c.on_message(message(2, {of_kind("x", kind)}), t0);
      const Response s = sole_response(c, t0);
      CHECK(s.error == ErrorKind::invalid_argument);
      CHECK(s.names == std::vector<std::string>{"x"});
      CHECK(contains(s.error_message, "ranks [1] have joined"));
    }
  }
  SUBCASE("broadcast from a joined root fails") {
    Coordinator c(options());
    c.on_message(join_message(0), t0);
    Request q = of_kind("b", OpKind::broadcast);
    q.root = 0;
    c.on_message(message(1, {q}), t0);
    c.on_message(message(2, {q}), t0);
    const Response s = sole_response(c, t0);
    CHECK(s.error == ErrorKind::invalid_argument);
    CHECK(contains(s.error_message, "root rank 0"));
  }
  SUBCASE("once every rank has joined, a join response names the last one and the world is whole") {
    Coordinator c(options());
    c.on_message(join_message(2), t0);
    CHECK_FALSE(c.poll(t0).has_value());
    c.on_message(join_message(0), t0);
    CHECK_FALSE(c.poll(t0).has_value());
    c.on_message(join_message(1), t0);
    const Response s = sole_response(c, t0);
    CHECK(s.kind == OpKind::join);
    CHECK(s.last_joined_rank == 1);
    // Joins are over: an op needs every rank again.
    c.on_message(message(0, {tensor("after")}), t0);
    c.on_message(message(1, {tensor("after")}), t0);
    CHECK_FALSE(c.poll(t0).has_value());
    c.on_message(message(2, {tensor("after")}), t0);
    auto next = c.poll(t0);
    REQUIRE(next);
    CHECK(next->responses.at(0).active_ranks == 3);
  }
}

TEST_CASE("stall inspector") {
  CoordinatorOptions o = options();
  o.stall_check_time_seconds = 1;
  std::vector<std::string> warnings;
  CoordinatorHooks hooks;
  hooks.stall_warning = [&](const std::string& report) { warnings.push_back(report); };

  SUBCASE("after the check time a warning lists the missing ranks and tensor names") {
    Coordinator c(o, hooks);
    c.on_message(message(0, {tensor("layer1/weight")}), t0);
    c.on_message(message(2, {tensor("layer1/weight")}), t0);
    REQUIRE(c.next_deadline().has_value());
    CHECK(*c.next_deadline() == t0 + 1s);
    CHECK_FALSE(c.poll(t0 + 999ms).has_value());
    CHECK(warnings.empty());
    CHECK_FALSE(c.poll(t0 + 1s).has_value());  // a warning is not a message to the ranks
    REQUIRE(warnings.size() == 1);
    CAPTURE(warnings[0]);
    CHECK(contains(warnings[0], "allreduce 'layer1/weight'"));
    CHECK(contains(warnings[0], "submitted by ranks [0, 2]"));
    CHECK(contains(warnings[0], "missing on ranks [1]"));
    CHECK(contains(warnings[0], "waiting 1.0 s"));
    CHECK(contains(warnings[0], "DTRAIN_STALL_CHECK_TIME_SECONDS"));
    CHECK(c.stats().stall_warnings == 1);
    // Not repeated before another check period has passed.
    CHECK_FALSE(c.poll(t0 + 1500ms).has_value());
    CHECK(warnings.size() == 1);
    CHECK_FALSE(c.poll(t0 + 2s).has_value());
    CHECK(warnings.size() == 2);
  }
  SUBCASE("no warning while the op is pending less than the check time, nor when disabled") {
    o.stall_check_disable = true;
    Coordinator c(o, hooks);
    c.on_message(message(0, {tensor("x")}), t0);
    CHECK_FALSE(c.next_deadline().has_value());
    CHECK_FALSE(c.poll(t0 + 1h).has_value());
    CHECK(warnings.empty());
  }
  SUBCASE("after the shutdown time every rank is told to stop, with the report") {
    o.stall_shutdown_time_seconds = 2;
    Coordinator c(o, hooks);
    submit_each(c, {tensor("x"), tensor("x"), tensor("y")}, t0);
    auto early = c.poll(t0 + 1s);
    CHECK_FALSE(early.has_value());
    auto out = c.poll(t0 + 2s);
    REQUIRE(out);
    CAPTURE(out->fatal);
    CHECK(contains(out->fatal, "stall shutdown"));
    CHECK(contains(out->fatal, "DTRAIN_STALL_SHUTDOWN_TIME_SECONDS"));
    CHECK(contains(out->fatal, "allreduce 'x': submitted by ranks [0, 1], missing on ranks [2]"));
    CHECK(contains(out->fatal, "allreduce 'y': submitted by ranks [2], missing on ranks [0, 1]"));
  }
}

TEST_CASE("shutdown") {
  SUBCASE("an op that needs a rank that has shut down fails") {
    Coordinator c(options());
    c.on_message(message(0, {tensor("a")}), t0);
    c.on_message(message(1, {tensor("a")}), t0);
    c.on_message(shutdown_message(2), t0);
    auto out = c.poll(t0);
    REQUIRE(out);
    REQUIRE(out->responses.size() == 1);
    const Response& s = out->responses[0];
    CHECK(s.names == std::vector<std::string>{"a"});
    CHECK(s.error == ErrorKind::shutdown);
    CAPTURE(s.error_message);
    CHECK(contains(s.error_message, "'a'"));
    CHECK(contains(s.error_message, "ranks [2] called dtrain::shutdown()"));
    CHECK_FALSE(out->shutdown_complete);
    // Later submissions that need rank 2 fail too.
    c.on_message(message(0, {tensor("b")}), t0);
    CHECK(sole_response(c, t0).error == ErrorKind::shutdown);
  }
  SUBCASE("shutdown completes once every rank has shut down, and is announced once") {
    Coordinator c(options());
    c.on_message(shutdown_message(0), t0);
    c.on_message(shutdown_message(2), t0);
    CHECK_FALSE(c.poll(t0).has_value());
    c.on_message(shutdown_message(1), t0);
    auto out = c.poll(t0);
    REQUIRE(out);
    CHECK(out->shutdown_complete);
    CHECK_FALSE(c.poll(t0).has_value());
  }
}

TEST_CASE("a rank that ends the job: every rank is told once, with its reason, before anything else") {
  Coordinator c(options());
  c.on_message(message(0, {tensor("a")}), t0);
  c.on_message(message(1, {tensor("a")}), t0);
  RequestMessage ending = message(2, {tensor("a")});
  ending.fatal = "dtrain: rank 2 made an unnamed allreduce from a thread other than the one that called dtrain::init()";
  c.on_message(ending, t0);
  auto out = c.poll(t0);
  REQUIRE(out);
  CHECK(out->fatal == ending.fatal);
  CHECK(out->responses.empty());  // 'a' is ready, but the engines stop instead of running it
  RequestMessage again = message(1, {});
  again.fatal = "a second reason";
  c.on_message(again, t0);
  auto next = c.poll(t0);
  CHECK_FALSE((next && !next->fatal.empty()));
}

TEST_CASE("a rank that rejects its own call fails the op on every rank at once") {
  Request bad = tensor("w");
  bad.rejected = "allreduce 'w': tensor data is null but it has 5 elements";
  SUBCASE("peers that submitted it already fail now, naming the rank and the reason") {
    Coordinator c(options());
    c.on_message(message(0, {tensor("w")}), t0);
    c.on_message(message(1, {bad}), t0);
    const Response s = sole_response(c, t0);
    CHECK(s.names == std::vector<std::string>{"w"});
    CHECK(s.error == ErrorKind::invalid_argument);
    CAPTURE(s.error_message);
    CHECK(contains(s.error_message, "allreduce 'w' was rejected on rank 1"));
    CHECK(contains(s.error_message, "null but it has 5 elements"));
    CHECK(c.failed_remembered() == 1);  // rank 2 has not submitted it yet
    // Rank 2 arrives later: it fails at once, and the verdict is then forgotten.
    c.on_message(message(2, {tensor("w")}), t0 + 1s);
    auto late = c.poll(t0 + 1s);
    REQUIRE(late);
    REQUIRE(late->responses.size() == 1);
    CHECK(late->responses[0].error == ErrorKind::invalid_argument);
    CHECK(contains(late->responses[0].error_message, "rejected on rank 1"));
    CHECK(c.failed_remembered() == 0);
    CHECK_FALSE(c.has_pending());
    // The name's next submission is a new op.
    submit_all(c, tensor("w"), t0 + 2s);
    auto next = c.poll(t0 + 2s);
    REQUIRE(next);
    CHECK(next->responses.at(0).error == ErrorKind::none);
  }
  SUBCASE("a rejected member fails every member of its group") {
    Coordinator c(options());
    Request g0 = tensor("g.0"), g1 = tensor("g.1");
    g0.group = g1.group = "g";
    g0.group_size = g1.group_size = 2;
    Request rejected = tensor("g.rejected");
    rejected.group = "g";
    rejected.rejected = "bad tensor";
    c.on_message(message(0, {g0, g1}), t0);
    c.on_message(message(1, {rejected}), t0);
    auto out = c.poll(t0);
    REQUIRE(out);
    std::set<std::string> failed;
    for (const auto& s : out->responses) {
      CHECK(s.error == ErrorKind::invalid_argument);
      CHECK(contains(s.error_message, "grouped_allreduce 'g' was rejected on rank 1: bad tensor"));
      failed.insert(s.names.begin(), s.names.end());
    }
    CHECK(failed == std::set<std::string>{"g.0", "g.1", "g.rejected"});
    c.on_message(message(2, {g0, g1}), t0);  // both members fail for rank 2 too
    auto late = c.poll(t0);
    REQUIRE(late);
    CHECK(late->responses.size() == 2);
    for (const auto& s : late->responses) CHECK(s.error == ErrorKind::invalid_argument);
    CHECK(c.failed_remembered() == 0);
  }
}

TEST_CASE("a verdict reaches only the ranks whose submission it concerns") {
  // Every rank rejects 'w'; rank 0 submits 'w' again (a new op) before rank 1's rejection arrives.
  Coordinator c(options(2));
  Request bad = tensor("w");
  bad.rejected = "bad";
  c.on_message(message(0, {bad}), t0);
  auto first = c.poll(t0);
  REQUIRE(first);
  CHECK(first->responses.at(0).error_ranks == std::vector<std::int32_t>{0});
  c.on_message(message(0, {tensor("w")}), t0);  // rank 0's next op named 'w'
  c.on_message(message(1, {bad}), t0);
  auto second = c.poll(t0);
  REQUIRE(second);
  REQUIRE(second->responses.size() == 1);
  CHECK(second->responses[0].error_ranks == std::vector<std::int32_t>{1});
  CHECK_FALSE(second->responses[0].applies_to(0));  // rank 0's new 'w' is untouched
  c.on_message(message(1, {tensor("w")}), t0);
  auto third = c.poll(t0);
  REQUIRE(third);
  CHECK(third->responses.at(0).error == ErrorKind::none);
}

TEST_CASE("ranks that disagree on the size of a group fail every member on every rank") {
  auto members = [](int n) {
    std::vector<Request> out;
    for (int i = 0; i < n; ++i) {
      Request q = tensor("g." + std::to_string(i));
      q.group = "g";
      q.group_size = n;
      out.push_back(q);
    }
    if (n == 0) {
      Request q = tensor("g.empty", {0});
      q.group = "g";
      q.group_size = 0;
      out.push_back(q);
    }
    return out;
  };
  for (int odd : {2, 0, 4}) {
    CAPTURE(odd);
    Coordinator c(options());
    c.on_message(message(0, members(3)), t0);
    c.on_message(message(1, members(odd)), t0);
    auto out = c.poll(t0);
    REQUIRE(out);
    std::set<std::string> failed;
    for (const auto& s : out->responses) {
      CHECK(s.error == ErrorKind::mismatch);
      CAPTURE(s.error_message);
      CHECK(contains(s.error_message, "number of tensors in grouped_allreduce 'g'"));
      CHECK(contains(s.error_message, "3 on ranks [0]"));
      CHECK(contains(s.error_message, fmt::format("{} on ranks [1]", odd)));
      failed.insert(s.names.begin(), s.names.end());
    }
    for (const auto& q : members(3)) CHECK(failed.contains(q.name));
    for (const auto& q : members(odd)) CHECK(failed.contains(q.name));
    CHECK_FALSE(c.has_pending());
    // Rank 2, whatever it submits, fails at once.
    c.on_message(message(2, members(3)), t0);
    auto late = c.poll(t0);
    REQUIRE(late);
    CHECK(late->responses.size() == 3);
    for (const auto& s : late->responses) CHECK(s.error == ErrorKind::mismatch);
    CHECK(c.failed_remembered() == 0);
    CHECK_FALSE(c.has_pending());
  }
}

TEST_CASE("an op that waits longer than the op timeout fails with TimeoutError on every rank") {
  CoordinatorOptions o = options();
  o.op_timeout_seconds = 5;
  Coordinator c(o);
  c.on_message(message(0, {tensor("x")}), t0);
  c.on_message(message(2, {tensor("x")}), t0 + 1s);
  REQUIRE(c.next_deadline());
  CHECK(*c.next_deadline() == t0 + 5s);
  CHECK_FALSE(c.poll(t0 + 4s).has_value());
  auto out = c.poll(t0 + 5s);
  REQUIRE(out);
  REQUIRE(out->responses.size() == 1);
  const Response& s = out->responses[0];
  CHECK(s.names == std::vector<std::string>{"x"});
  CHECK(s.error == ErrorKind::timeout);
  CAPTURE(s.error_message);
  CHECK(contains(s.error_message, "allreduce 'x' timed out after 5 s"));
  CHECK(contains(s.error_message, "DTRAIN_OP_TIMEOUT_SECONDS"));
  CHECK(contains(s.error_message, "ranks [1] never submitted it"));
  CHECK(contains(s.error_message, "submitted by ranks [0, 2]"));
  // The straggler fails at once when it finally submits.
  c.on_message(message(1, {tensor("x")}), t0 + 9s);
  auto late = c.poll(t0 + 9s);
  REQUIRE(late);
  CHECK(late->responses.at(0).error == ErrorKind::timeout);
  CHECK(c.failed_remembered() == 0);
}

TEST_CASE("join cannot strand the joined ranks") {
  SUBCASE("a rank that shuts down without joining fails the join at once") {
    Coordinator c(options());
    c.on_message(join_message(0), t0);
    c.on_message(join_message(1), t0);
    CHECK_FALSE(c.poll(t0).has_value());
    c.on_message(shutdown_message(2), t0);
    const Response s = sole_response(c, t0);
    const Response& j = s;
    CHECK(j.kind == OpKind::join);
    CHECK(j.error == ErrorKind::shutdown);
    CAPTURE(j.error_message);
    CHECK(contains(j.error_message, "join() can never complete: ranks [2] called dtrain::shutdown()"));
    CHECK(contains(j.error_message, "joined: ranks [0, 1]"));
  }
  SUBCASE("silent ranks are reported by the stall inspector and time the join out") {
    CoordinatorOptions o = options();
    o.stall_check_time_seconds = 2;
    o.op_timeout_seconds = 10;
    std::vector<std::string> warnings;
    CoordinatorHooks hooks;
    hooks.stall_warning = [&](const std::string& report) { warnings.push_back(report); };
    Coordinator c(o, hooks);
    c.on_message(join_message(0), t0);
    // Rank 1 keeps working (its ops complete with rank 0 joined); rank 2 is silent.
    c.on_message(message(1, {tensor("a")}), t0 + 1s);
    CHECK_FALSE(c.poll(t0 + 1s).has_value());  // "a" waits for rank 2
    CHECK(c.has_pending());
    CHECK_FALSE(c.poll(t0 + 2500ms).has_value());
    CHECK(warnings.empty());  // rank 1 was heard from at 1 s
    CHECK_FALSE(c.poll(t0 + 3s).has_value());
    REQUIRE_FALSE(warnings.empty());
    CAPTURE(warnings.back());
    CHECK(contains(warnings.back(), "join: joined by ranks [0], waiting for ranks [1, 2]"));
    CHECK(contains(warnings.back(), "allreduce 'a'"));
    // At the op timeout: "a" times out first (it was submitted 1 s after the join began).
    auto out = c.poll(t0 + 11s);
    REQUIRE(out);
    bool join_failed = false;
    for (const auto& s : out->responses)
      if (s.kind == OpKind::join) {
        join_failed = true;
        CHECK(s.error == ErrorKind::timeout);
        CHECK(contains(s.error_message, "join() timed out after 10 s"));
        CHECK(contains(s.error_message, "ranks [1, 2] have neither joined nor submitted"));
      }
    CHECK(join_failed);
    CHECK_FALSE(c.has_pending());
  }
  SUBCASE("a rank that keeps submitting keeps the join alive") {
    CoordinatorOptions o = options();
    o.op_timeout_seconds = 10;
    Coordinator c(o);
    c.on_message(join_message(0), t0);
    c.on_message(join_message(1), t0);
    for (int step = 1; step <= 5; ++step) {
      c.on_message(message(2, {tensor("s" + std::to_string(step))}), t0 + step * 4s);
      auto out = c.poll(t0 + step * 4s);
      REQUIRE(out);
      CHECK(out->responses.at(0).error == ErrorKind::none);
    }
    c.on_message(join_message(2), t0 + 21s);
    auto out = c.poll(t0 + 21s);
    REQUIRE(out);
    CHECK(out->responses.at(0).kind == OpKind::join);
    CHECK(out->responses.at(0).error == ErrorKind::none);
    CHECK(out->responses.at(0).last_joined_rank == 2);
  }
  SUBCASE("Min, Max and Product with a joined rank: the host fills in identities, the device refuses") {
    for (ReduceOp op : {ReduceOp::Min, ReduceOp::Max, ReduceOp::Product}) {
      CAPTURE(to_string(op));
      for (bool cuda : {false, true}) {
        Coordinator c(options());
        c.on_message(join_message(1), t0);
        Request q = tensor("m");
        q.reduce_op = op;
        if (cuda) q.device = Device::cuda(0);
        c.on_message(message(0, {q}), t0);
        c.on_message(message(2, {q}), t0);
        auto out = c.poll(t0);
        REQUIRE(out);
        const Response& s = out->responses.at(0);
        if (!cuda) {
          CHECK(s.error == ErrorKind::none);
        } else {
          CHECK(s.error == ErrorKind::invalid_argument);
          CHECK(contains(s.error_message, "ranks [1] have joined"));
        }
      }
    }
  }
}

TEST_CASE("stall inspector: shutdown works with the warning disabled, and one report covers a burst") {
  CoordinatorOptions o = options();
  o.stall_check_time_seconds = 1;
  std::vector<std::string> warnings;
  CoordinatorHooks hooks;
  hooks.stall_warning = [&](const std::string& report) { warnings.push_back(report); };
  SUBCASE("DTRAIN_STALL_CHECK_DISABLE silences warnings only") {
    o.stall_check_disable = true;
    o.stall_shutdown_time_seconds = 3;
    Coordinator c(o, hooks);
    c.on_message(message(0, {tensor("x")}), t0);
    REQUIRE(c.next_deadline());
    CHECK(*c.next_deadline() == t0 + 3s);
    CHECK_FALSE(c.poll(t0 + 2s).has_value());
    auto out = c.poll(t0 + 3s);
    REQUIRE(out);
    CHECK(contains(out->fatal, "stall shutdown"));
    CHECK(contains(out->fatal, "missing on ranks [1, 2]"));
    CHECK(warnings.empty());
  }
  SUBCASE("two ops stalled a millisecond apart give one report") {
    Coordinator c(o, hooks);
    c.on_message(message(0, {tensor("a")}), t0);
    c.on_message(message(0, {tensor("b")}), t0 + 1ms);
    for (auto t = t0; t < t0 + 1500ms; t += 1ms) (void)c.poll(t);
    REQUIRE(warnings.size() == 1);
    CHECK(contains(warnings[0], "allreduce 'a'"));
    CHECK(contains(warnings[0], "allreduce 'b'"));
    CHECK(contains(warnings[0], "DTRAIN_LOG_LEVEL=debug"));
  }
}

TEST_CASE("messages survive the wire") {
  RequestMessage m = message(2, {tensor("a", {2, 5}, DataType::bfloat16)}, 7);
  m.requests[0].group = "grp";
  m.requests[0].group_size = 3;
  m.requests[0].prescale = 0.125;
  m.requests[0].rejected = "why";
  m.cached = {4, 9};
  m.shutdown = true;
  auto back = decode<RequestMessage>(encode(m));
  CHECK(back.rank == 2);
  CHECK(back.responses_applied == 7);
  REQUIRE(back.requests.size() == 1);
  CHECK(back.requests[0].name == "a");
  CHECK(back.requests[0].same_metadata(m.requests[0]));
  CHECK(back.requests[0].rejected == "why");
  CHECK(back.cached == m.cached);
  CHECK(back.shutdown);

  Coordinator c(options());
  submit_all(c, tensor("x"), t0);
  auto out = c.poll(t0);
  REQUIRE(out);
  auto r = decode<ResponseMessage>(encode(*out));
  CHECK(r.seq == out->seq);
  REQUIRE(r.responses.size() == 1);
  CHECK(r.responses[0].names == out->responses[0].names);
  REQUIRE(r.cache_inserts.size() == 1);
  CHECK(r.cache_inserts[0].id == out->cache_inserts[0].id);

  Response e;
  e.error = ErrorKind::timeout;
  e.error_ranks = {0, 2};
  ResponseMessage em;
  em.responses.push_back(e);
  auto eb = decode<ResponseMessage>(encode(em));
  CHECK(eb.responses.at(0).error_ranks == std::vector<std::int32_t>{0, 2});
  CHECK(eb.responses.at(0).applies_to(2));
  CHECK_FALSE(eb.responses.at(0).applies_to(1));
}

}  // TEST_SUITE
