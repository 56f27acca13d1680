// The fusion planner on its own: ready ops and a threshold in, responses out (Note [Fusion
// planning] in runtime/negotiation/fusion_planner.hpp).
#include <doctest/doctest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "dtrain/runtime/negotiation/fusion_planner.hpp"

namespace {

using namespace dtrain;
using namespace dtrain::detail;

// A successful allreduce of `floats` float32 elements (4 bytes each) from three ranks.
ReadyOp allreduce(std::string name, std::int64_t floats = 4) {
  ReadyOp op;
  op.request.name = std::move(name);
  op.request.kind = OpKind::allreduce;
  op.request.dtype = DataType::float32;
  op.request.shape = {floats};
  op.request.reduce_op = ReduceOp::Sum;
  op.contributors = 3;
  return op;
}

template <class Change>
ReadyOp with(ReadyOp op, Change change) {
  change(op);
  return op;
}

std::vector<std::vector<std::string>> names_of(const std::vector<Response>& plan) {
  std::vector<std::vector<std::string>> out;
  for (const auto& s : plan) out.push_back(s.names);
  return out;
}

using Names = std::vector<std::vector<std::string>>;

}  // namespace

TEST_SUITE("coordinator planner") {

TEST_CASE("ops that differ in what the collective computes are never fused") {
  struct Case {
    const char* what;
    std::function<void(ReadyOp&)> change;
  };
  const std::vector<Case> cases = {
      {"dtype", [](ReadyOp& op) { op.request.dtype = DataType::float64; }},
      {"device", [](ReadyOp& op) { op.request.device = Device::cuda(0); }},
      {"reduce op", [](ReadyOp& op) { op.request.reduce_op = ReduceOp::Max; }},
      {"prescale factor", [](ReadyOp& op) { op.request.prescale = 0.5; }},
      {"postscale factor", [](ReadyOp& op) { op.request.postscale = 0.5; }},
      {"contributing ranks", [](ReadyOp& op) { op.contributors = 2; }},
      {"kind", [](ReadyOp& op) { op.request.kind = OpKind::broadcast; }},
      {"failure", [](ReadyOp& op) { op.error = ErrorKind::mismatch; }},
  };
  for (const Case& k : cases) {
    CAPTURE(k.what);
    const ReadyOp a = allreduce("a");
    const ReadyOp b = with(allreduce("b"), k.change);
    CHECK(names_of(plan_responses(std::vector{a, b}, 1 << 20)) == Names{{"a"}, {"b"}});
    // Two ops that share the difference fuse, unless it is one that never fuses.
    const ReadyOp c = with(allreduce("c"), k.change);
    const bool kind_fuses = std::string(k.what) != "kind" && std::string(k.what) != "failure";
    CHECK(names_of(plan_responses(std::vector{b, c}, 1 << 20)) ==
          (kind_fuses ? Names{{"b", "c"}} : Names{{"b"}, {"c"}}));
  }
}

TEST_CASE("a fused response keeps what its ops share") {
  auto scaled = [](std::string name) {
    return with(allreduce(std::move(name), 10), [](ReadyOp& op) {
      op.request.dtype = DataType::bfloat16;
      op.request.reduce_op = ReduceOp::Average;
      op.request.prescale = 0.25;
      op.request.postscale = 4;
      op.contributors = 2;
    });
  };
  const auto plan = plan_responses(std::vector{scaled("a"), scaled("b")}, 1 << 20);
  REQUIRE(plan.size() == 1);
  const Response& s = plan[0];
  CHECK(s.kind == OpKind::allreduce);
  CHECK(s.names == std::vector<std::string>{"a", "b"});
  CHECK(s.numels == std::vector<std::int64_t>{10, 10});
  CHECK(s.dtype == DataType::bfloat16);
  CHECK(s.reduce_op == ReduceOp::Average);
  CHECK(s.prescale == 0.25);
  CHECK(s.postscale == 4);
  CHECK(s.active_ranks == 2);
  CHECK(s.error == ErrorKind::none);
}

TEST_CASE("the threshold bounds every fused response, and an op at the threshold fits") {
  // 400-byte ops under a 1000-byte threshold: two per response.
  std::vector<ReadyOp> ready;
  for (int i = 0; i < 5; ++i) ready.push_back(allreduce("t" + std::to_string(i), 100));
  CHECK(names_of(plan_responses(ready, 1000)) == Names{{"t0", "t1"}, {"t2", "t3"}, {"t4"}});
  CHECK(names_of(plan_responses(ready, 800)) == Names{{"t0", "t1"}, {"t2", "t3"}, {"t4"}});
  CHECK(names_of(plan_responses(ready, 799)) == Names{{"t0"}, {"t1"}, {"t2"}, {"t3"}, {"t4"}});
  CHECK(names_of(plan_responses(ready, 1200)) == Names{{"t0", "t1", "t2"}, {"t3", "t4"}});
}

TEST_CASE("an op larger than the threshold goes alone, and the ops around it still fuse") {
  const std::vector ready = {allreduce("small0", 100), allreduce("huge", 1000),
                             allreduce("small1", 100)};
  CHECK(names_of(plan_responses(ready, 1000)) == Names{{"small0", "small1"}, {"huge"}});
}

TEST_CASE("a threshold of 0 fuses nothing") {
  const std::vector ready = {allreduce("a", 1), allreduce("b", 1), allreduce("c", 1)};
  CHECK(names_of(plan_responses(ready, 0)) == Names{{"a"}, {"b"}, {"c"}});
  CHECK(names_of(plan_responses(ready, 12)) == Names{{"a", "b", "c"}});
}

TEST_CASE("order: responses as they were opened, names as the ops became ready") {
  const ReadyOp f64 = with(allreduce("x"), [](ReadyOp& op) {
    op.request.dtype = DataType::float64;
  });
  auto f64_named = [&](std::string name) {
    return with(f64, [&](ReadyOp& op) { op.request.name = name; });
  };
  const std::vector ready = {allreduce("a"), f64_named("b"), allreduce("c"), f64_named("d"),
                             allreduce("e")};
  CHECK(names_of(plan_responses(ready, 1 << 20)) == Names{{"a", "c", "e"}, {"b", "d"}});
  SUBCASE("an op joins the first open response with room, even one opened before others") {
    // 600 + 600 does not fit 1000; 600 + 400 does, in the first response.
    const std::vector mixed = {allreduce("a", 150), allreduce("b", 150), allreduce("c", 100)};
    CHECK(names_of(plan_responses(mixed, 1000)) == Names{{"a", "c"}, {"b"}});
  }
}

TEST_CASE("an op that does not fuse keeps every field in its own response") {
  ReadyOp gather;
  gather.request.name = "g";
  gather.request.kind = OpKind::allgather;
  gather.request.dtype = DataType::int32;
  gather.request.shape = {2, 3};
  gather.request.root = 1;
  gather.rank_rows = {2, 0, 5};
  gather.contributors = 2;
  ReadyOp failed = allreduce("f");
  failed.error = ErrorKind::timeout;
  failed.message = "timed out";
  failed.error_ranks = {0, 2};
  const auto plan = plan_responses(std::vector{gather, failed}, 1 << 20);
  REQUIRE(plan.size() == 2);
  CHECK(plan[0].kind == OpKind::allgather);
  CHECK(plan[0].names == std::vector<std::string>{"g"});
  CHECK(plan[0].numels == std::vector<std::int64_t>{6});
  CHECK(plan[0].dtype == DataType::int32);
  CHECK(plan[0].shape == std::vector<std::int64_t>{2, 3});
  CHECK(plan[0].root == 1);
  CHECK(plan[0].rank_rows == std::vector<std::int64_t>{2, 0, 5});
  CHECK(plan[0].active_ranks == 2);
  CHECK(plan[1].error == ErrorKind::timeout);
  CHECK(plan[1].error_message == "timed out");
  CHECK(plan[1].error_ranks == std::vector<std::int32_t>{0, 2});
}

TEST_CASE("allgathers of host memory fuse by dtype; the threshold counts every rank's rows") {
  // Rows of 3 float32 elements (12 bytes); ranks send 2, 0 and 1 rows: 36 bytes gathered.
  auto gather = [](std::string name, std::vector<std::int64_t> rows = {2, 0, 1},
                   DataType dtype = DataType::float32) {
    ReadyOp op;
    op.request.name = std::move(name);
    op.request.kind = OpKind::allgather;
    op.request.dtype = dtype;
    op.request.shape = {rows[0], 3};
    op.rank_rows = std::move(rows);
    op.contributors = 3;
    return op;
  };
  const std::vector ready = {gather("a"), gather("b", {1, 1, 4}),
                             gather("i", {2, 0, 1}, DataType::int32), allreduce("r"),
                             gather("c", {0, 0, 0})};
  const auto plan = plan_responses(ready, 1 << 20);
  CHECK(names_of(plan) == Names{{"a", "b", "c"}, {"i"}, {"r"}});
  // Each tensor's rows per rank, tensor after tensor, and its row size.
  CHECK(plan[0].rank_rows == std::vector<std::int64_t>{2, 0, 1, 1, 1, 4, 0, 0, 0});
  CHECK(plan[0].row_numels == std::vector<std::int64_t>{3, 3, 3});
  CHECK(plan[0].numels.size() == 3);
  CHECK(ReadyOp(gather("a")).bytes() == 36);
  CHECK(names_of(plan_responses(std::vector{gather("a"), gather("b", {1, 1, 4})}, 107)) ==
        Names{{"a"}, {"b"}});
  CHECK(names_of(plan_responses(std::vector{gather("a"), gather("b", {1, 1, 4})}, 108)) ==
        Names{{"a", "b"}});
  CHECK(names_of(plan_responses(std::vector{gather("a"), gather("b")}, 0)) == Names{{"a"}, {"b"}});
  // Device allgathers go alone.
  const ReadyOp dev = with(gather("d"), [](ReadyOp& op) { op.request.device = Device::cuda(0); });
  const ReadyOp dev2 = with(gather("e"), [](ReadyOp& op) { op.request.device = Device::cuda(0); });
  CHECK(names_of(plan_responses(std::vector{dev, dev2}, 1 << 20)) == Names{{"d"}, {"e"}});
}

TEST_CASE("the planner keeps no state: the same ready ops give the same plan, every time") {
  std::vector<ReadyOp> ready;
  for (int i = 0; i < 7; ++i) ready.push_back(allreduce("t" + std::to_string(i), 50 * (i + 1)));
  const auto first = plan_responses(ready, 1000);
  CHECK(plan_responses(std::vector{allreduce("other", 10)}, 1000).size() == 1);
  CHECK(plan_responses(ready, 1000) == first);
  CHECK(plan_responses(std::vector<ReadyOp>{}, 1000).empty());
}

}  // TEST_SUITE
