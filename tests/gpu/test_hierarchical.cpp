// Hierarchical allreduce (intra-host reduce-scatter, cross-host allreduce, intra-host allgather)
// over MPI on host memory, with hosts emulated by host-id strings, checked against a plain
// MPI_Allreduce. The device backend runs the same plan with NCCL; this is where its arithmetic
// (uneven hosts, counts not divisible by the local size) is proven without a GPU.
#include "dtrain/comm/hierarchical.hpp"
#include "dtrain/dtrain.hpp"
#include "dtrain/runtime/execution/topology.hpp"

#include <doctest/doctest.h>
#include <mpi.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

using namespace dtrain;
using namespace dtrain::detail;

namespace {

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int world_size() {
  int s = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}

// Host of each rank, per layout: a string per rank ("A", "B", ...).
std::vector<std::string> layouts_for(int size) {
  switch (size) {
    case 1: return {"A"};
    case 2: return {"AB", "AA"};
    case 3: return {"AAB", "ABB", "ABA", "ABC"};
    case 4: return {"AABB", "AAAB", "ABAB", "AABC", "ABCD"};
    default: return {std::string(static_cast<std::size_t>(size), 'A')};
  }
}

// Small integers in [-3, 3] (non-negative for uint8): sums and products of up to four of them are
// exact in every dtype, so any association order gives the same bits as MPI_Allreduce.
std::vector<char> fill(DataType dtype, std::int64_t n, int rank) {
  std::vector<char> out(static_cast<std::size_t>(n) * element_size(dtype));
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    T* p = reinterpret_cast<T*>(out.data());
    for (std::int64_t i = 0; i < n; ++i) {
      int v = static_cast<int>((rank * 7 + i * 3) % 7) - 3;
      if (dtype == DataType::uint8) v += 3;
      if constexpr (is_half_v<T>) p[i] = from_f32<T>(static_cast<float>(v));
      else p[i] = static_cast<T>(v);
    }
  });
  return out;
}

struct Case {
  DataType dtype;
  ReduceOp op;
  std::int64_t n;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  for (DataType d : all_data_types) {
    for (std::int64_t n : {0, 1, 7, 1001}) out.push_back({d, ReduceOp::Sum, n});
    out.push_back({d, ReduceOp::Max, 7});
    out.push_back({d, ReduceOp::Product, 5});
  }
  out.push_back({DataType::float32, ReduceOp::Min, 1001});
  return out;
}

void check_against_mpi(const HierarchyComms& h, const Case& c, HostBuffer& scratch,
                       std::int64_t chunk) {
  auto data = fill(c.dtype, c.n, world_rank());
  auto expected = data;
  mpi_check(MPI_Allreduce(MPI_IN_PLACE, expected.data(), static_cast<int>(c.n),
                          mpi_datatype(c.dtype), mpi_op(c.op, c.dtype), MPI_COMM_WORLD),
            "MPI_Allreduce");
  hierarchical_allreduce(data.data(), c.n, c.dtype, c.op, h, scratch, chunk);
  int bad = data == expected ? 0 : 1, any_bad = 0;
  MPI_Allreduce(&bad, &any_bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  CAPTURE(to_string(c.dtype));
  CAPTURE(to_string(c.op));
  CAPTURE(c.n);
  CHECK(bad == 0);
  CHECK(any_bad == 0);
}

}  // namespace

TEST_CASE("hierarchical allreduce over MPI matches MPI_Allreduce on every emulated host layout") {
  half_ops().create();
  for (const std::string& layout : layouts_for(world_size())) {
    CAPTURE(layout);
    const std::string host(1, layout[static_cast<std::size_t>(world_rank())]);
    Topology t = make_topology(MPI_COMM_WORLD, host);
    const HierarchyComms h = t.hierarchy();
    HostBuffer scratch;
    for (const Case& c : cases()) check_against_mpi(h, c, scratch, 1 << 20);
  }
}

TEST_CASE("hierarchical allreduce: counts beyond the MPI count limit take the chunked paths") {
  half_ops().create();
  const int size = world_size();
  const std::string layout = size == 4 ? "AABB" : size == 3 ? "AAB" : std::string(size, 'A');
  const std::string host(1, layout[static_cast<std::size_t>(world_rank())]);
  Topology t = make_topology(MPI_COMM_WORLD, host);
  const HierarchyComms h = t.hierarchy();
  HostBuffer scratch;
  const std::int64_t saved = mpi_count_limit();
  mpi_count_limit() = 4;  // every piece and every per-rank count now exceeds one MPI call
  for (std::int64_t n : {9, 33, 101}) check_against_mpi(h, {DataType::float32, ReduceOp::Sum, n}, scratch, 4);
  mpi_count_limit() = saved;
}

TEST_CASE("DTRAIN_HIERARCHICAL_ALLREDUCE routes host allreduces through the host hierarchy") {
  const int rank = world_rank(), size = world_size();
  const std::string layout = size == 4 ? "AAAB" : size == 3 ? "AAB" : size == 2 ? "AB" : "A";
  auto run = [&](bool hierarchical) {
    Config config;
    config.hierarchical_allreduce = hierarchical;
    config.host_id = std::string("host-") + layout[static_cast<std::size_t>(rank)];
    init(config);
    REQUIRE(local_size() == static_cast<int>(std::count(layout.begin(), layout.end(), layout[rank])));

    std::vector<float> lone(1003);
    for (std::size_t i = 0; i < lone.size(); ++i) lone[i] = static_cast<float>((rank + 1) * (i % 5));
    allreduce(lone, {.op = ReduceOp::Sum});
    std::vector<std::vector<double>> group(5);
    for (std::size_t g = 0; g < group.size(); ++g) group[g].assign(7 + g * 13, rank + 1.0);
    grouped_allreduce(group);  // Average, fused

    const float ranks_sum = static_cast<float>(size * (size + 1) / 2);
    for (std::size_t i = 0; i < lone.size(); ++i) REQUIRE(lone[i] == ranks_sum * (i % 5));
    for (const auto& v : group)
      for (double x : v) REQUIRE(x == doctest::Approx((size + 1) / 2.0));
    const auto hier = engine_stats().hierarchical_collectives;
    shutdown();
    return hier;
  };
  CHECK(run(false) == 0);
  CHECK(run(true) >= 2);
}
