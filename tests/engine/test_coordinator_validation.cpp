// Validation across ranks on its own: each rank's request of one op in, the ready op or its failure
// out (Note [Validation across ranks] in runtime/negotiation/cross_rank_validation.hpp).
#include <doctest/doctest.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dtrain/runtime/negotiation/cross_rank_validation.hpp"

namespace {

using namespace dtrain;
using namespace dtrain::detail;

Request tensor(std::vector<std::int64_t> shape = {2, 3}, OpKind kind = OpKind::allreduce) {
  Request q;
  q.name = "grad/w";
  q.kind = kind;
  q.shape = std::move(shape);
  q.reduce_op = ReduceOp::Sum;
  return q;
}

template <class Change>
Request with(Request q, Change change) {
  change(q);
  return q;
}

constexpr std::nullopt_t joined = std::nullopt;

}  // namespace

TEST_SUITE("coordinator validation") {

TEST_CASE("ranks that agree give the ready op, with the first submitting rank's request") {
  Request first = tensor();
  first.name = "first";
  const PerRankRequests per_rank = {joined, first, tensor(), tensor()};
  const ReadyOp op = validate_across_ranks("grad/w", per_rank);
  CHECK_FALSE(op.failed());
  CHECK(op.message.empty());
  CHECK(op.request.name == "first");
  CHECK(op.contributors == 3);
  CHECK(op.rank_rows.empty());  // only allgather has rows per rank
  CHECK(submitting_ranks(per_rank) == std::vector<std::int32_t>{1, 2, 3});
  CHECK(absent_ranks(per_rank) == std::vector<std::int32_t>{0});
}

TEST_CASE("a disagreement names the tensor, the field, and each value with its ranks") {
  const Request base = tensor();
  const ReadyOp op = validate_across_ranks(
      "grad/w", {base, base, with(base, [](Request& q) { q.dtype = DataType::float64; })});
  CHECK(op.error == ErrorKind::mismatch);
  CHECK(op.message ==
        "dtrain: ranks disagree on the dtype of allreduce 'grad/w': float32 on ranks [0, 1]; "
        "float64 on ranks [2]. Run with DTRAIN_LOG_LEVEL=debug to see what each rank submitted.");
  CHECK(op.contributors == 3);
  CHECK(op.error_ranks.empty());  // every rank fails it
}

TEST_CASE("a reduction compares its reduce op, scale factors and shape") {
  struct Case {
    const char* field;
    void (*change)(Request&);
    const char* values;  // how the message begins to list them, in the order of their text
  };
  const Case cases[] = {
      {"reduce op", [](Request& q) { q.reduce_op = ReduceOp::Product; },
       "Product on ranks [1]; Sum"},
      {"prescale factor", [](Request& q) { q.prescale = 0.5; }, "0.5 on ranks [1]; 1"},
      {"postscale factor", [](Request& q) { q.postscale = 3; }, "1 on ranks [0]; 3"},
      {"shape", [](Request& q) { q.shape = {3, 3}; }, "[2, 3] on ranks [0]; [3, 3]"},
  };
  for (OpKind kind : {OpKind::allreduce, OpKind::reducescatter}) {
    for (const Case& k : cases) {
      CAPTURE(to_string(kind));
      CAPTURE(k.field);
      const Request base = tensor({2, 3}, kind);
      const ReadyOp op = validate_across_ranks("grad/w", {base, with(base, k.change)});
      CHECK(op.error == ErrorKind::mismatch);
      CAPTURE(op.message);
      CHECK(op.message.find(fmt::format("the {} of {} 'grad/w': {}", k.field, kind, k.values)) !=
            std::string::npos);
    }
  }
}

TEST_CASE("values are listed in the order of their text, not of the ranks") {
  const Request base = tensor();
  const Request odd = with(base, [](Request& q) { q.shape = {3, 2}; });
  const ReadyOp op = validate_across_ranks("grad/w", {odd, base, odd, base});
  CHECK(op.error == ErrorKind::mismatch);
  CAPTURE(op.message);
  CHECK(op.message.find("the shape of allreduce 'grad/w': [2, 3] on ranks [1, 3]; [3, 2] on "
                        "ranks [0, 2]. ") != std::string::npos);
}

TEST_CASE("the first field that differs, in the order kind, dtype, device, op, scales, shape") {
  const Request base = tensor();
  // Rank 1 differs in shape and reduce op and postscale and device: device is named.
  const Request odd = with(base, [](Request& q) {
    q.shape = {6};
    q.reduce_op = ReduceOp::Max;
    q.postscale = 2;
    q.device = Device::cuda(1);
  });
  const ReadyOp op = validate_across_ranks("grad/w", {base, odd});
  CAPTURE(op.message);
  CHECK(op.message.find("the device of allreduce") != std::string::npos);
  CHECK(op.message.find("cpu on ranks [0]; cuda:1 on ranks [1]") != std::string::npos);
}

TEST_CASE("only the fields an op kind depends on are compared") {
  SUBCASE("a broadcast ignores the reduce op and scale factors, but compares shape and root") {
    const Request base = tensor({4}, OpKind::broadcast);
    const Request other_op = with(base, [](Request& q) {
      q.reduce_op = ReduceOp::Max;
      q.prescale = 0.5;
    });
    CHECK_FALSE(validate_across_ranks("b", {base, other_op}).failed());
    const ReadyOp reshaped =
        validate_across_ranks("b", {base, with(base, [](Request& q) { q.shape = {2, 2}; })});
    CHECK(reshaped.error == ErrorKind::mismatch);
    CHECK(reshaped.message.find("the shape of broadcast 'b': [2, 2] on ranks [1]; [4] on ranks "
                                "[0]") != std::string::npos);
    const ReadyOp op =
        validate_across_ranks("b", {base, with(base, [](Request& q) { q.root = 1; })});
    CHECK(op.error == ErrorKind::mismatch);
    CHECK(op.message.find("the root rank of broadcast 'b': 0 on ranks [0]; 1 on ranks [1]") !=
          std::string::npos);
  }
  SUBCASE("an allgather's dim 0 may differ; its rows are recorded per rank") {
    const ReadyOp op = validate_across_ranks(
        "g", {tensor({1, 3}, OpKind::allgather), joined, tensor({5, 3}, OpKind::allgather)});
    CHECK_FALSE(op.failed());
    CHECK(op.rank_rows == std::vector<std::int64_t>{1, 0, 5});
  }
  SUBCASE("an allgather's dimensions beyond 0 may not") {
    const ReadyOp op = validate_across_ranks(
        "g", {tensor({1, 3}, OpKind::allgather), tensor({1, 4}, OpKind::allgather)});
    CHECK(op.error == ErrorKind::mismatch);
    CHECK(op.message.find("the shape beyond dim 0 of allgather 'g': [3] on ranks [0]; [4] on "
                          "ranks [1]") != std::string::npos);
  }
  SUBCASE("an alltoall's number of dimensions may not") {
    const ReadyOp op = validate_across_ranks(
        "t", {tensor({4}, OpKind::alltoall), tensor({2, 2}, OpKind::alltoall)});
    CHECK(op.error == ErrorKind::mismatch);
    CHECK(op.message.find("the number of dimensions of alltoall 't': 1 on ranks [0]; 2 on ranks "
                          "[1]") != std::string::npos);
  }
  SUBCASE("the group and its size are one field") {
    const Request member = with(tensor(), [](Request& q) {
      q.group = "g";
      q.group_size = 2;
    });
    const ReadyOp op = validate_across_ranks(
        "grad/w", {member, with(member, [](Request& q) { q.group_size = 3; })});
    CHECK(op.error == ErrorKind::mismatch);
    CHECK(op.message.find("the group of allreduce 'grad/w': g/2 on ranks [0]; g/3 on ranks [1]") !=
          std::string::npos);
  }
}

TEST_CASE("ops that cannot take joined ranks fail as invalid arguments, naming those ranks") {
  SUBCASE("alltoall and reducescatter") {
    for (OpKind kind : {OpKind::alltoall, OpKind::reducescatter}) {
      CAPTURE(to_string(kind));
      const ReadyOp op = validate_across_ranks("x", {tensor({4}, kind), joined, joined});
      CHECK(op.error == ErrorKind::invalid_argument);
      CHECK(op.message == fmt::format("dtrain: {} 'x' cannot run while ranks [1, 2] have joined: "
                                      "only allreduce, allgather, broadcast and barrier accept "
                                      "joined ranks",
                                      kind));
      CHECK(op.contributors == 1);
    }
  }
  SUBCASE("a broadcast whose root has joined") {
    const Request bcast = with(tensor({4}, OpKind::broadcast), [](Request& q) { q.root = 1; });
    const ReadyOp op = validate_across_ranks("b", {bcast, joined, bcast});
    CHECK(op.error == ErrorKind::invalid_argument);
    CHECK(op.message == "dtrain: broadcast 'b' has root rank 1, which has already joined");
    CHECK_FALSE(validate_across_ranks("b", {joined, bcast, bcast}).failed());
  }
  SUBCASE("a device allreduce by Min, Max or Product; Sum and Average, or the host, are fine") {
    for (ReduceOp reduce : {ReduceOp::Min, ReduceOp::Max, ReduceOp::Product, ReduceOp::Sum,
                            ReduceOp::Average}) {
      for (bool cuda : {false, true}) {
        CAPTURE(to_string(reduce));
        CAPTURE(cuda);
        const Request q = with(tensor({4}), [&](Request& each) {
          each.reduce_op = reduce;
          if (cuda) each.device = Device::cuda(0);
        });
        const ReadyOp op = validate_across_ranks("m", {q, q, joined});
        const bool refused = cuda && reduce != ReduceOp::Sum && reduce != ReduceOp::Average;
        CHECK(op.failed() == refused);
        if (refused) {
          CHECK(op.error == ErrorKind::invalid_argument);
          CHECK(op.message ==
                fmt::format("dtrain: allreduce 'm' with ReduceOp::{} on cuda:0 cannot run while "
                            "ranks [2] have joined: device tensors accept joined ranks for Sum "
                            "and Average only",
                            reduce));
        }
      }
    }
  }
  SUBCASE("a mismatch is reported before a joined rank is") {
    const ReadyOp op = validate_across_ranks(
        "x", {tensor({4}, OpKind::alltoall), tensor({2, 2}, OpKind::alltoall), joined});
    CHECK(op.error == ErrorKind::mismatch);
  }
}

}  // TEST_SUITE
