// DTRAIN_CPU_OPERATIONS=gloo (Note [Gloo on the host path] in comm/gloo_group.hpp): host tensors
// go over Gloo, not MPI, with the same results; bad Gloo settings fail init on every rank; auto
// stays on MPI within one machine (Note [Choosing the host library]). Which
// library moved the data is checked through the PMPI profiling interface: with gloo, no MPI call
// carries float elements while the collectives run (negotiation moves bytes only).
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "dtrain/runtime/engine/host_library.hpp"
#include "mpi_test_util.hpp"

namespace {

std::atomic<std::int64_t> float_calls{0};

void count(MPI_Datatype type) {
  if (type == MPI_FLOAT) float_calls.fetch_add(1);
}

}  // namespace

// Every collective dtrain's host path may post for a float tensor.
extern "C" {
int MPI_Allreduce(const void* s, void* r, int n, MPI_Datatype t, MPI_Op op, MPI_Comm c) {
  count(t);
  return PMPI_Allreduce(s, r, n, t, op, c);
}
int MPI_Iallreduce(const void* s, void* r, int n, MPI_Datatype t, MPI_Op op, MPI_Comm c,
                   MPI_Request* q) {
  count(t);
  return PMPI_Iallreduce(s, r, n, t, op, c, q);
}
int MPI_Ireduce_scatter(const void* s, void* r, const int n[], MPI_Datatype t, MPI_Op op,
                        MPI_Comm c, MPI_Request* q) {
  count(t);
  return PMPI_Ireduce_scatter(s, r, n, t, op, c, q);
}
int MPI_Ireduce_scatter_block(const void* s, void* r, int n, MPI_Datatype t, MPI_Op op, MPI_Comm c,
                              MPI_Request* q) {
  count(t);
  return PMPI_Ireduce_scatter_block(s, r, n, t, op, c, q);
}
int MPI_Iallgather(const void* s, int sn, MPI_Datatype st, void* r, int rn, MPI_Datatype rt,
                   MPI_Comm c, MPI_Request* q) {
  count(st);
  return PMPI_Iallgather(s, sn, st, r, rn, rt, c, q);
}
int MPI_Iallgatherv(const void* s, int sn, MPI_Datatype st, void* r, const int rn[],
                    const int d[], MPI_Datatype rt, MPI_Comm c, MPI_Request* q) {
  count(rt);
  return PMPI_Iallgatherv(s, sn, st, r, rn, d, rt, c, q);
}
int MPI_Ibcast(void* b, int n, MPI_Datatype t, int root, MPI_Comm c, MPI_Request* q) {
  count(t);
  return PMPI_Ibcast(b, n, t, root, c, q);
}
int MPI_Ialltoallv(const void* s, const int sn[], const int sd[], MPI_Datatype st, void* r,
                   const int rn[], const int rd[], MPI_Datatype rt, MPI_Comm c, MPI_Request* q) {
  count(st);
  return PMPI_Ialltoallv(s, sn, sd, st, r, rn, rd, rt, c, q);
}
int MPI_Isend(const void* b, int n, MPI_Datatype t, int d, int tag, MPI_Comm c, MPI_Request* q) {
  count(t);
  return PMPI_Isend(b, n, t, d, tag, c, q);
}
}

namespace {

using namespace dtrain_test;

// Runs every host collective on float tensors (fused and lone allreduces, a process set) and
// checks each against its closed form.
void run_collectives() {
  const int rank = world_rank(), size = world_size();
  const float r = static_cast<float>(rank);
  const float rank_sum = static_cast<float>(size * (size - 1)) / 2;

  std::vector<float> big(1000003, r + 1);  // odd, several Gloo segments
  dtrain::allreduce(big, {.op = dtrain::ReduceOp::Sum, .name = "gloo.big"});
  CHECK(std::count(big.begin(), big.end(), rank_sum + size) == static_cast<long>(big.size()));

  std::vector<std::vector<float>> grads(5);
  std::vector<dtrain::Handle> handles;
  for (std::size_t i = 0; i < grads.size(); ++i) {
    grads[i].assign(100 + 37 * i, r * static_cast<float>(i));
    handles.push_back(dtrain::allreduce_async(
        grads[i], {.op = dtrain::ReduceOp::Average, .name = "gloo.grad." + std::to_string(i)}));
  }
  for (auto& h : handles) h.wait();
  for (std::size_t i = 0; i < grads.size(); ++i)
    CHECK(grads[i] == std::vector<float>(grads[i].size(), rank_sum * static_cast<float>(i) / size));

  std::vector<float> maxed{r, -r};
  dtrain::allreduce(maxed, {.op = dtrain::ReduceOp::Max, .name = "gloo.max"});
  CHECK(maxed == std::vector<float>{static_cast<float>(size - 1), 0.0f});

  std::vector<float> rows(static_cast<std::size_t>(2 * (rank + 1)), r);  // rank + 1 rows of 2
  const auto gathered = dtrain::allgather(rows, {.name = "gloo.gather"});
  std::vector<float> expected;
  for (int k = 0; k < size; ++k) expected.insert(expected.end(), 2 * (k + 1), static_cast<float>(k));
  CHECK(gathered == expected);

  std::vector<float> b(1001, r);
  dtrain::broadcast(b, size - 1, {.name = "gloo.bcast"});
  CHECK(b == std::vector<float>(1001, static_cast<float>(size - 1)));

  // Rank r sends k + 1 rows of one element to rank k, valued 100 r + k.
  std::vector<float> send;
  std::vector<int> splits;
  for (int k = 0; k < size; ++k) {
    splits.push_back(k + 1);
    send.insert(send.end(), k + 1, static_cast<float>(100 * rank + k));
  }
  const auto swapped = dtrain::alltoall(send, splits, {.name = "gloo.alltoall"});
  std::vector<float> want;
  for (int k = 0; k < size; ++k) want.insert(want.end(), rank + 1, static_cast<float>(100 * k + rank));
  CHECK(swapped.output == want);

  std::vector<float> full(static_cast<std::size_t>(3 * size + 1), r + 1);
  const auto mine = dtrain::reducescatter(full, {.op = dtrain::ReduceOp::Sum, .name = "gloo.rs"});
  const std::size_t my_rows = 3 + (rank == 0 ? 1 : 0);
  CHECK(mine == std::vector<float>(my_rows, rank_sum + size));
  // Fewer rows than ranks: the ring passes empty blocks on (Note [Gloo reduce-scatter]).
  const std::vector<float> one_row{r + 1};
  const auto first = dtrain::reducescatter(one_row, {.op = dtrain::ReduceOp::Sum, .name = "gloo.rs1"});
  CHECK(first == (rank == 0 ? std::vector<float>{rank_sum + size} : std::vector<float>{}));
  // Each element's maximum is on another rank: element i is i + 100 on rank i % size, i elsewhere.
  std::vector<double> spread(static_cast<std::size_t>(2 * size + 1));
  for (std::size_t i = 0; i < spread.size(); ++i)
    spread[i] = static_cast<double>(i) + (static_cast<int>(i) % size == rank ? 100.0 : 0.0);
  const auto maxima = dtrain::reducescatter(spread, {.op = dtrain::ReduceOp::Max, .name = "gloo.rsmax"});
  const std::size_t begin = static_cast<std::size_t>(2 * rank + (rank > 0 ? 1 : 0));
  std::vector<double> want_max;
  for (std::size_t i = begin; i < begin + 2 + (rank == 0 ? 1 : 0); ++i)
    want_max.push_back(static_cast<double>(i) + 100.0);
  CHECK(maxima == want_max);

  if (size >= 3) {  // a process set connects its own Gloo ranks
    const dtrain::ProcessSet odd = dtrain::add_process_set({1, 2});
    if (rank == 1 || rank == 2) {
      std::vector<float> v(5, r);
      dtrain::allreduce(v, {.op = dtrain::ReduceOp::Sum, .name = "gloo.set", .process_set = odd});
      CHECK(v == std::vector<float>(5, 3.0f));
    }
  }
}

// The collectives with host tensors over `cpu_operations`: the float MPI calls they posted.
// `host_id`: DTRAIN_HOST_ID for this rank (empty: the real host).
std::int64_t float_calls_of_collectives(const std::string& cpu_operations,
                                        const std::string& host_id = {}) {
  dtrain::shutdown();
  dtrain::Config config = dtrain::Config::from_env();
  config.cpu_operations = cpu_operations;
  config.host_id = host_id;
  dtrain::init(config);
  const std::int64_t before = float_calls.load();
  run_collectives();
  const bool over_gloo = dtrain::engine_stats().gloo_collectives > 0;
  if (world_size() > 1) CHECK(over_gloo == (cpu_operations == "gloo"));
  dtrain::shutdown();
  return float_calls.load() - before;
}

}  // namespace

TEST_CASE("with DTRAIN_CPU_OPERATIONS=gloo every host collective is right and MPI carries none") {
  CHECK(float_calls_of_collectives("gloo") == 0);
}

TEST_CASE("the same collectives over MPI do post float MPI calls (the counter sees them)") {
  const std::int64_t calls = float_calls_of_collectives("mpi");
  if (world_size() > 1) CHECK(calls > 0);
}

TEST_CASE("auto, the default, keeps host tensors on MPI within one machine, emulated hosts too") {
  CHECK(dtrain::Config{}.cpu_operations == "auto");
  // Note [Choosing the host library]: every rank a host of its own, all on this machine.
  const std::int64_t calls =
      float_calls_of_collectives("auto", "emulated-" + std::to_string(world_rank()));
  if (world_size() > 1) CHECK(calls > 0);
}

TEST_CASE("auto's choice: Gloo across machines, MPI otherwise; only gloo requires it") {
  using dtrain::detail::choose_host_library;
  dtrain::HostPathSettings s;
  CHECK(s.cpu_operations == "auto");
  const auto across = choose_host_library(s, 2, true);
  CHECK(across.gloo);
  CHECK_FALSE(across.required);
  CHECK(across.why.find("spans 2 machines") != std::string::npos);
  CHECK_FALSE(choose_host_library(s, 1, true).gloo);
  CHECK_FALSE(choose_host_library(s, 3, false).gloo);
  s.hierarchical_allreduce = true;
  CHECK_FALSE(choose_host_library(s, 2, true).gloo);
  s.cpu_operations = "gloo";
  CHECK(choose_host_library(s, 1, true).gloo);
  CHECK(choose_host_library(s, 1, true).required);
  s.cpu_operations = "mpi";
  CHECK_FALSE(choose_host_library(s, 4, true).gloo);
}

TEST_CASE("a Gloo interface that does not exist fails init on every rank, naming it") {
  dtrain::shutdown();
  dtrain::Config config = dtrain::Config::from_env();
  config.cpu_operations = "gloo";
  // Only the last rank names a missing interface: every rank must still fail.
  if (world_rank() == world_size() - 1) config.gloo_iface = "dtrain-none0";
  try {
    dtrain::init(config);
    FAIL_CHECK("init() accepted DTRAIN_GLOO_IFACE=dtrain-none0");
  } catch (const dtrain::Error& e) {
    const std::string what = e.what();
    INFO(what);
    CHECK(what.find("dtrain-none0") != std::string::npos);
    CHECK(what.find("DTRAIN_GLOO_IFACE") != std::string::npos);
    CHECK(what.find("rank " + std::to_string(world_size() - 1)) != std::string::npos);
  }
  CHECK_FALSE(dtrain::is_initialized());
  dtrain::init();  // and the process can initialize again
  CHECK(dtrain::is_initialized());
}

TEST_CASE("ranks that disagree on DTRAIN_CPU_OPERATIONS fail init on every rank") {
  if (world_size() < 2) return;
  dtrain::shutdown();
  dtrain::Config config = dtrain::Config::from_env();
  config.cpu_operations = world_rank() == 0 ? "gloo" : "mpi";
  try {
    dtrain::init(config);
    FAIL_CHECK("init() accepted ranks that disagree on cpu_operations");
  } catch (const dtrain::Error& e) {
    const std::string what = e.what();
    INFO(what);
    CHECK(what.find("CPU_OPERATIONS") != std::string::npos);
  }
  CHECK_FALSE(dtrain::is_initialized());
}
