// The failed-op verdicts on their own: who is told, and when a verdict is forgotten (Note [Failed
// ops] in runtime/negotiation/failed_ops.hpp).
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "dtrain/runtime/negotiation/failed_ops.hpp"

namespace {

using namespace dtrain;
using namespace dtrain::detail;

Request op(std::string name) {
  Request q;
  q.name = std::move(name);
  return q;
}

Request member(std::string name, std::int32_t group_size) {
  Request q = op(std::move(name));
  q.group = "g";
  q.group_size = group_size;
  return q;
}

const Verdict timed_out{ErrorKind::timeout, "timed out"};
const std::vector<bool> nobody_shut_down(3, false);

}  // namespace

TEST_SUITE("coordinator failed ops") {

TEST_CASE("a verdict on a name reaches each rank that was not told, once, then is forgotten") {
  FailedOps failed(3);
  failed.fail_name("w", timed_out, std::vector<std::int32_t>{0}, nobody_shut_down);
  CHECK(failed.remembered() == 1);
  CHECK_FALSE(failed.verdict_for(0, op("w")));  // rank 0 was told; its 'w' is a new op
  const auto for_rank_2 = failed.verdict_for(2, op("w"));
  REQUIRE(for_rank_2);
  CHECK(for_rank_2->error == ErrorKind::timeout);
  CHECK(for_rank_2->message == "timed out");
  CHECK_FALSE(failed.verdict_for(2, op("w")));  // its next 'w' is a new op
  CHECK(failed.remembered() == 1);              // rank 1 has not submitted 'w' yet
  CHECK(failed.verdict_for(1, op("w")));
  CHECK(failed.remembered() == 0);
  CHECK_FALSE(failed.verdict_for(1, op("other")));
}

TEST_CASE("a rank that shut down holds no verdict open") {
  FailedOps failed(3);
  failed.fail_name("a", timed_out, std::vector<std::int32_t>{0}, {false, true, false});
  CHECK(failed.remembered() == 1);  // rank 2 has still to be told
  failed.rank_shut_down(2);
  CHECK(failed.remembered() == 0);
  // Told everyone who will ever submit it: nothing to remember.
  failed.fail_name("b", timed_out, std::vector<std::int32_t>{0, 1}, {false, false, true});
  CHECK(failed.remembered() == 0);
}

TEST_CASE("ranks that disagree on a group's size: the error names each size and its ranks") {
  FailedOps failed(3);
  CHECK_FALSE(failed.group_size_mismatch(0, member("g.0", 2)));
  CHECK_FALSE(failed.group_size_mismatch(2, member("g.0", 2)));
  const auto error = failed.group_size_mismatch(1, member("g.0", 3));
  REQUIRE(error);
  CHECK(*error == "dtrain: ranks disagree on the number of tensors in grouped_allreduce 'g': 2 on "
                  "ranks [0, 2]; 3 on ranks [1]. Every rank must pass the same number of tensors.");
  SUBCASE("a completed group's size is forgotten") {
    FailedOps fresh(2);
    CHECK_FALSE(fresh.group_size_mismatch(0, member("g.0", 2)));
    fresh.group_complete("g");
    CHECK_FALSE(fresh.group_size_mismatch(1, member("g.0", 3)));
  }
}

TEST_CASE("a failed group fails every member a rank submits later, settled per message") {
  FailedOps failed(3);
  (void)failed.group_size_mismatch(0, member("g.0", 2));
  (void)failed.group_size_mismatch(1, member("g.0", 3));
  // Rank 1's message is being read; rank 0 stated a size, so it submitted every member already.
  failed.fail_group("g", {ErrorKind::mismatch, "sizes"}, 1, nobody_shut_down);
  CHECK(failed.verdict_for(1, member("g.1", 3)));  // another member in rank 1's message
  failed.message_read();
  CHECK_FALSE(failed.verdict_for(1, member("g.0", 3)));  // a later message: a new group
  CHECK_FALSE(failed.verdict_for(0, member("g.0", 2)));
  // Rank 2 is told for every member of its one message, then the verdict is forgotten.
  CHECK(failed.verdict_for(2, member("g.0", 2)));
  CHECK(failed.verdict_for(2, member("g.1", 2)));
  CHECK(failed.remembered() == 1);
  failed.message_read();
  CHECK(failed.remembered() == 0);
}

TEST_CASE("the verdicts' messages") {
  Request rejected = op("w");
  rejected.rejected = "tensor data is null";
  CHECK(rejected_verdict(1, rejected).error == ErrorKind::invalid_argument);
  CHECK(rejected_verdict(1, rejected).message ==
        "dtrain: allreduce 'w' was rejected on rank 1: tensor data is null");
  Request grouped = member("g.0", 2);
  grouped.rejected = "bad";
  CHECK(rejected_verdict(0, grouped).message ==
        "dtrain: grouped_allreduce 'g' was rejected on rank 0: bad");
  const Verdict late = timed_out_verdict(OpKind::broadcast, "x", 5, std::vector<std::int32_t>{1},
                                         std::vector<std::int32_t>{0, 2});
  CHECK(late.error == ErrorKind::timeout);
  CHECK(late.message.starts_with("dtrain: broadcast 'x' timed out after 5 s "
                                 "(DTRAIN_OP_TIMEOUT_SECONDS): ranks [1] never submitted it "
                                 "(submitted by ranks [0, 2])."));
  const Verdict gone = shut_down_verdict(OpKind::allgather, "y", std::vector<int>{2, 3});
  CHECK(gone.error == ErrorKind::shutdown);
  CHECK(gone.message == "dtrain: allgather 'y' can never complete: ranks [2, 3] called "
                        "dtrain::shutdown() without submitting it");
}

}  // TEST_SUITE
