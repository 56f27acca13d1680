// The coordinator's join on its own: when it completes, fails or times out (Note [Join] in
// runtime/negotiation/join_tracker.hpp).
#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "dtrain/runtime/negotiation/join_tracker.hpp"

namespace {

using namespace dtrain::detail;
using namespace std::chrono_literals;

const JoinTracker::Clock::time_point t0 = JoinTracker::Clock::time_point{} + 1h;
const std::vector<bool> nobody_shut_down(3, false);

}  // namespace

TEST_SUITE("coordinator join") {

TEST_CASE("the join completes once every rank has joined, naming the last, and is then over") {
  JoinTracker join(3, 10);
  CHECK_FALSE(join.active());
  CHECK_FALSE(join.conclude(t0, nobody_shut_down));
  join.join(2, t0);
  join.join(0, t0 + 1s);
  join.join(2, t0 + 2s);  // joining twice changes nothing
  CHECK(join.active());
  CHECK(join.has_joined(0));
  CHECK_FALSE(join.has_joined(1));
  CHECK_FALSE(join.conclude(t0 + 2s, nobody_shut_down));
  join.join(1, t0 + 3s);
  const auto done = join.conclude(t0 + 3s, nobody_shut_down);
  REQUIRE(done);
  CHECK(done->kind == OpKind::join);
  CHECK(done->names == std::vector<std::string>{"join"});
  CHECK(done->error == ErrorKind::none);
  CHECK(done->last_joined_rank == 1);
  CHECK(done->error_ranks.empty());
  CHECK_FALSE(join.active());
  CHECK_FALSE(join.has_joined(0));
  CHECK_FALSE(join.conclude(t0 + 4s, nobody_shut_down));
}

TEST_CASE("a rank that shuts down without joining fails the join at once, for the joined ranks") {
  JoinTracker join(3, 0);
  join.join(0, t0);
  join.join(2, t0);
  const auto failed = join.conclude(t0, {false, true, false});
  REQUIRE(failed);
  CHECK(failed->error == ErrorKind::shutdown);
  CHECK(failed->error_message == "dtrain: join() can never complete: ranks [1] called "
                                 "dtrain::shutdown() without joining (joined: ranks [0, 2])");
  CHECK(failed->error_ranks == std::vector<std::int32_t>{0, 2});
  CHECK_FALSE(join.active());
}

TEST_CASE("the join times out after the op timeout of silence from the ranks it waits for") {
  JoinTracker join(3, 10);
  join.join(0, t0);
  REQUIRE(join.timeout_deadline());
  CHECK(*join.timeout_deadline() == t0 + 10s);
  join.heard_from(0, t0 + 5s);  // a joined rank's requests do not count
  join.heard_from(1, t0 + 4s);
  join.heard_from(2, t0 + 3s);
  CHECK(join.quiet_since() == t0 + 4s);
  CHECK(*join.timeout_deadline() == t0 + 14s);
  CHECK_FALSE(join.conclude(t0 + 13s, nobody_shut_down));
  CHECK(join.describe(t0 + 13s) == "\n  join: joined by ranks [0], waiting for ranks [1, 2], from "
                                   "which no request has come for 9.0 s");
  const auto late = join.conclude(t0 + 14s, nobody_shut_down);
  REQUIRE(late);
  CHECK(late->error == ErrorKind::timeout);
  CHECK(late->error_message == "dtrain: join() timed out after 10 s (DTRAIN_OP_TIMEOUT_SECONDS): "
                               "ranks [1, 2] have neither joined nor submitted any op for that "
                               "long (joined: ranks [0])");
  CHECK(late->error_ranks == std::vector<std::int32_t>{0});
  CHECK(join.describe(t0 + 14s).empty());
}

TEST_CASE("without an op timeout the join waits as long as it takes") {
  JoinTracker join(2, 0);
  join.join(1, t0);
  CHECK_FALSE(join.timeout_deadline());
  CHECK_FALSE(join.conclude(t0 + 1000h, {false, false}));
  CHECK(join.active());
}

}  // TEST_SUITE
