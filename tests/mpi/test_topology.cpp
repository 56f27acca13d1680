// Topology under emulated host layouts (DTRAIN_HOST_ID set per rank before init), checked against
// the definitions: local = ranks on the same host, local_rank by world rank within the host; cross
// = ranks with the same local rank, cross_rank in host order (hosts numbered by their lowest world
// rank); homogeneous = every host has the same number of ranks. The local and cross communicators
// must group exactly those ranks.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "dtrain/runtime/engine/runtime_state.hpp"
#include "mpi_test_util.hpp"

namespace {

using namespace dtrain_test;

struct Expected {
  int local_rank = 0, local_size = 0, cross_rank = 0, cross_size = 0;
  bool homogeneous = true;
  std::uint64_t local_members = 0, cross_members = 0;  // bit r set: world rank r is a member
};

Expected expected_topology(const std::vector<std::string>& host_of, int rank) {
  const int size = static_cast<int>(host_of.size());
  std::vector<std::string> hosts;  // first-appearance order
  for (const auto& h : host_of)
    if (std::find(hosts.begin(), hosts.end(), h) == hosts.end()) hosts.push_back(h);
  auto count = [&](const std::string& h) {
    return static_cast<int>(std::count(host_of.begin(), host_of.end(), h));
  };
  auto local_rank_of = [&](int r) {
    int lr = 0;
    for (int q = 0; q < r; ++q) lr += host_of[q] == host_of[r];
    return lr;
  };
  Expected e;
  e.local_rank = local_rank_of(rank);
  e.local_size = count(host_of[rank]);
  e.homogeneous = std::all_of(hosts.begin(), hosts.end(),
                              [&](const std::string& h) { return count(h) == count(hosts[0]); });
  for (const auto& h : hosts) {
    if (count(h) <= e.local_rank) continue;
    ++e.cross_size;
    if (std::find(hosts.begin(), hosts.end(), h) < std::find(hosts.begin(), hosts.end(), host_of[rank]))
      ++e.cross_rank;
  }
  for (int r = 0; r < size; ++r) {
    if (host_of[r] == host_of[rank]) e.local_members |= std::uint64_t{1} << r;
    if (local_rank_of(r) == e.local_rank) e.cross_members |= std::uint64_t{1} << r;
  }
  return e;
}

std::uint64_t members(MPI_Comm comm) {
  std::uint64_t mine = std::uint64_t{1} << world_rank(), all = 0;
  MPI_Allreduce(&mine, &all, 1, MPI_UINT64_T, MPI_BOR, comm);
  return all;
}

void check_layout(const std::string& layout, const std::function<std::string(int, int)>& host) {
  const int rank = world_rank(), size = world_size();
  std::vector<std::string> host_of;
  for (int r = 0; r < size; ++r) host_of.push_back(host(r, size));
  dtrain::shutdown();
  ::setenv("DTRAIN_HOST_ID", host_of[rank].c_str(), 1);
  dtrain::init();
  ::unsetenv("DTRAIN_HOST_ID");

  const Expected e = expected_topology(host_of, rank);
  INFO("layout ", layout, ", rank ", rank, " of ", size, " on host '", host_of[rank], "'");
  CHECK(dtrain::rank() == rank);
  CHECK(dtrain::size() == size);
  CHECK(dtrain::local_rank() == e.local_rank);
  CHECK(dtrain::local_size() == e.local_size);
  CHECK(dtrain::cross_rank() == e.cross_rank);
  CHECK(dtrain::cross_size() == e.cross_size);
  CHECK(dtrain::is_homogeneous() == e.homogeneous);

  const auto runtime = dtrain::detail::runtime("test");
  const auto& t = runtime->topology;
  int comm_rank = -1, comm_size = -1;
  MPI_Comm_rank(t.local_comm.get(), &comm_rank);
  MPI_Comm_size(t.local_comm.get(), &comm_size);
  CHECK(comm_rank == e.local_rank);
  CHECK(comm_size == e.local_size);
  CHECK(members(t.local_comm.get()) == e.local_members);
  MPI_Comm_rank(t.cross_comm.get(), &comm_rank);
  MPI_Comm_size(t.cross_comm.get(), &comm_size);
  CHECK(comm_rank == e.cross_rank);
  CHECK(comm_size == e.cross_size);
  CHECK(members(t.cross_comm.get()) == e.cross_members);

  // The re-initialized runtime works.
  std::vector<std::int32_t> v{dtrain::local_rank()};
  dtrain::allreduce(v, {.op = dtrain::ReduceOp::Max});
  int max_local = 0;
  for (int r = 0; r < size; ++r) max_local = std::max(max_local, expected_topology(host_of, r).local_rank);
  CHECK(v[0] == max_local);
}

}  // namespace

TEST_CASE("topology without a host override: every rank shares this machine") {
  ::unsetenv("DTRAIN_HOST_ID");
  ::unsetenv("HOROVOD_HOST_ID");
  dtrain::shutdown();
  dtrain::init();
  const int rank = world_rank(), size = world_size();
  CHECK(dtrain::rank() == rank);
  CHECK(dtrain::size() == size);
  CHECK(dtrain::local_rank() == rank);
  CHECK(dtrain::local_size() == size);
  CHECK(dtrain::cross_rank() == 0);
  CHECK(dtrain::cross_size() == 1);
  CHECK(dtrain::is_homogeneous());
}

TEST_CASE("topology under emulated host layouts") {
  check_layout("one host", [](int, int) { return "node"; });
  check_layout("one host per rank", [](int r, int) { return "node" + std::to_string(r); });
  check_layout("round robin over 2 hosts", [](int r, int) { return "host" + std::to_string(r % 2); });
  check_layout("contiguous halves, the first one larger",
               [](int r, int n) { return r < (n + 1) / 2 ? "a" : "b"; });
  check_layout("hosts whose order differs from world order",
               [](int r, int) { return r == 1 || r == 2 ? "y" : "z"; });
  check_layout("an uneven split with a long host name", [](int r, int n) {
    return r == n - 1 ? std::string(200, 'q') : std::string("rack7-node12.cluster.example");
  });
  check_layout("long host names that differ only at the end", [](int r, int) {
    return std::string(300, 'h') + std::to_string(r % 2);
  });
  dtrain::shutdown();
  dtrain::init();
}
