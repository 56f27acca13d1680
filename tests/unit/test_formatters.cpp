// fmt::formatter specializations: `{}` writes each enumerator's name, the one spelling used in
// every message and log line.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <string>
#include <utility>

#include "dtrain/comm/reduce_op.hpp"
#include "dtrain/runtime/negotiation/messages.hpp"
#include "dtrain/tensor/device.hpp"
#include "dtrain/tensor/dtype.hpp"

using dtrain::DataType;
using dtrain::Device;
using dtrain::ReduceOp;
using dtrain::detail::OpKind;

TEST_CASE("DataType formats as its name") {
  const std::pair<DataType, const char*> want[] = {
      {DataType::uint8, "uint8"},       {DataType::int8, "int8"},
      {DataType::int32, "int32"},       {DataType::int64, "int64"},
      {DataType::float16, "float16"},   {DataType::bfloat16, "bfloat16"},
      {DataType::float32, "float32"},   {DataType::float64, "float64"}};
  static_assert(std::size(want) == std::size(dtrain::all_data_types));
  for (const auto& [t, name] : want) CHECK(fmt::format("{}", t) == name);
}

TEST_CASE("ReduceOp formats as its enumerator name") {
  const std::pair<ReduceOp, const char*> want[] = {{ReduceOp::Average, "Average"},
                                                   {ReduceOp::Sum, "Sum"},
                                                   {ReduceOp::Min, "Min"},
                                                   {ReduceOp::Max, "Max"},
                                                   {ReduceOp::Product, "Product"}};
  for (const auto& [op, name] : want) CHECK(fmt::format("{}", op) == name);
}

TEST_CASE("Device formats as cpu or cuda:<index>") {
  CHECK(fmt::format("{}", Device::cpu()) == "cpu");
  CHECK(fmt::format("{}", Device::cuda(0)) == "cuda:0");
  CHECK(fmt::format("{}", Device::cuda(7)) == "cuda:7");
}

TEST_CASE("OpKind formats as the op's name") {
  const std::pair<OpKind, const char*> want[] = {
      {OpKind::allreduce, "allreduce"}, {OpKind::allgather, "allgather"},
      {OpKind::broadcast, "broadcast"}, {OpKind::alltoall, "alltoall"},
      {OpKind::reducescatter, "reducescatter"}, {OpKind::barrier, "barrier"},
      {OpKind::join, "join"}};
  for (const auto& [k, name] : want) CHECK(fmt::format("{}", k) == name);
}

TEST_CASE("format specs apply as they do to strings") {
  CHECK(fmt::format("[{:>9}]", DataType::float16) == "[  float16]");
  CHECK(fmt::format("[{:<5}]", ReduceOp::Sum) == "[Sum  ]");
  CHECK(fmt::format("[{:^8}]", Device::cuda(1)) == "[ cuda:1 ]");
  CHECK(fmt::format("[{:*>6}]", OpKind::join) == "[**join]");
}

TEST_CASE("an out-of-range value formats as unknown, not as a number") {
  CHECK(fmt::format("{}", static_cast<DataType>(200)) == "unknown");
  CHECK(fmt::format("{}", static_cast<ReduceOp>(200)) == "unknown");
  CHECK(fmt::format("{}", static_cast<OpKind>(200)) == "unknown");
}
