// Allgathers fused into one collective (Note [Fused allgather] in
// runtime/execution/host_backend.hpp): dim 0 differing per rank and per tensor, ranks with no rows
// at all, several dtypes in one burst (one collective per dtype, never one across dtypes), a rank
// that joined, and fusion switched off.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "dtrain/runtime/grouped_collectives.hpp"
#include "engine_test.hpp"

namespace {

using namespace dtrain;
using dtrain::test::Buffer;

constexpr DataType kDtypes[] = {DataType::float32, DataType::int64, DataType::float16};

// Tensor t of rank r: (r + t) % 3 rows (none on some ranks), 1 + t % 2 columns, each element
// naming its rank, tensor, row and column; every dtype holds these values exactly.
std::int64_t rows_of(int r, int t) { return (r + t) % 3; }
std::int64_t cols_of(int t) { return 1 + t % 2; }
double value(int r, int t, std::int64_t row, std::int64_t col) {
  return r * 100 + t * 10 + row * 2 + col;
}

Buffer tensor_of(int r, int t) {
  const DataType dtype = kDtypes[t % 3];
  Buffer b(dtype, rows_of(r, t) * cols_of(t), {rows_of(r, t), cols_of(t)});
  for (std::int64_t row = 0; row < rows_of(r, t); ++row)
    for (std::int64_t col = 0; col < cols_of(t); ++col)
      b.set(row * cols_of(t) + col, value(r, t, row, col));
  return b;
}

double element(const OwnedTensor& t, std::int64_t i) {
  const auto* p = static_cast<const std::byte*>(t.data()) +
                  i * static_cast<std::int64_t>(element_size(t.dtype()));
  auto load = [&](auto v) {
    std::memcpy(&v, p, sizeof(v));
    return v;
  };
  switch (t.dtype()) {
    case DataType::float32: return load(0.0f);
    case DataType::int64: return static_cast<double>(load(std::int64_t{0}));
    case DataType::float16: return static_cast<float>(load(float16_t{}));
    default: return -1;
  }
}

// Whether `got` is the concatenation of tensor t of `ranks`, in rank order.
bool is_gather_of(const OwnedTensor& got, int t, const std::vector<int>& ranks) {
  std::int64_t rows = 0;
  for (int r : ranks) rows += rows_of(r, t);
  if (got.shape() != Shape{rows, cols_of(t)} || got.dtype() != kDtypes[t % 3]) return false;
  std::int64_t at = 0;
  for (int r : ranks)
    for (std::int64_t row = 0; row < rows_of(r, t); ++row)
      for (std::int64_t col = 0; col < cols_of(t); ++col)
        if (element(got, at++) != value(r, t, row, col)) return false;
  return true;
}

std::vector<int> all_ranks(int size) {
  std::vector<int> out;
  for (int r = 0; r < size; ++r) out.push_back(r);
  return out;
}

}  // namespace

TEST_CASE("a burst of allgathers of three dtypes runs as one collective per dtype") {
  test::Initialized dt;
  const int rank = dtrain::rank(), size = dtrain::size();
  constexpr int count = 12;
  std::vector<Buffer> tensors;
  for (int t = 0; t < count; ++t) tensors.push_back(tensor_of(rank, t));
  std::vector<TensorView> views;
  for (auto& b : tensors) views.push_back(b.view());
  const auto before = engine_stats();
  const std::vector<OwnedTensor> out = grouped_allgather(views, {.name = "burst"});
  const auto after = engine_stats();
  REQUIRE(out.size() == count);
  for (int t = 0; t < count; ++t)
    CHECK_MESSAGE(is_gather_of(out[t], t, all_ranks(size)), "tensor " << t);
  CHECK(after.collectives - before.collectives == 3);
  CHECK(after.fused_collectives - before.fused_collectives == 3);
  CHECK(after.allgather_bytes - before.allgather_bytes > 0);
}

TEST_CASE("separate allgathers in flight together gather right, however they are batched") {
  test::Initialized dt;
  const int rank = dtrain::rank(), size = dtrain::size();
  constexpr int count = 30;
  std::vector<Buffer> tensors;
  for (int t = 0; t < count; ++t) tensors.push_back(tensor_of(rank, t));
  std::vector<ResultHandle<OwnedTensor>> handles;
  // Every rank submits in its own order: ranks are matched by name.
  std::vector<int> order;
  for (int i = 0; i < count; ++i) order.push_back((i + rank * 11) % count);
  handles.resize(count);
  std::vector<TensorView> views;  // an op's tensor, a view included, lives until it completes
  for (auto& b : tensors) views.push_back(b.view());
  for (int t : order) handles[t] = allgather_async(views[t], {.name = fmt::format("sep.{}", t)});
  for (int t = 0; t < count; ++t)
    CHECK_MESSAGE(is_gather_of(handles[t].get(), t, all_ranks(size)), "tensor " << t);
}

TEST_CASE("a rank that joined contributes no rows to a fused allgather") {
  test::Initialized dt;
  const int rank = dtrain::rank(), size = dtrain::size();
  const int joiner = size - 1;
  std::vector<int> active;
  for (int r = 0; r < size; ++r)
    if (r != joiner) active.push_back(r);
  if (rank != joiner) {
    std::vector<Buffer> tensors;
    for (int t = 0; t < 4; ++t) tensors.push_back(tensor_of(rank, 3 * t));  // float32 only
    std::vector<TensorView> views;
    for (auto& b : tensors) views.push_back(b.view());
    const auto out = grouped_allgather(views, {.name = "with.joined"});
    for (int t = 0; t < 4; ++t) CHECK(is_gather_of(out[t], 3 * t, active));
  }
  CHECK(dtrain::join() >= 0);
}

TEST_CASE("with fusion off (DTRAIN_FUSION_THRESHOLD=0) every allgather is its own collective") {
  Config config = Config::from_env();
  config.fusion_threshold_bytes = 0;
  test::Initialized dt(config);
  const int rank = dtrain::rank(), size = dtrain::size();
  std::vector<Buffer> tensors;
  for (int t = 0; t < 5; ++t) tensors.push_back(tensor_of(rank, t));
  std::vector<TensorView> views;
  for (auto& b : tensors) views.push_back(b.view());
  const auto before = engine_stats();
  const auto out = grouped_allgather(views, {.name = "unfused"});
  const auto after = engine_stats();
  for (int t = 0; t < 5; ++t) CHECK(is_gather_of(out[t], t, all_ranks(size)));
  CHECK(after.collectives - before.collectives == 5);
  CHECK(after.fused_collectives - before.fused_collectives == 0);
}
