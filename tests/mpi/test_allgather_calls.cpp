// Blocks of one size are gathered with MPI_Iallgather, never MPI_Iallgatherv (Note [Allgather,
// not Allgatherv]): MPICH's Allgatherv costs 100x more where ranks share cores. The MPI calls are
// counted through the PMPI profiling interface; every result is checked against closed forms.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "dtrain/comm/hierarchical.hpp"
#include "dtrain/runtime/execution/topology.hpp"
#include "mpi_test_util.hpp"

namespace {

std::atomic<std::int64_t> allgather_calls{0};
std::atomic<std::int64_t> allgatherv_calls{0};

}  // namespace

extern "C" int MPI_Iallgather(const void* send, int send_count, MPI_Datatype send_type,
                              void* recv, int recv_count, MPI_Datatype recv_type, MPI_Comm comm,
                              MPI_Request* request) {
  allgather_calls.fetch_add(1);
  return PMPI_Iallgather(send, send_count, send_type, recv, recv_count, recv_type, comm, request);
}
extern "C" int MPI_Iallgatherv(const void* send, int count, MPI_Datatype send_type, void* recv,
                               const int counts[], const int displs[], MPI_Datatype recv_type,
                               MPI_Comm comm, MPI_Request* request) {
  allgatherv_calls.fetch_add(1);
  return PMPI_Iallgatherv(send, count, send_type, recv, counts, displs, recv_type, comm, request);
}

namespace {

using dtrain::DataType;
using dtrain::ReduceOp;
using namespace dtrain::detail;
using namespace dtrain_test;

struct Calls {
  std::int64_t allgather = 0, allgatherv = 0;
};

template <class F>
Calls count_calls(F&& f) {
  const std::int64_t g = allgather_calls.load(), v = allgatherv_calls.load();
  f();
  return {allgather_calls.load() - g, allgatherv_calls.load() - v};
}

// Rank r contributes counts[r] elements valued 1000 r + i; every rank must hold all of them.
void check_gathered(const std::vector<float>& out, const std::vector<std::int64_t>& counts) {
  std::size_t at = 0;
  int wrong = 0;
  for (std::size_t r = 0; r < counts.size(); ++r)
    for (std::int64_t i = 0; i < counts[r]; ++i, ++at)
      if (out[at] != static_cast<float>(1000 * r + i)) ++wrong;
  CHECK(at == out.size());
  CHECK(wrong == 0);
}

void gather(const std::vector<std::int64_t>& counts, Calls expected) {
  const int rank = world_rank();
  std::int64_t total = 0;
  for (auto c : counts) total += c;
  std::vector<float> mine(static_cast<std::size_t>(counts[rank]));
  for (std::int64_t i = 0; i < counts[rank]; ++i) mine[i] = static_cast<float>(1000 * rank + i);
  std::vector<float> out(static_cast<std::size_t>(total), -1.0f);
  const Calls calls = count_calls([&] {
    host_allgatherv(mine.data(), out.data(), counts, DataType::float32, MPI_COMM_WORLD, 1 << 20);
  });
  check_gathered(out, counts);
  CHECK(calls.allgather == expected.allgather);
  CHECK(calls.allgatherv == expected.allgatherv);

  // In place: each rank's block already at its offset, as the fused allgather lays it out.
  std::vector<float> in_place(static_cast<std::size_t>(total), -1.0f);
  std::int64_t offset = 0;
  for (int r = 0; r < rank; ++r) offset += counts[r];
  std::copy(mine.begin(), mine.end(), in_place.begin() + offset);
  const Calls in_place_calls = count_calls([&] {
    host_allgatherv_in_place(in_place.data(), counts, DataType::float32, MPI_COMM_WORLD, 1 << 20);
  });
  check_gathered(in_place, counts);
  CHECK(in_place_calls.allgather == expected.allgather);
  CHECK(in_place_calls.allgatherv == expected.allgatherv);
}

}  // namespace

TEST_CASE("allgather: blocks of one size take MPI_Iallgather, blocks of several MPI_Iallgatherv") {
  const int size = world_size();
  gather(std::vector<std::int64_t>(static_cast<std::size_t>(size), 37), {1, 0});
  gather(std::vector<std::int64_t>(static_cast<std::size_t>(size), 0), {1, 0});
  if (size > 1) {
    std::vector<std::int64_t> uneven(static_cast<std::size_t>(size), 5);
    uneven.back() = 9;
    gather(uneven, {0, 1});
  }
}

TEST_CASE("hierarchical allreduce gathers its pieces with MPI_Iallgather, even or not") {
  const int rank = world_rank(), size = world_size();
  // Two emulated hosts where there are ranks enough (AABB, AAB, AB), one otherwise: even and
  // uneven hosts, and counts that do and do not divide by the parts.
  const std::string layout = size == 4 ? "AABB" : size == 3 ? "AAB" : size == 2 ? "AB" : "A";
  Topology t = make_topology(MPI_COMM_WORLD, std::string(1, layout[static_cast<std::size_t>(rank)]));
  const HierarchyComms h = t.hierarchy();
  HostBuffer scratch;
  for (std::int64_t n : {1000, 1001, 7}) {
    CAPTURE(n);
    std::vector<float> data(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) data[i] = static_cast<float>((rank + 1) * (i % 11));
    const Calls calls = count_calls([&] {
      hierarchical_allreduce(data.data(), n, DataType::float32, ReduceOp::Sum, h, scratch,
                             1 << 20, 0.5);
    });
    const float ranks = static_cast<float>(size * (size + 1) / 2);
    int wrong = 0;
    for (std::int64_t i = 0; i < n; ++i)
      if (data[i] != 0.5f * ranks * static_cast<float>(i % 11)) ++wrong;
    CHECK(wrong == 0);
    CHECK(calls.allgatherv == 0);
    CHECK(calls.allgather == 1);
  }
}
