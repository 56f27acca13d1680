// The host path never blocks inside an MPI data collective (Note [Waiting for data collectives]):
// every collective the engine runs for an op is posted in its nonblocking form and tested. The MPI
// calls are counted through the PMPI profiling interface while ops of every kind run, one piece
// or several in flight (Note [Pieces in flight]), on one emulated host and on two, flat and
// hierarchical; every result is checked against its closed form.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "dtrain/runtime/grouped_collectives.hpp"
#include "engine_test.hpp"

namespace {
std::atomic<bool> recording{false};
std::atomic<std::int64_t> blocking_calls{0};
std::atomic<std::int64_t> nonblocking_calls{0};

void blocking() {
  if (recording.load()) blocking_calls.fetch_add(1);
}
void nonblocking() {
  if (recording.load()) nonblocking_calls.fetch_add(1);
}
}  // namespace

// Blocking data movement: none of these may run while ops execute.
extern "C" int MPI_Allreduce(const void* s, void* r, int c, MPI_Datatype t, MPI_Op o, MPI_Comm m) {
  blocking();
  return PMPI_Allreduce(s, r, c, t, o, m);
}
extern "C" int MPI_Allgather(const void* s, int sc, MPI_Datatype st, void* r, int rc,
                             MPI_Datatype rt, MPI_Comm m) {
  blocking();
  return PMPI_Allgather(s, sc, st, r, rc, rt, m);
}
extern "C" int MPI_Allgatherv(const void* s, int sc, MPI_Datatype st, void* r, const int rc[],
                              const int d[], MPI_Datatype rt, MPI_Comm m) {
  blocking();
  return PMPI_Allgatherv(s, sc, st, r, rc, d, rt, m);
}
extern "C" int MPI_Bcast(void* b, int c, MPI_Datatype t, int root, MPI_Comm m) {
  blocking();
  return PMPI_Bcast(b, c, t, root, m);
}
extern "C" int MPI_Alltoall(const void* s, int sc, MPI_Datatype st, void* r, int rc,
                            MPI_Datatype rt, MPI_Comm m) {
  blocking();
  return PMPI_Alltoall(s, sc, st, r, rc, rt, m);
}
extern "C" int MPI_Alltoallv(const void* s, const int sc[], const int sd[], MPI_Datatype st,
                             void* r, const int rc[], const int rd[], MPI_Datatype rt, MPI_Comm m) {
  blocking();
  return PMPI_Alltoallv(s, sc, sd, st, r, rc, rd, rt, m);
}
extern "C" int MPI_Reduce_scatter(const void* s, void* r, const int c[], MPI_Datatype t, MPI_Op o,
                                  MPI_Comm m) {
  blocking();
  return PMPI_Reduce_scatter(s, r, c, t, o, m);
}
extern "C" int MPI_Reduce(const void* s, void* r, int c, MPI_Datatype t, MPI_Op o, int root,
                          MPI_Comm m) {
  blocking();
  return PMPI_Reduce(s, r, c, t, o, root, m);
}
extern "C" int MPI_Sendrecv(const void* s, int sc, MPI_Datatype st, int dest, int stag, void* r,
                            int rc, MPI_Datatype rt, int src, int rtag, MPI_Comm m,
                            MPI_Status* status) {
  blocking();
  return PMPI_Sendrecv(s, sc, st, dest, stag, r, rc, rt, src, rtag, m, status);
}
extern "C" int MPI_Wait(MPI_Request* q, MPI_Status* status) {
  blocking();
  return PMPI_Wait(q, status);
}
extern "C" int MPI_Waitall(int n, MPI_Request q[], MPI_Status statuses[]) {
  blocking();
  return PMPI_Waitall(n, q, statuses);
}

// The nonblocking forms the host path uses.
extern "C" int MPI_Iallreduce(const void* s, void* r, int c, MPI_Datatype t, MPI_Op o, MPI_Comm m,
                              MPI_Request* q) {
  nonblocking();
  return PMPI_Iallreduce(s, r, c, t, o, m, q);
}
extern "C" int MPI_Iallgather(const void* s, int sc, MPI_Datatype st, void* r, int rc,
                              MPI_Datatype rt, MPI_Comm m, MPI_Request* q) {
  nonblocking();
  return PMPI_Iallgather(s, sc, st, r, rc, rt, m, q);
}
extern "C" int MPI_Iallgatherv(const void* s, int sc, MPI_Datatype st, void* r, const int rc[],
                               const int d[], MPI_Datatype rt, MPI_Comm m, MPI_Request* q) {
  nonblocking();
  return PMPI_Iallgatherv(s, sc, st, r, rc, d, rt, m, q);
}
extern "C" int MPI_Ibcast(void* b, int c, MPI_Datatype t, int root, MPI_Comm m, MPI_Request* q) {
  nonblocking();
  return PMPI_Ibcast(b, c, t, root, m, q);
}
extern "C" int MPI_Ialltoallv(const void* s, const int sc[], const int sd[], MPI_Datatype st,
                              void* r, const int rc[], const int rd[], MPI_Datatype rt, MPI_Comm m,
                              MPI_Request* q) {
  nonblocking();
  return PMPI_Ialltoallv(s, sc, sd, st, r, rc, rd, rt, m, q);
}
extern "C" int MPI_Ireduce_scatter(const void* s, void* r, const int c[], MPI_Datatype t,
                                   MPI_Op o, MPI_Comm m, MPI_Request* q) {
  nonblocking();
  return PMPI_Ireduce_scatter(s, r, c, t, o, m, q);
}

namespace {

using namespace dtrain;
using test::world_rank;
using test::world_size;

// Ops of every kind through the engine, each checked against its closed form.
void run_every_kind() {
  const int rank = world_rank(), size = world_size();
  const float ranks_sum = static_cast<float>(size * (size - 1)) / 2.0f;
  {  // a lone small tensor, Sum: one Iallreduce
    std::vector<float> v(100, static_cast<float>(rank));
    allreduce(v, {.op = ReduceOp::Sum});
    CHECK(v[99] == ranks_sum);
  }
  {  // a lone large tensor, Average: scaled in shards where each rank has a core
    std::vector<float> v(300001, static_cast<float>(rank));
    allreduce(v);
    CHECK(v[300000] == doctest::Approx(ranks_sum / static_cast<float>(size)));
  }
  {  // a fused group: large tensors reduced in their memory, small ones packed
    std::vector<std::vector<float>> g{std::vector<float>(400000, 1.0f), std::vector<float>(7, 2.0f),
                                      std::vector<float>(300000, 3.0f), std::vector<float>(9, 4.0f)};
    grouped_allreduce(g, {.op = ReduceOp::Sum});
    CHECK(g[0][399999] == static_cast<float>(size));
    CHECK(g[1][6] == 2.0f * static_cast<float>(size));
    CHECK(g[2][0] == 3.0f * static_cast<float>(size));
    CHECK(g[3][8] == 4.0f * static_cast<float>(size));
    std::vector<std::vector<float>> a{std::vector<float>(250000, 1.0f), std::vector<float>(5, 1.0f)};
    grouped_allreduce(a);  // Average: the large one scaled in shards, the small one unpacked
    CHECK(a[0][0] == doctest::Approx(1.0f));
    CHECK(a[1][4] == doctest::Approx(1.0f));
  }
  {  // allgather, single and fused
    std::vector<std::int32_t> mine(static_cast<std::size_t>(rank + 1), rank);
    auto all = allgather(mine);
    CHECK(static_cast<int>(all.size()) == size * (size + 1) / 2);
    std::vector<std::vector<std::int32_t>> two{std::vector<std::int32_t>(3, rank),
                                               std::vector<std::int32_t>(2, -rank)};
    auto gathered = grouped_allgather(two);
    CHECK(static_cast<int>(gathered[0].size()) == 3 * size);
    CHECK(gathered[1].back() == -(size - 1));
  }
  {  // broadcast
    std::vector<double> b(1000, rank == size - 1 ? 7.0 : 0.0);
    broadcast(b, size - 1);
    CHECK(b[999] == 7.0);
  }
  {  // alltoall: one row to every rank
    std::vector<std::int64_t> rows(static_cast<std::size_t>(size), rank);
    auto [received, splits] = alltoall(rows, std::vector<int>(static_cast<std::size_t>(size), 1));
    std::vector<std::int64_t> expected(static_cast<std::size_t>(size));
    std::iota(expected.begin(), expected.end(), 0);
    CHECK(received == expected);
  }
  {  // reducescatter
    std::vector<float> v(static_cast<std::size_t>(3 * size), 1.0f);
    auto mine = reducescatter(v, ReduceOp::Sum);
    CHECK(mine.size() == 3);
    CHECK(mine[0] == static_cast<float>(size));
  }
}

void check_no_blocking_call(Config config, const std::string& what) {
  CAPTURE(what);
  config.mpi_nonblocking = true;  // DTRAIN_MPI_NONBLOCKING=1
  test::Initialized dt(config);
  run_every_kind();  // warm up: the first use of a communicator may set things up
  blocking_calls = 0;
  nonblocking_calls = 0;
  recording = true;
  run_every_kind();
  recording = false;
  CHECK(blocking_calls.load() == 0);
  if (world_size() > 1) CHECK(nonblocking_calls.load() > 0);
}

}  // namespace

TEST_CASE("every data collective is posted nonblocking: one host, two hosts, hierarchical") {
  Config one_host = Config::from_env();
  check_no_blocking_call(one_host, "one host");

  Config two_hosts = Config::from_env();  // waits with sleeps: the group spans hosts
  two_hosts.host_id = fmt::format("emulated-{}", world_rank() % 2);
  check_no_blocking_call(two_hosts, "two hosts");

  Config hierarchical = two_hosts;
  hierarchical.hierarchical_allreduce = true;
  check_no_blocking_call(hierarchical, "two hosts, hierarchical");
}

TEST_CASE("DTRAIN_MPI_NONBLOCKING=0: allreduce pieces are MPI's blocking calls, same results") {
  if (world_size() < 2) return;
  for (const bool two_hosts : {false, true}) {
    Config c = Config::from_env();
    c.mpi_nonblocking = false;
    if (two_hosts) c.host_id = fmt::format("emulated-{}", world_rank() % 2);
    CAPTURE(two_hosts);
    test::Initialized dt(c);
    run_every_kind();
    blocking_calls = 0;
    recording = true;
    run_every_kind();  // checks every result against its closed form
    std::vector<float> average(300007, static_cast<float>(world_rank()));  // a ring piece
    allreduce(average, {.op = ReduceOp::Average});
    recording = false;
    CHECK(average.front() == doctest::Approx((world_size() - 1) / 2.0).epsilon(1e-6));
    CHECK(blocking_calls.load() > 0);
  }
}

TEST_CASE("pieces in flight: small pieces, one to several at once, the same results") {
  for (int in_flight : {1, 3, 16}) {
    Config c = Config::from_env();
    c.mpi_chunk_bytes = 64 << 10;  // many pieces per tensor and per fused batch
    c.mpi_pieces_in_flight = in_flight;
    c.host_id = fmt::format("emulated-{}", world_rank() % 2);
    check_no_blocking_call(c, fmt::format("{} pieces in flight", in_flight));
  }
}

TEST_CASE("the engine thread's CPU time is counted, and an idle engine uses little of it") {
  test::Initialized dt;
  const auto cpu_ns = [] { return engine_stats().engine_cpu_ns; };
  using Clock = std::chrono::steady_clock;
  const std::uint64_t at_start = cpu_ns();
  const auto wall_start = Clock::now();
  for (int i = 0; i < 40; ++i) {
    std::vector<float> v(1 << 18, 1.0f);
    allreduce(v, {.op = ReduceOp::Sum});
    REQUIRE(v[0] == static_cast<float>(world_size()));
  }
  const std::uint64_t after_ops = cpu_ns();
  const double wall_ns =
      static_cast<double>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                              Clock::now() - wall_start)
                              .count());
  CHECK(after_ops > at_start);  // the counter moves
  // One thread cannot use more than one core: a reading of another clock would.
  CHECK(static_cast<double>(after_ops - at_start) <= 1.05 * wall_ns + 5e6);

  // With nothing to do the engine sleeps between negotiation cycles (Note [Waiting without
  // burning cores]): far below a core.
  barrier();
  const std::uint64_t idle_start = cpu_ns();
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const std::uint64_t idle_ns = cpu_ns() - idle_start;
  INFO("idle engine CPU: ", static_cast<double>(idle_ns) / 1e6, " ms in 500 ms");
  CHECK(idle_ns < 125'000'000u);
}
