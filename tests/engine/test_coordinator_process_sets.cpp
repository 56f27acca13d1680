// The coordinator with process sets, on its own (no MPI): sets are created as ops of the world,
// and each set negotiates, validates, fuses, caches, joins and reports stalls among its members
// only (Note [Process sets] in runtime/negotiation/coordinator.hpp).
#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dtrain/runtime/negotiation/coordinator.hpp"

namespace {

using namespace dtrain;
using namespace dtrain::detail;
using namespace std::chrono_literals;

const Clock::time_point t0 = Clock::time_point{} + std::chrono::hours(1);

Request on_set(std::string name, std::int32_t set, OpKind kind = OpKind::allreduce,
               std::vector<std::int64_t> shape = {4}) {
  Request q;
  q.name = std::move(name);
  q.kind = kind;
  q.dtype = DataType::float32;
  q.shape = std::move(shape);
  q.reduce_op = ReduceOp::Sum;
  q.process_set = set;
  return q;
}

Request creation(std::string name, std::vector<std::int32_t> ranks) {
  Request q;
  q.name = std::move(name);
  q.kind = OpKind::process_set;
  q.dtype = DataType::uint8;
  q.shape = {0};
  q.set_ranks = std::move(ranks);
  return q;
}

RequestMessage message(int rank, std::vector<Request> requests) {
  RequestMessage m;
  m.rank = rank;
  m.requests = std::move(requests);
  return m;
}

CoordinatorOptions options(int size = 4) {
  CoordinatorOptions o;
  o.size = size;
  o.cycle_time_ms = 0;
  o.op_timeout_seconds = 0;
  return o;
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// Creates the set of `ranks` on every rank of `c` (a world of `size`); returns its response.
Response create(Coordinator& c, const std::string& name, std::vector<std::int32_t> ranks,
                int size = 4) {
  for (int r = 0; r < size; ++r) c.on_message(message(r, {creation(name, ranks)}), t0);
  auto out = c.poll(t0);
  REQUIRE(out.has_value());
  REQUIRE(out->responses.size() == 1);
  return out->responses[0];
}

// Every response of one poll at `t`.
std::vector<Response> poll_all(Coordinator& c, Clock::time_point t = t0) {
  auto out = c.poll(t);
  return out ? out->responses : std::vector<Response>{};
}

}  // namespace

TEST_SUITE("coordinator process sets") {

TEST_CASE("add_process_set is an op of the world: the coordinator numbers each set it plans") {
  Coordinator c(options());
  const Response even = create(c, "add_process_set.0", {0, 2});
  CHECK(even.kind == OpKind::process_set);
  CHECK(even.error == ErrorKind::none);
  CHECK(even.process_set == 1);
  CHECK(even.set_ranks == std::vector<std::int32_t>{0, 2});
  const Response odd = create(c, "add_process_set.1", {1, 3});
  CHECK(odd.process_set == 2);
  CHECK(c.process_sets() == 3);

  SUBCASE("ranks that pass different lists get a mismatch naming each list") {
    c.on_message(message(0, {creation("add_process_set.2", {0, 1})}), t0);
    c.on_message(message(1, {creation("add_process_set.2", {0, 1})}), t0);
    c.on_message(message(2, {creation("add_process_set.2", {0, 2, 3})}), t0);
    c.on_message(message(3, {creation("add_process_set.2", {0, 1})}), t0);
    const auto out = poll_all(c);
    REQUIRE(out.size() == 1);
    CHECK(out[0].error == ErrorKind::mismatch);
    CHECK(contains(out[0].error_message, "ranks of add_process_set 'add_process_set.2'"));
    CHECK(contains(out[0].error_message, "[0, 1] on ranks [0, 1, 3]"));
    CHECK(contains(out[0].error_message, "[0, 2, 3] on ranks [2]"));
    CHECK(c.process_sets() == 3);
  }
  SUBCASE("a set of the same ranks as an existing one, the world's included, is refused") {
    const Response again = create(c, "add_process_set.2", {0, 2});
    CHECK(again.error == ErrorKind::invalid_argument);
    CHECK(contains(again.error_message, "process set 1 has the same ranks [0, 2]"));
    const Response world = create(c, "add_process_set.3", {0, 1, 2, 3});
    CHECK(world.error == ErrorKind::invalid_argument);
    CHECK(contains(world.error_message, "(the world)"));
    CHECK(c.process_sets() == 3);
  }
}

TEST_CASE("a set's op waits for its members only, and sets use the same names independently") {
  Coordinator c(options());
  create(c, "add_process_set.0", {0, 2});
  create(c, "add_process_set.1", {1, 3});
  c.on_message(message(0, {on_set("grad", 1)}), t0);
  c.on_message(message(1, {on_set("grad", 2)}), t0);
  CHECK(poll_all(c).empty());
  c.on_message(message(2, {on_set("grad", 1)}), t0);
  auto out = poll_all(c);
  REQUIRE(out.size() == 1);
  CHECK(out[0].process_set == 1);
  CHECK(out[0].names == std::vector<std::string>{"grad"});
  CHECK(out[0].active_ranks == 2);
  c.on_message(message(3, {on_set("grad", 2)}), t0);
  out = poll_all(c);
  REQUIRE(out.size() == 1);
  CHECK(out[0].process_set == 2);
  CHECK_FALSE(c.has_pending());
}

TEST_CASE("ops of different sets never fuse; ops of one set do") {
  Coordinator c(options());
  create(c, "add_process_set.0", {0, 1});
  create(c, "add_process_set.1", {0, 1, 2});
  for (int r : {0, 1}) c.on_message(message(r, {on_set("a", 1), on_set("b", 1)}), t0);
  for (int r : {0, 1, 2}) c.on_message(message(r, {on_set("c", 2)}), t0);
  for (int r : {0, 1, 2, 3}) c.on_message(message(r, {on_set("d", 0)}), t0);
  const auto out = poll_all(c);
  REQUIRE(out.size() == 3);
  // The world's responses first, then each set's by id.
  CHECK(out[0].names == std::vector<std::string>{"d"});
  CHECK(out[0].process_set == 0);
  CHECK(out[1].names == std::vector<std::string>{"a", "b"});
  CHECK(out[1].process_set == 1);
  CHECK(out[2].names == std::vector<std::string>{"c"});
  CHECK(out[2].process_set == 2);
}

TEST_CASE("a mismatch inside a set fails the op for the set, naming the set and its ranks") {
  Coordinator c(options());
  create(c, "add_process_set.0", {1, 3});
  Request wide = on_set("w", 1, OpKind::allreduce, {8});
  c.on_message(message(1, {on_set("w", 1)}), t0);
  c.on_message(message(3, {wide}), t0);
  const auto out = poll_all(c);
  REQUIRE(out.size() == 1);
  CHECK(out[0].error == ErrorKind::mismatch);
  CHECK(out[0].process_set == 1);  // executed, and so raised, by the set's members only
  CHECK(contains(out[0].error_message, "shape of allreduce 'w' on process set 1 (ranks [1, 3])"));
  CHECK(contains(out[0].error_message, "[4] on ranks [1]; [8] on ranks [3]"));
}

TEST_CASE("a set's broadcast root travels as its rank in the set; allgather rows by set rank") {
  Coordinator c(options());
  create(c, "add_process_set.0", {1, 2, 3});
  Request b = on_set("b", 1, OpKind::broadcast);
  b.root = 3;
  for (int r : {1, 2, 3}) c.on_message(message(r, {b}), t0);
  auto out = poll_all(c);
  REQUIRE(out.size() == 1);
  CHECK(out[0].root == 2);
  c.on_message(message(1, {on_set("g", 1, OpKind::allgather, {5, 2})}), t0);
  c.on_message(message(2, {on_set("g", 1, OpKind::allgather, {0, 2})}), t0);
  c.on_message(message(3, {on_set("g", 1, OpKind::allgather, {1, 2})}), t0);
  out = poll_all(c);
  REQUIRE(out.size() == 1);
  CHECK(out[0].rank_rows == std::vector<std::int64_t>{5, 0, 1});
  CHECK(out[0].row_numels == std::vector<std::int64_t>{2});
}

TEST_CASE("the response cache keeps one entry per name and set") {
  Coordinator c(options());
  create(c, "add_process_set.0", {0, 1});
  for (int r : {0, 1}) c.on_message(message(r, {on_set("grad", 1)}), t0);
  for (int r : {0, 1, 2, 3}) c.on_message(message(r, {on_set("grad", 0)}), t0);
  auto out = c.poll(t0);
  REQUIRE(out.has_value());
  REQUIRE(out->cache_inserts.size() == 2);
  CHECK(out->cache_inserts[0].id != out->cache_inserts[1].id);
  CHECK(out->cache_inserts[0].process_set != out->cache_inserts[1].process_set);
  CHECK(c.cache_size() == 2);
  // The set's id stands for the set's op only.
  RequestMessage ids;
  ids.rank = 1;
  for (const auto& ins : out->cache_inserts)
    if (ins.process_set == 1) ids.cached.push_back(ins.id);
  c.on_message(ids, t0);
  ids.rank = 0;
  c.on_message(ids, t0);
  const auto again = poll_all(c);
  REQUIRE(again.size() == 1);
  CHECK(again[0].process_set == 1);
  CHECK(c.stats().cache_hits == 2);
}

TEST_CASE("join is per set: the set's ops stop waiting for a joined member; the world does not") {
  Coordinator c(options());
  create(c, "add_process_set.0", {0, 2});
  c.on_message(message(2, {on_set("join", 1, OpKind::join, {0})}), t0);
  c.on_message(message(0, {on_set("x", 1)}), t0);
  auto out = poll_all(c);
  REQUIRE(out.size() == 1);
  CHECK(out[0].names == std::vector<std::string>{"x"});
  CHECK(out[0].active_ranks == 1);
  // The world still waits for rank 2.
  for (int r : {0, 1, 3}) c.on_message(message(r, {on_set("y", 0)}), t0);
  CHECK(poll_all(c).empty());
  c.on_message(message(2, {on_set("y", 0)}), t0);
  out = poll_all(c);
  REQUIRE(out.size() == 1);
  CHECK(out[0].active_ranks == 4);
  c.on_message(message(0, {on_set("join", 1, OpKind::join, {0})}), t0);
  out = poll_all(c);
  REQUIRE(out.size() == 1);
  CHECK(out[0].kind == OpKind::join);
  CHECK(out[0].process_set == 1);
  CHECK(out[0].last_joined_rank == 0);
}

TEST_CASE("the stall report names the set and its missing members only") {
  CoordinatorOptions o = options();
  o.stall_check_time_seconds = 1;
  std::vector<std::string> warnings;
  CoordinatorHooks hooks;
  hooks.stall_warning = [&](const std::string& w) { warnings.push_back(w); };
  Coordinator c(o, hooks);
  create(c, "add_process_set.0", {1, 2, 3});
  c.on_message(message(1, {on_set("slow", 1)}), t0);
  c.poll(t0 + 2s);
  REQUIRE(warnings.size() == 1);
  CHECK(contains(warnings[0], "allreduce 'slow' on process set 1 (ranks [1, 2, 3]): submitted by "
                              "ranks [1], missing on ranks [2, 3]"));
}

TEST_CASE("a verdict on a set's op waits only for the set's members") {
  Coordinator c(options());
  create(c, "add_process_set.0", {0, 3});
  Request bad = on_set("r", 1);
  bad.rejected = "shape is wrong";
  c.on_message(message(3, {bad}), t0);
  auto out = poll_all(c);
  REQUIRE(out.size() == 1);
  CHECK(out[0].error == ErrorKind::invalid_argument);
  CHECK(
      contains(out[0].error_message, "'r' on process set 1 (ranks [0, 3]) was rejected on rank 3"));
  CHECK(c.failed_remembered() == 1);  // rank 0 has not submitted it yet
  c.on_message(message(0, {on_set("r", 1)}), t0);
  out = poll_all(c);
  REQUIRE(out.size() == 1);
  CHECK(out[0].error_ranks == std::vector<std::int32_t>{0});
  CHECK(c.failed_remembered() == 0);  // ranks 1 and 2 are not members: nothing waits for them
}

TEST_CASE("an add_process_set cannot run while ranks have joined the world") {
  Coordinator c(options(2));
  c.on_message(message(1, {on_set("join", 0, OpKind::join, {0})}), t0);
  c.on_message(message(0, {creation("add_process_set.0", {0})}), t0);
  const auto out = poll_all(c);
  REQUIRE(out.size() == 1);
  CHECK(out[0].error == ErrorKind::invalid_argument);
  CHECK(c.process_sets() == 1);
}

}  // TEST_SUITE
