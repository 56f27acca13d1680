// detail::numel and detail::row_numel (Note [Element counts] in tensor/shape.hpp).
#include <doctest/doctest.h>

#include <cstdint>
#include <limits>
#include <string>

#include "dtrain/tensor/shape.hpp"
#include "dtrain/tensor/view.hpp"

using dtrain::Shape;
using dtrain::detail::numel;
using dtrain::detail::row_numel;

namespace {
std::string error_of(const Shape& s, bool row) {
  try {
    (void)(row ? row_numel(s) : numel(s));
  } catch (const dtrain::InvalidArgumentError& e) {
    return e.what();
  }
  return "(no error)";
}
}  // namespace

TEST_CASE("numel is the product of the dimensions") {
  CHECK(numel(Shape{}) == 1);
  CHECK(numel(Shape{7}) == 7);
  CHECK(numel(Shape{2, 3, 5}) == 30);
  CHECK(numel(Shape{4, 0, 9}) == 0);
  CHECK(numel(Shape{std::int64_t{1} << 31, 4}) == std::int64_t{1} << 33);
}

TEST_CASE("row_numel is the product of the dimensions after the first") {
  CHECK(row_numel(Shape{}) == 1);
  CHECK(row_numel(Shape{7}) == 1);
  CHECK(row_numel(Shape{2, 3, 5}) == 15);
  CHECK(row_numel(Shape{0, 3, 5}) == 15);
  CHECK(row_numel(Shape{4, 3, 0}) == 0);
}

TEST_CASE("a zero dimension makes the count 0 even where the rest would overflow") {
  const std::int64_t big = std::int64_t{1} << 40;
  CHECK(numel(Shape{big, big, 0}) == 0);
  CHECK(row_numel(Shape{3, big, big, 0}) == 0);
}

TEST_CASE("a negative dimension is an error that names the shape") {
  CHECK(error_of({2, -3, 4}, false) == "dtrain: negative dimension -3 (dim 1) in shape [2, -3, 4]");
  CHECK(error_of({-1, 3}, false) == "dtrain: negative dimension -1 (dim 0) in shape [-1, 3]");
  // Also when the negative dimension is the row count, which row_numel does not multiply.
  CHECK(error_of({-1, 3}, true) == "dtrain: negative dimension -1 (dim 0) in shape [-1, 3]");
  // A zero elsewhere does not hide it.
  CHECK(error_of({0, -2}, false) == "dtrain: negative dimension -2 (dim 1) in shape [0, -2]");
}

TEST_CASE("a count beyond int64 is an error that names the shape") {
  const std::int64_t max = std::numeric_limits<std::int64_t>::max();
  CHECK(numel(Shape{max}) == max);
  CHECK(numel(Shape{max / 2, 2}) == max - 1);
  CHECK(error_of({std::int64_t{1} << 32, std::int64_t{1} << 31}, false) ==
        "dtrain: shape [4294967296, 2147483648] has more elements than a 64-bit count holds");
  CHECK(error_of({max / 2 + 1, 2}, false) ==
        "dtrain: shape [4611686018427387904, 2] has more elements than a 64-bit count holds");
  CHECK(error_of({1, std::int64_t{1} << 32, std::int64_t{1} << 32}, true) ==
        "dtrain: shape [1, 4294967296, 4294967296] has more elements than a 64-bit count holds");
  CHECK(error_of({std::int64_t{1} << 32, std::int64_t{1} << 31}, true) == "(no error)");
}

TEST_CASE("OwnedTensor refuses a shape with no element count instead of allocating") {
  CHECK_THROWS_WITH_AS(dtrain::OwnedTensor(dtrain::DataType::float32, Shape{3, -1}),
                       "dtrain: negative dimension -1 (dim 1) in shape [3, -1]",
                       dtrain::InvalidArgumentError);
  dtrain::OwnedTensor t(dtrain::DataType::int32, Shape{2, 3});
  CHECK(t.numel() == 6);
}
