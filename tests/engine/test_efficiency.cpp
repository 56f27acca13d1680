// Efficiency properties that can be asserted without timing: bursts fuse, steady-state
// negotiation goes through the response cache, and chunked execution (pieces never larger than
// DTRAIN_MPI_CHUNK_BYTES, with or without the packing pipeline) gives the same results.
#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "engine_test.hpp"

// ---- MPI profiling-interface wrappers: record the largest message handed to MPI ---------------
// Defined in this executable, they take precedence over the MPI library's MPI_Iallreduce/MPI_Ibcast
// (the host path's forms: Note [Waiting for data collectives]) and forward to the PMPI entry
// points, so the engine runs the real collectives.
namespace {
std::atomic<bool> recording{false};
std::atomic<std::int64_t> max_allreduce_bytes{0};
std::atomic<std::int64_t> max_bcast_bytes{0};
std::atomic<std::int64_t> allreduce_calls{0};

void record(std::atomic<std::int64_t>& max, int count, MPI_Datatype type) {
  if (!recording.load()) return;
  int size = 0;
  PMPI_Type_size(type, &size);
  const std::int64_t bytes = static_cast<std::int64_t>(count) * size;
  std::int64_t cur = max.load();
  while (bytes > cur && !max.compare_exchange_weak(cur, bytes)) {
  }
}
}  // namespace

extern "C" int MPI_Iallreduce(const void* send, void* recv, int count, MPI_Datatype type,
                              MPI_Op op, MPI_Comm comm, MPI_Request* request) {
  record(max_allreduce_bytes, count, type);
  if (recording.load()) allreduce_calls.fetch_add(1);
  return PMPI_Iallreduce(send, recv, count, type, op, comm, request);
}
// DTRAIN_MPI_NONBLOCKING=0 (the default) posts allreduce pieces as the blocking call.
extern "C" int MPI_Allreduce(const void* send, void* recv, int count, MPI_Datatype type, MPI_Op op,
                             MPI_Comm comm) {
  record(max_allreduce_bytes, count, type);
  if (recording.load()) allreduce_calls.fetch_add(1);
  return PMPI_Allreduce(send, recv, count, type, op, comm);
}
extern "C" int MPI_Ibcast(void* buf, int count, MPI_Datatype type, int root, MPI_Comm comm,
                          MPI_Request* request) {
  record(max_bcast_bytes, count, type);
  return PMPI_Ibcast(buf, count, type, root, comm, request);
}

namespace {

using namespace dtrain;
using test::Buffer;

}  // namespace

TEST_CASE("a burst of tensors is fused into fewer collectives than tensors") {
  test::Initialized dt;
  const int rank = dtrain::rank(), size = dtrain::size();
  constexpr int count = 64;
  std::vector<std::vector<float>> grads(count, std::vector<float>(256, rank + 1.0f));
  const auto before = engine_stats();
  std::vector<Handle> hs(count);
  // Rank 0 submits in reverse, the others in order, as backward passes do not promise an order.
  for (int k = 0; k < count; ++k) {
    const int t = rank == 0 ? count - 1 - k : k;
    hs[t] = allreduce_async(grads[t], {.op = ReduceOp::Sum, .name = fmt::format("burst.{}", t)});
  }
  for (auto& h : hs) h.wait();
  const auto after = engine_stats();
  for (const auto& g : grads) CHECK(g == std::vector<float>(256, size * (size + 1) / 2.0f));
  const auto collectives = after.collectives - before.collectives;
  CAPTURE(collectives);
  CHECK(collectives < count);
  CHECK(after.fused_collectives > before.fused_collectives);
  if (rank == 0) CHECK(after.fused_tensors > before.fused_tensors);
}

TEST_CASE("engine counters: payload bytes by kind, fused bytes, negotiation and collective time") {
  test::Initialized dt;
  const int rank = dtrain::rank(), size = dtrain::size();
  std::vector<float> a(1000, 1.0f), b(24, 1.0f);
  std::vector<double> c(10, 2.0);
  const auto before = engine_stats();
  auto ha = allreduce_async(a, {.op = ReduceOp::Sum, .name = "counted.a"});
  auto hb = allreduce_async(b, {.op = ReduceOp::Sum, .name = "counted.b"});
  ha.wait();
  hb.wait();
  broadcast(c, 0, "counted.c");
  std::vector<std::int32_t> rows(3 * (rank + 1), rank);
  auto gathered = allgather(rows, "counted.rows");
  const auto after = engine_stats();
  CHECK(after.allreduce_bytes - before.allreduce_bytes == (1000 + 24) * sizeof(float));
  CHECK(after.broadcast_bytes - before.broadcast_bytes == 10 * sizeof(double));
  CHECK(after.allgather_bytes - before.allgather_bytes == rows.size() * sizeof(std::int32_t));
  CHECK(after.alltoall_bytes == before.alltoall_bytes);
  // Fused or not, depending on when each rank's submissions arrived: consistent either way.
  const auto fused_tensors = after.fused_tensors_executed - before.fused_tensors_executed;
  const auto fused_bytes = after.fused_bytes - before.fused_bytes;
  CHECK((fused_tensors == 0 || fused_tensors == 2));
  CHECK(fused_bytes == (fused_tensors == 2 ? (1000 + 24) * sizeof(float) : 0));
  CHECK(after.negotiation_ns > before.negotiation_ns);
  CHECK(after.collective_ns > before.collective_ns);
  if (rank == 0 && size > 1) CHECK(after.wait_for_slowest_ns >= before.wait_for_slowest_ns);
}

TEST_CASE("DTRAIN_LOG_LEVEL=debug leaves a trail of every submission and response") {
  test::Initialized dt;
  const int rank = dtrain::rank();
  std::vector<std::string> lines;
  std::mutex lines_mutex;
  const auto level = dtrain::log_level();
  detail::set_log_sink([&](std::string_view line) {
    std::lock_guard lock(lines_mutex);
    lines.emplace_back(line);
  });
  dtrain::set_log_level(LogLevel::debug);
  std::vector<float> v(6, 1.0f);
  allreduce(v, {.op = ReduceOp::Max, .name = "trail.x"});
  dtrain::set_log_level(level);
  detail::set_log_sink({});
  auto has = [&](std::string_view fragment) {
    for (const auto& l : lines)
      if (l.find(fragment) != std::string::npos) return true;
    return false;
  };
  CHECK(has(fmt::format("rank {} submits allreduce 'trail.x': float32 [6] on cpu, Max", rank)));
  CHECK(has(fmt::format("rank {} runs allreduce of 1 tensor(s) [trail.x]: 6 elements of float32", rank)));
}

TEST_CASE("with fusion disabled every tensor is its own collective") {
  Config c = Config::from_env();
  c.fusion_threshold_bytes = 0;
  test::Initialized dt(c);
  constexpr int count = 16;
  std::vector<std::vector<float>> grads(count, std::vector<float>(8, 1.0f));
  std::vector<Handle> hs;
  const auto before = engine_stats();
  for (int t = 0; t < count; ++t)
    hs.push_back(allreduce_async(grads[t], {.op = ReduceOp::Sum, .name = fmt::format("nofuse.{}", t)}));
  for (auto& h : hs) h.wait();
  const auto after = engine_stats();
  CHECK(after.collectives - before.collectives == count);
  CHECK(after.fused_collectives == before.fused_collectives);
  for (const auto& g : grads) CHECK(g == std::vector<float>(8, static_cast<float>(dtrain::size())));
}

TEST_CASE("in steady state every request travels as a response-cache id") {
  test::Initialized dt;
  const int size = dtrain::size();
  constexpr int count = 20;
  std::vector<std::vector<float>> grads(count, std::vector<float>(32, 1.0f));
  auto step = [&] {
    std::vector<Handle> hs;
    for (int t = 0; t < count; ++t)
      hs.push_back(allreduce_async(grads[t], {.op = ReduceOp::Sum, .name = fmt::format("cache.{}", t)}));
    for (auto& h : hs) h.wait();
  };
  auto s0 = engine_stats();
  step();
  auto s1 = engine_stats();
  CHECK(s1.requests_sent - s0.requests_sent == count);
  CHECK(s1.cache_ids_sent - s0.cache_ids_sent == 0);  // first time: full descriptions
  for (int k = 0; k < 3; ++k) {
    CAPTURE(k);
    const auto a = engine_stats();
    step();
    const auto b = engine_stats();
    CHECK(b.requests_sent - a.requests_sent == count);
    CHECK(b.cache_ids_sent - a.cache_ids_sent == count);
    if (dtrain::rank() == 0) CHECK(b.cache_hits - a.cache_hits == static_cast<std::uint64_t>(count * size));
  }
  for (const auto& g : grads) CHECK(g[0] == static_cast<float>(1.0 * std::pow(size, 4)));

  // A tensor whose shape changed is described in full again, and still reduced correctly.
  std::vector<float> wider(64, 1.0f);
  const auto a = engine_stats();
  allreduce(wider, {.op = ReduceOp::Sum, .name = "cache.0"});
  const auto b = engine_stats();
  CHECK(b.cache_ids_sent == a.cache_ids_sent);
  CHECK(wider == std::vector<float>(64, static_cast<float>(size)));
}

TEST_CASE("with the cache disabled nothing travels as an id") {
  Config c = Config::from_env();
  c.cache_capacity = 0;
  test::Initialized dt(c);
  std::vector<float> v(4, 1.0f);
  for (int k = 0; k < 3; ++k) allreduce(v, {.op = ReduceOp::Sum, .name = "nocache"});
  CHECK(engine_stats().cache_ids_sent == 0);
  CHECK(engine_stats().requests_sent == 3);
}

namespace {

// Values that sum exactly in every float type and over up to 4 ranks.
double chunk_value(int rank, int tensor, std::int64_t i) {
  return (rank + 1) * ((i * 7 + tensor) % 101) / 8.0;
}

struct ChunkRun {
  std::vector<Buffer> results;
  std::int64_t max_allreduce = 0;
  std::int64_t max_bcast = 0;
};

// Lone tensors and fused groups whose sizes sit on and around piece boundaries of 4096-byte
// pieces (1024 float32, 512 float64, 2048 float16 elements), plus a broadcast.
ChunkRun run_chunk_workload(const Config& c) {
  test::Initialized dt(c);
  const int rank = dtrain::rank();
  ChunkRun out;
  int tag = 0;
  auto make = [&](DataType dtype, std::int64_t n) {
    Buffer b(dtype, n);
    for (std::int64_t i = 0; i < n; ++i) b.set(i, chunk_value(rank, tag, i));
    ++tag;
    return b;
  };
  std::vector<Buffer> lone;
  for (std::int64_t n : {1, 1023, 1024, 1025, 2047, 2048, 2049, 5000}) lone.push_back(make(DataType::float32, n));
  for (std::int64_t n : {511, 512, 513}) lone.push_back(make(DataType::float64, n));
  struct Group {
    DataType dtype;
    std::vector<std::int64_t> sizes;
    AllreduceOptions opts;
  };
  std::vector<Group> groups = {
      {DataType::float32, {1023, 1, 1024, 1025, 3, 2048, 777}, {.op = ReduceOp::Sum, .prescale = 0.5, .postscale = 4}},
      {DataType::float32, {1, 1, 2046, 1}, {.op = ReduceOp::Average}},
      {DataType::float64, {511, 2, 512, 1000}, {.op = ReduceOp::Sum}},
      {DataType::float16, {2047, 2, 3000}, {.op = ReduceOp::Sum, .postscale = 0.5}},
      {DataType::bfloat16, {2048, 2048, 1}, {.op = ReduceOp::Max}},
      // Tensors of 1 MiB and more, reduced in place where each rank has a core (Note [Direct
      // segments]), between small ones that are packed.
      {DataType::float32, {5, 300000, 7, 262144, 1}, {.op = ReduceOp::Sum, .prescale = 0.5, .postscale = 4}},
  };
  std::vector<std::vector<Buffer>> grouped;
  for (const auto& g : groups) {
    std::vector<Buffer> members;
    for (auto n : g.sizes) members.push_back(make(g.dtype, n));
    grouped.push_back(std::move(members));
  }
  Buffer bcast = make(DataType::float32, 3000);

  max_allreduce_bytes = 0;
  max_bcast_bytes = 0;
  recording = true;
  for (std::size_t k = 0; k < lone.size(); ++k) {
    auto v = lone[k].view();
    allreduce(v, {.op = ReduceOp::Sum, .name = fmt::format("lone.{}", k)});
  }
  for (std::size_t g = 0; g < groups.size(); ++g) {
    std::vector<TensorView> views;
    for (auto& b : grouped[g]) views.push_back(b.view());
    AllreduceOptions o = groups[g].opts;
    o.name = fmt::format("group.{}", g);
    grouped_allreduce(views, o);
  }
  auto bv = bcast.view();
  broadcast(bv, 0, "chunk.bcast");
  recording = false;
  out.max_allreduce = max_allreduce_bytes;
  out.max_bcast = max_bcast_bytes;

  out.results = std::move(lone);
  for (auto& g : grouped)
    for (auto& b : g) out.results.push_back(std::move(b));
  out.results.push_back(std::move(bcast));
  return out;
}

}  // namespace

TEST_CASE("chunked execution: pieces never exceed the chunk size, and results do not depend on it") {
  const int size = test::world_size();
  Config defaults = Config::from_env();
  const ChunkRun reference = run_chunk_workload(defaults);
  CHECK(reference.max_allreduce <= defaults.mpi_chunk_bytes);

  // The reference itself is right: spot-check the exact sums of the lone tensors.
  for (std::size_t k = 0; k < 8; ++k) {
    const Buffer& b = reference.results[k];
    for (std::int64_t i = 0; i < b.size(); i += 97)
      REQUIRE(b.get(i) == (i * 7 + static_cast<std::int64_t>(k)) % 101 / 8.0 * size * (size + 1) / 2);
  }
  // The group with tensors of 1 MiB and more (the last group): 4 * sum over ranks of 0.5 * value.
  {
    const std::size_t first = 11 + 7 + 4 + 4 + 3 + 3;  // lone tensors, then the earlier groups
    for (std::size_t k = first; k < first + 5; ++k) {
      const Buffer& b = reference.results[k];
      for (std::int64_t i = 0; i < b.size(); i += 89)
        REQUIRE(b.get(i) == (i * 7 + static_cast<std::int64_t>(k)) % 101 / 8.0 * size * (size + 1));
    }
  }
  // ...and the broadcast delivered rank 0's values.
  const Buffer& bc = reference.results.back();
  for (std::int64_t i = 0; i < bc.size(); i += 101)
    REQUIRE(bc.get(i) == chunk_value(0, static_cast<int>(reference.results.size()) - 1, i));

  for (bool pipeline : {true, false}) {
    CAPTURE(pipeline);
    Config c = defaults;
    c.mpi_chunk_bytes = 4096;
    c.fusion_pipeline = pipeline;
    const ChunkRun run = run_chunk_workload(c);
    CHECK(run.max_allreduce > 0);
    CHECK(run.max_allreduce <= 4096);
    CHECK(run.max_bcast <= 4096);
    REQUIRE(run.results.size() == reference.results.size());
    for (std::size_t k = 0; k < run.results.size(); ++k) {
      CAPTURE(k);
      CHECK(run.results[k].bytes() == reference.results[k].bytes());
    }
  }
}
