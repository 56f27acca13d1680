// Average, prescale and postscale at the price of Sum (Note [Scaled allreduce]): a large scaled
// allreduce is a ring reduce-scatter whose last addition also scales, and an allgather. Checked
// against plain MPI (MPI_SUM in double, then a scaling loop) and against closed forms, for lone
// tensors, fused groups and the hierarchical path, at sizes that do not divide by the rank count;
// and checked to take that road (the MPI calls are counted through the PMPI profiling interface).
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "dtrain/comm/pieces_in_flight.hpp"
#include "dtrain/runtime/execution/fusion_pipeline.hpp"
#include "dtrain/tensor/traits.hpp"
#include "mpi_test_util.hpp"

namespace {

std::atomic<std::int64_t> reduce_scatter_calls{0};  // sharded chunks: one allgather each
std::atomic<std::int64_t> allreduce_calls{0};

}  // namespace

// Counted on every communicator (the engine's data communicator included), then forwarded. The
// host path posts nonblocking collectives only (Note [Waiting for data collectives]).
extern "C" int MPI_Iallgatherv(const void* send, int count, MPI_Datatype send_type, void* recv,
                               const int counts[], const int displs[], MPI_Datatype recv_type,
                               MPI_Comm comm, MPI_Request* request) {
  reduce_scatter_calls.fetch_add(1);
  return PMPI_Iallgatherv(send, count, send_type, recv, counts, displs, recv_type, comm, request);
}
// DTRAIN_MPI_NONBLOCKING=0 (the default) posts the same pieces as the blocking calls.
extern "C" int MPI_Allgatherv(const void* send, int count, MPI_Datatype send_type, void* recv,
                              const int counts[], const int displs[], MPI_Datatype recv_type,
                              MPI_Comm comm) {
  reduce_scatter_calls.fetch_add(1);
  return PMPI_Allgatherv(send, count, send_type, recv, counts, displs, recv_type, comm);
}
extern "C" int MPI_Allreduce(const void* send, void* recv, int count, MPI_Datatype type,
                             MPI_Op op, MPI_Comm comm) {
  allreduce_calls.fetch_add(1);
  return PMPI_Allreduce(send, recv, count, type, op, comm);
}
extern "C" int MPI_Iallreduce(const void* send, void* recv, int count, MPI_Datatype type,
                              MPI_Op op, MPI_Comm comm, MPI_Request* request) {
  allreduce_calls.fetch_add(1);
  return PMPI_Iallreduce(send, recv, count, type, op, comm, request);
}

namespace {

using dtrain::DataType;
using dtrain::ReduceOp;
using namespace dtrain_test;

// Inexact values in [-1, 1), different on every rank and element.
double input(int rank, std::int64_t i) {
  std::uint64_t x = (static_cast<std::uint64_t>(rank) << 40) ^ static_cast<std::uint64_t>(i);
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return static_cast<double>(x >> 11) * 0x1.0p-53 * 2.0 - 1.0;
}

struct Reference {
  std::vector<double> value, magnitude;  // sum over ranks (times factor), sum of |x| over ranks
};

// Plain MPI: the inputs as T would round them, summed in double, then a scaling loop.
template <class T>
Reference reference_sum(const std::vector<T>& data, double factor) {
  Reference r;
  r.value.resize(data.size());
  r.magnitude.resize(data.size());
  for (std::size_t i = 0; i < data.size(); ++i) {
    r.value[i] = to_double(data[i]);
    r.magnitude[i] = std::abs(r.value[i]);
  }
  const int n = static_cast<int>(data.size());
  PMPI_Allreduce(MPI_IN_PLACE, r.value.data(), n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  PMPI_Allreduce(MPI_IN_PLACE, r.magnitude.data(), n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  for (auto& v : r.value) v *= factor;
  return r;
}

// The spacing of T's subnormals: below the normal range rounding errors are absolute.
template <class T>
double subnormal_step() {
  if constexpr (std::is_same_v<T, dtrain::float16_t>) return std::ldexp(1.0, -24);
  else if constexpr (std::is_same_v<T, dtrain::bfloat16_t>) return std::ldexp(1.0, -133);
  else return static_cast<double>(std::numeric_limits<T>::denorm_min());
}

// Within the rounding of one addition per rank, the scaling and the final rounding, in T.
template <class T>
void check_against(const std::vector<T>& got, const Reference& ref, double factor,
                   const std::string& what) {
  const int size = world_size();
  std::int64_t bad = 0, first = -1;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double bound = tolerance<T>(size + 2) * std::abs(factor) * ref.magnitude[i] +
                         (size + 2) * subnormal_step<T>();
    if (!(std::abs(to_double(got[i]) - ref.value[i]) <= bound)) {
      if (first < 0) first = static_cast<std::int64_t>(i);
      ++bad;
    }
  }
  CHECK_MESSAGE(bad == 0, fmt::format("rank {}: {}: {} of {} elements differ from MPI_SUM then "
                                      "scaling; first at [{}]: got {}, reference {}",
                                      world_rank(), what, bad, got.size(), first,
                                      first < 0 ? 0.0 : to_double(got[first]),
                                      first < 0 ? 0.0 : ref.value[first]));
  CHECK(same_on_all_ranks(got.data(), got.size() * sizeof(T)));
}

template <class T>
std::vector<T> inputs(std::int64_t n, int salt = 0) {
  std::vector<T> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) v[i] = from_double<T>(input(world_rank() + 8 * salt, i));
  return v;
}

// The kernel itself, on a communicator of its own, with `chunk` elements per MPI call.
template <class T>
void kernel_case(std::int64_t n, double factor, std::int64_t chunk, int in_flight = 1) {
  const DataType dtype = dtrain::dtype_of<T>;
  MPI_Comm comm;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  std::vector<T> data = inputs<T>(n);
  const Reference ref = reference_sum(data, factor);
  dtrain::detail::PiecesInFlight pieces;
  const std::int64_t rs_before = reduce_scatter_calls.load();
  dtrain::detail::host_allreduce_scaled(data.data(), n, dtype, ReduceOp::Sum, factor, comm, chunk,
                                        pieces, dtrain::detail::RequestWait::hot(), in_flight);
  const std::int64_t rs_calls = reduce_scatter_calls.load() - rs_before;
  MPI_Comm_free(&comm);
  const std::string what = fmt::format("{} elements of {}, factor {}, {} per call, {} in flight",
                                       n, dtrain::to_string(dtype), factor, chunk, in_flight);
  check_against(data, ref, factor, what);

  const int size = world_size();
  const bool sharded =
      factor != 1.0 && size > 1 && n * static_cast<std::int64_t>(sizeof(T)) >= 64 * 1024;
  CHECK(dtrain::detail::scales_in_shards(n, dtype, size) == (size > 1 && n * static_cast<std::int64_t>(sizeof(T)) >= 64 * 1024));
  // One reduce-scatter per chunk of at least `size` elements; a shorter tail is one allreduce.
  std::int64_t expected = 0;
  if (sharded)
    for (std::int64_t off = 0; off < n; off += chunk) expected += std::min(chunk, n - off) >= size;
  CHECK_MESSAGE(rs_calls == expected, fmt::format("{}: {} reduce-scatters, expected {}", what,
                                                  rs_calls, expected));
}

}  // namespace

TEST_CASE_TEMPLATE("scaled allreduce agrees with MPI_SUM then a scaling loop", T,
                   DTRAIN_TEST_FLOAT_TYPES) {
  dtrain::init();  // the MPI ops for 16-bit floats are made at init
  const int size = world_size();
  const std::int64_t min_elems = 64 * 1024 / static_cast<std::int64_t>(sizeof(T));
  for (double factor : {1.0 / size, 0.37, 1.0}) {
    for (std::int64_t n : {std::int64_t{1}, std::int64_t{1001}, min_elems - 1, min_elems,
                           min_elems + 1, std::int64_t{100003}})
      kernel_case<T>(n, factor, std::int64_t{1} << 30);
    // Chunked, each chunk split unevenly, and a tail shorter than the rank count; one piece at a
    // time, and several in flight (Note [Pieces in flight]).
    for (int in_flight : {1, 2, 5}) {
      kernel_case<T>(3 * 40009 + 1, factor, 40009, in_flight);
      kernel_case<T>(2 * 40009 + 3, factor, 40009, in_flight);
      kernel_case<T>(7 * 20011 + 5, factor, 20011, in_flight);
    }
  }
}

TEST_CASE("scaled allreduce scales the result of Max, not its inputs") {
  MPI_Comm comm;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  const std::int64_t n = 50001;
  std::vector<float> data = inputs<float>(n);
  std::vector<float> ref = data;
  PMPI_Allreduce(MPI_IN_PLACE, ref.data(), static_cast<int>(n), MPI_FLOAT, MPI_MAX, MPI_COMM_WORLD);
  dtrain::detail::PiecesInFlight pieces;
  dtrain::detail::host_allreduce_scaled(data.data(), n, DataType::float32, ReduceOp::Max, -0.5,
                                        comm, n, pieces);
  MPI_Comm_free(&comm);
  check_elements(data.data(), n, [&](std::int64_t i) { return -0.5 * ref[i]; }, 0.0,
                 "Max scaled by -0.5");
}

namespace {

// Through the public API: a lone tensor, or a group of `sizes` (large ones reduced in their own
// memory where each rank has a core, small ones packed), reduced with `options` and checked
// against plain MPI. Returns how many reduce-scatters the engine made.
template <class T>
std::int64_t api_case(const std::vector<std::int64_t>& sizes, dtrain::AllreduceOptions options,
                      const std::string& what) {
  const int size = world_size();
  std::vector<std::vector<T>> data;
  for (std::size_t k = 0; k < sizes.size(); ++k) data.push_back(inputs<T>(sizes[k], static_cast<int>(k)));
  const double average = options.op == ReduceOp::Average ? 1.0 / size : 1.0;
  const double factor = options.prescale * options.postscale * average;
  std::vector<Reference> refs;
  for (const auto& d : data) refs.push_back(reference_sum(d, factor));
  const std::int64_t before = reduce_scatter_calls.load();
  if (data.size() == 1) {
    dtrain::allreduce(data[0], options);
  } else {
    std::vector<std::span<T>> views(data.begin(), data.end());
    dtrain::grouped_allreduce(views, options);
  }
  const std::int64_t calls = reduce_scatter_calls.load() - before;
  for (std::size_t k = 0; k < data.size(); ++k)
    check_against(data[k], refs[k], factor, fmt::format("{}: tensor {} ({} elements of {})", what,
                                                        k, sizes[k], dtrain::to_string(dtrain::dtype_of<T>)));
  return calls;
}

}  // namespace

TEST_CASE_TEMPLATE("Average, prescale and postscale through the API", T, DTRAIN_TEST_FLOAT_TYPES) {
  dtrain::init();
  const int size = world_size();
  const std::int64_t large = 300007;  // >= 1 MiB in 32-bit types, odd, not divisible by 3 or 4
  // A lone large tensor takes the sharded road whenever it is scaled, where every rank has a
  // core of its own (on a homogeneous job every rank reaches the verdict this one does).
  const bool shards = size > 1 && dtrain::detail::direct_pays(dtrain::local_size());
  std::int64_t rs = api_case<T>({large}, {.op = ReduceOp::Average}, "lone Average");
  CHECK(rs == (shards ? 1 : 0));
  rs = api_case<T>({large}, {.op = ReduceOp::Sum}, "lone Sum");
  CHECK(rs == 0);
  api_case<T>({large}, {.op = ReduceOp::Sum, .prescale = 0.5, .postscale = 3.0}, "lone pre/post");
  // gradient_predivide_factor f: prescale 1/f, postscale f, Average.
  api_case<T>({large}, {.op = ReduceOp::Average, .prescale = 1.0 / 4.0, .postscale = 4.0},
              "lone predivide");
  api_case<T>({7}, {.op = ReduceOp::Average}, "small lone Average");
  // Fused: direct (large) and packed (small) members side by side.
  api_case<T>({5, large, 3, 2 * large + 1, 1}, {.op = ReduceOp::Average}, "group Average");
  api_case<T>({large, 9, large}, {.op = ReduceOp::Average, .prescale = 0.25, .postscale = 4.0},
              "group predivide");
  api_case<T>({large, 9, large}, {.op = ReduceOp::Sum, .postscale = 0.125}, "group postscale");
}

TEST_CASE("integer Average stays rejected and integer Sum stays exact on large tensors") {
  dtrain::init();
  const int size = world_size();
  std::vector<std::int32_t> v(300007);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<std::int32_t>(i % 1000) * (world_rank() + 1);
  CHECK_THROWS_AS(dtrain::allreduce(v, {.op = ReduceOp::Average}), dtrain::InvalidArgumentError);
  dtrain::allreduce(v, {.op = ReduceOp::Sum});
  check_elements(v.data(), static_cast<std::int64_t>(v.size()),
                 [&](std::int64_t i) { return (i % 1000) * size * (size + 1) / 2; }, 0.0,
                 "int32 Sum of a large tensor");
}

TEST_CASE("hierarchical allreduce scales the piece it copies back") {
  dtrain::shutdown();
  dtrain::Config c = dtrain::Config::from_env();
  c.hierarchical_allreduce = true;
  dtrain::init(c);
  api_case<float>({300007}, {.op = ReduceOp::Average}, "hierarchical lone Average");
  api_case<double>({7, 100003}, {.op = ReduceOp::Average, .prescale = 0.5, .postscale = 2.0},
                   "hierarchical group predivide");
  api_case<dtrain::float16_t>({300007}, {.op = ReduceOp::Sum, .postscale = 0.25},
                              "hierarchical float16 postscale");
  dtrain::shutdown();
}

// A piece whose collective is still in flight has not progressed: a caller told otherwise never
// paces its waiting, and the engine thread polled a whole core while a slow link carried the data
// (Note [Waiting for data collectives]). The last rank holds its piece back until every other rank
// has asked twice, so their allreduces cannot complete meanwhile.
TEST_CASE_TEMPLATE("a piece in flight reports progress only when it takes a step", T, float, double) {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size < 2) return;
  for (const double factor : {1.0, 0.5}) {  // one Iallreduce; a ring and an Iallgatherv
    CAPTURE(factor);
    const std::int64_t n = 100003;
    std::vector<T> data(static_cast<std::size_t>(n), T(1));
    std::vector<T> incoming(static_cast<std::size_t>(n / size + 1));
    const dtrain::detail::PieceSpec spec{data.data(), n, dtrain::dtype_of<T>, ReduceOp::Sum,
                                         factor, factor != 1.0};
    using Progress = dtrain::detail::PieceAllreduce::Progress;
    dtrain::detail::PieceAllreduce piece;
    std::int64_t turn = 0;
    const bool last = rank == size - 1;
    if (!last) {
      piece.start(spec, 0, 7, incoming.data(), MPI_COMM_WORLD, rank, size);
      const Progress first = piece.advance(turn);
      // An Iallreduce cannot complete without the last rank: posted, then nothing. (A ring's
      // first steps may complete between ranks that are both here, so only its end is checked.)
      if (!spec.ring) {
        CHECK(first == Progress::stepped);
        CHECK(piece.advance(turn) == Progress::none);
        CHECK(piece.advance(turn) == Progress::none);
      }
    }
    MPI_Barrier(MPI_COMM_WORLD);  // the others asked; only now may the last rank join
    if (last) piece.start(spec, 0, 7, incoming.data(), MPI_COMM_WORLD, rank, size);
    Progress p = Progress::none;
    while ((p = piece.advance(turn)) != Progress::complete) {
    }
    CHECK_FALSE(piece.active());
    CHECK(static_cast<double>(data[0]) == size * factor);
    CHECK(static_cast<double>(data[static_cast<std::size_t>(n - 1)]) == size * factor);
  }
}
