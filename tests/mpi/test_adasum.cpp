// ReduceOp::Adasum on host memory (Note [Adasum tree] in runtime/detail/adasum_tree.hpp): the
// result of allreduce, allreduce_async and grouped_allreduce against a single-process reference of
// the same tree over every rank's input (each rank's input is a function of its rank, so every
// rank recomputes them all), closed forms, bitwise agreement across ranks, ops in flight in
// different orders and from several threads, process sets, the errors (on every rank, never a
// hang), and DistributedOptimizer with op = Adasum.
#include <algorithm>
#include <atomic>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "mpi_test_util.hpp"

namespace {

using dtrain::ReduceOp;
using namespace dtrain_test;

// ---- the reference: Horovod's pairwise operator over the fixed tree, in one process ----------

// adasum(a, b) as horovod/common/ops/adasum/adasum.h computes it: dot product and squared norms
// accumulated in double, a norm below sqrt(DBL_MIN) leaves its coefficient at 1. The sums run in
// four lanes (element i in lane i % 4) as dtrain's do, so the result matches to the bit.
template <class T>
std::vector<T> pair(const std::vector<T>& a, const std::vector<T>& b) {
  double lane_dot[4] = {}, lane_aa[4] = {}, lane_bb[4] = {};
  for (std::size_t i = 0; i < a.size(); ++i) {
    lane_dot[i % 4] += static_cast<double>(a[i]) * static_cast<double>(b[i]);
    lane_aa[i % 4] += static_cast<double>(a[i]) * static_cast<double>(a[i]);
    lane_bb[i % 4] += static_cast<double>(b[i]) * static_cast<double>(b[i]);
  }
  auto sum = [](const double* s) { return (s[0] + s[1]) + (s[2] + s[3]); };
  const double dot = sum(lane_dot), aa = sum(lane_aa), bb = sum(lane_bb);
  const double tiny = std::sqrt(DBL_MIN);
  const double ca = aa >= tiny ? 1.0 - dot / aa * 0.5 : 1.0;
  const double cb = bb >= tiny ? 1.0 - dot / bb * 0.5 : 1.0;
  std::vector<T> out(a.size());
  for (std::size_t i = 0; i < a.size(); ++i)
    out[i] = static_cast<T>(ca * static_cast<double>(a[i]) + cb * static_cast<double>(b[i]));
  return out;
}

// The tree over v[0..n): the members past the largest power of two p fold into the first ones,
// then the two halves of [0, p) are combined recursively, the lower half's result as `a`.
template <class T>
std::vector<T> tree(std::vector<std::vector<T>> v) {
  const int n = static_cast<int>(v.size());
  int p = 1;
  while (2 * p <= n) p *= 2;
  for (int r = 0; r + p < n; ++r) v[r] = pair(v[r], v[r + p]);
  std::function<std::vector<T>(int, int)> combine = [&](int lo, int len) {
    if (len == 1) return v[lo];
    return pair(combine(lo, len / 2), combine(lo + len / 2, len / 2));
  };
  return combine(0, p);
}

// Deterministic values in [-1, 1) for (seed, rank, index).
double noise(std::uint64_t seed, int r, std::int64_t i) {
  std::uint64_t x =
      (seed << 48) ^ (static_cast<std::uint64_t>(r) << 32) ^ static_cast<std::uint64_t>(i);
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return static_cast<double>(x >> 11) * 0x1.0p-53 * 2.0 - 1.0;
}

// Rank r's input: noise plus a part shared by every rank, so the vectors are far from orthogonal
// and the coefficients far from 1.
template <class T>
std::vector<T> input(std::uint64_t seed, int r, std::int64_t n) {
  std::vector<T> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i)
    v[static_cast<std::size_t>(i)] = static_cast<T>(noise(seed, r, i) + 0.8 * noise(seed, -1, i));
  return v;
}

// The reference over ranks `ranks` (world ranks) of input(seed, ., n) with the scale factors
// applied as the host path applies them (in T).
template <class T>
std::vector<T> expected(std::uint64_t seed, const std::vector<int>& ranks, std::int64_t n,
                        double pre = 1.0, double post = 1.0) {
  std::vector<std::vector<T>> all;
  for (int r : ranks) {
    all.push_back(input<T>(seed, r, n));
    for (T& x : all.back()) x = x * static_cast<T>(pre);
  }
  std::vector<T> out = tree(std::move(all));
  for (T& x : out) x = x * static_cast<T>(post);
  return out;
}

std::vector<int> world_ranks() {
  std::vector<int> r(static_cast<std::size_t>(world_size()));
  for (int k = 0; k < world_size(); ++k) r[static_cast<std::size_t>(k)] = k;
  return r;
}

template <class T>
void check_result(const std::vector<T>& got, const std::vector<T>& want, const std::string& what) {
  CHECK_MESSAGE(got.size() == want.size(), what);
  if (got.size() != want.size()) return;
  check_elements(got.data(), static_cast<std::int64_t>(got.size()),
                 [&](std::int64_t i) {
                   return static_cast<double>(want[static_cast<std::size_t>(i)]);
                 },
                 tolerance<T>(4), what);
  CHECK_MESSAGE(same_on_all_ranks(got.data(), got.size() * sizeof(T)), what);
}

}  // namespace

TEST_CASE_TEMPLATE("Adasum allreduce equals the reference tree, bitwise alike on every rank", T,
                   float, double) {
  dtrain::init();
  const int rank = world_rank();
  std::uint64_t seed = 1;
  for (std::int64_t n : {1, 2, 7, 1000, 100003}) {
    std::vector<T> v = input<T>(seed, rank, n);
    dtrain::allreduce(v, {.op = ReduceOp::Adasum});
    check_result(v, expected<T>(seed, world_ranks(), n),
                 fmt::format("Adasum of {} {} on {} ranks", n, dtrain::dtype_of<T>, world_size()));
    ++seed;
  }
  std::vector<T> empty;
  CHECK_NOTHROW(dtrain::allreduce(empty, {.op = ReduceOp::Adasum, .name = "adasum.empty"}));
}

TEST_CASE_TEMPLATE("Adasum applies prescale before the tree and postscale after it", T, float,
                   double) {
  dtrain::init();
  std::vector<T> v = input<T>(11, world_rank(), 33);
  dtrain::allreduce(v, {.op = ReduceOp::Adasum, .prescale = 0.5, .postscale = 3.0});
  check_result(v, expected<T>(11, world_ranks(), 33, 0.5, 3.0), "Adasum with scale factors");
}

TEST_CASE("Adasum closed forms: orthogonal vectors add, identical ones stay, zeros do nothing") {
  dtrain::init();
  const int rank = world_rank(), size = world_size();
  {  // rank r owns elements [3r, 3r + 3): every partial result is orthogonal to every other
    std::vector<double> v(static_cast<std::size_t>(3 * size), 0.0), sum(v.size(), 0.0);
    for (int r = 0; r < size; ++r)
      for (int j = 0; j < 3; ++j) sum[static_cast<std::size_t>(3 * r + j)] = (r + 1) * 0.5 - j;
    for (int j = 0; j < 3; ++j)
      v[static_cast<std::size_t>(3 * rank + j)] = sum[static_cast<std::size_t>(3 * rank + j)];
    dtrain::allreduce(v, {.op = ReduceOp::Adasum, .name = "adasum.orthogonal"});
    CHECK(v == sum);
  }
  {  // adasum(a, a) = a
    std::vector<float> v{1.5f, -2.0f, 0.25f, 3.0f}, same = v;
    dtrain::allreduce(v, {.op = ReduceOp::Adasum, .name = "adasum.identical"});
    CHECK(v == same);
  }
  {  // zero vectors everywhere stay zero (no division by a zero norm)
    std::vector<double> v(5, 0.0);
    dtrain::allreduce(v, {.op = ReduceOp::Adasum, .name = "adasum.zeros"});
    CHECK(v == std::vector<double>(5, 0.0));
  }
  {  // adasum(a, 0) = adasum(0, a) = a: only the last rank has a vector
    const std::vector<double> a{0.5, -1.0, 2.0};
    std::vector<double> v = rank == size - 1 ? a : std::vector<double>(3, 0.0);
    dtrain::allreduce(v, {.op = ReduceOp::Adasum, .name = "adasum.one_nonzero"});
    CHECK(v == a);
  }
  if (size == 2) {  // a = (1, 0), b = (1, 1): a·b = 1, so (1 - 1/2) a + (1 - 1/4) b
    std::vector<double> v{1.0, rank == 0 ? 0.0 : 1.0};
    dtrain::allreduce(v, {.op = ReduceOp::Adasum, .name = "adasum.two"});
    CHECK(v == std::vector<double>{1.25, 0.75});
  }
}

TEST_CASE("grouped Adasum combines each tensor with its own dot product") {
  dtrain::init();
  const int rank = world_rank(), size = world_size();
  // Member 0 is the same on every rank (its result is itself), member 1 is orthogonal across ranks
  // (its result is the sum): one dot product over both together would give neither.
  std::vector<float> same{1.0f, 2.0f, -3.0f};
  std::vector<double> own(static_cast<std::size_t>(2 * size), 0.0), sum(own.size());
  for (int r = 0; r < size; ++r) sum[static_cast<std::size_t>(2 * r)] = 4.0 * (r + 1);
  own[static_cast<std::size_t>(2 * rank)] = 4.0 * (rank + 1);
  std::vector<dtrain::TensorView> group{
      dtrain::TensorView(same.data(), 3),
      dtrain::TensorView(own.data(), static_cast<std::int64_t>(own.size()))};
  dtrain::grouped_allreduce(group, {.op = ReduceOp::Adasum, .name = "adasum.group.mixed"});
  CHECK(same == std::vector<float>{1.0f, 2.0f, -3.0f});
  CHECK(own == sum);

  // Three float tensors, one empty, against the reference tree of each.
  const std::vector<std::int64_t> sizes{5, 0, 17};
  std::vector<std::vector<float>> members;
  for (std::size_t m = 0; m < sizes.size(); ++m)
    members.push_back(input<float>(20 + m, rank, sizes[m]));
  auto h = dtrain::grouped_allreduce_async(members, {.op = ReduceOp::Adasum});
  h.wait();
  for (std::size_t m = 0; m < sizes.size(); ++m)
    check_result(members[m], expected<float>(20 + m, world_ranks(), sizes[m]),
                 fmt::format("grouped Adasum member {}", m));

  std::vector<std::vector<double>> none;
  CHECK_NOTHROW(
      dtrain::grouped_allreduce(none, {.op = ReduceOp::Adasum, .name = "adasum.group.empty"}));
}

TEST_CASE("Adasum ops in flight in different orders on different ranks and from several threads") {
  dtrain::init();
  const int rank = world_rank();
  // Odd ranks submit B before A and wait for A first.
  std::vector<double> a = input<double>(30, rank, 64), b = input<double>(31, rank, 9);
  dtrain::Handle ha, hb;
  if (rank % 2 == 0) {
    ha = dtrain::allreduce_async(a, {.op = ReduceOp::Adasum, .name = "adasum.order.a"});
    hb = dtrain::allreduce_async(b, {.op = ReduceOp::Adasum, .name = "adasum.order.b"});
    hb.wait();
    ha.wait();
  } else {
    hb = dtrain::allreduce_async(b, {.op = ReduceOp::Adasum, .name = "adasum.order.b"});
    ha = dtrain::allreduce_async(a, {.op = ReduceOp::Adasum, .name = "adasum.order.a"});
    ha.wait();
    hb.wait();
  }
  check_result(a, expected<double>(30, world_ranks(), 64), "Adasum a, submitted in rank order");
  check_result(b, expected<double>(31, world_ranks(), 9), "Adasum b, submitted in rank order");

  // Two threads each run blocking Adasum allreduces of their own, started in a different order
  // on each rank: neither may wait for the other's.
  constexpr int kRounds = 10;
  std::atomic<int> wrong{0};
  auto work = [&](int t) {
    for (int k = 0; k < kRounds; ++k) {
      const std::uint64_t seed = 100 + static_cast<std::uint64_t>(10 * t + k);
      std::vector<float> v = input<float>(seed, rank, 50 + t);
      dtrain::allreduce(
          v, {.op = ReduceOp::Adasum, .name = fmt::format("adasum.thread{}.{}", t, k)});
      const auto want = expected<float>(seed, world_ranks(), 50 + t);
      for (std::size_t i = 0; i < v.size(); ++i)
        if (std::abs(v[i] - want[i]) > 1e-5f * std::max(1.0f, std::abs(want[i]))) ++wrong;
    }
  };
  std::thread first([&] { work(rank % 2); });
  std::thread second([&] { work(1 - rank % 2); });
  first.join();
  second.join();
  CHECK(wrong.load() == 0);
}

TEST_CASE("Adasum on a process set pairs its members only") {
  dtrain::init();
  const int rank = world_rank(), size = world_size();
  if (size < 3) return;
  std::vector<int> members;  // every rank but 0: 2 or 3 members
  for (int r = 1; r < size; ++r) members.push_back(r);
  const auto set = dtrain::add_process_set(members);
  if (set.included()) {
    std::vector<double> v = input<double>(40, rank, 21);
    dtrain::allreduce(v, {.op = ReduceOp::Adasum, .name = "adasum.set", .process_set = set});
    check_elements(v.data(), 21,
                   [&, want = expected<double>(40, members, 21)](std::int64_t i) {
                     return want[static_cast<std::size_t>(i)];
                   },
                   tolerance<double>(4), "Adasum on a process set");
  }
  std::vector<double> all = input<double>(41, rank, 8);
  dtrain::allreduce(all, {.op = ReduceOp::Adasum, .name = "adasum.after_set"});
  check_result(all, expected<double>(41, world_ranks(), 8), "Adasum of the world after a set's");
}

namespace {

template <class E, class F>
std::string error_of(F&& call) {
  try {
    call();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("<another exception> ") + e.what();
  }
  return "<nothing thrown>";
}

void check_contains(const std::string& message, const std::vector<std::string>& parts) {
  for (const auto& p : parts)
    CHECK_MESSAGE(message.find(p) != std::string::npos, "'" << p << "' missing from: " << message);
}

// An Adasum allreduce still works afterwards.
void check_still_works(const std::string& name) {
  std::vector<double> v = input<double>(50, world_rank(), 6);
  dtrain::allreduce(v, {.op = ReduceOp::Adasum, .name = name});
  check_result(v, expected<double>(50, world_ranks(), 6), "Adasum after an error");
}

}  // namespace

TEST_CASE("Adasum refuses what it is not built for, on every rank") {
  dtrain::init();
  std::vector<std::int32_t> ints(3, 1);
  check_contains(error_of<dtrain::InvalidArgumentError>(
                     [&] { dtrain::allreduce(ints, {.op = ReduceOp::Adasum, .name = "ints"}); }),
                 {"'ints'", "Adasum", "int32"});
  std::vector<dtrain::float16_t> halves(3, dtrain::float16_t(1.0f));
  check_contains(error_of<dtrain::InvalidArgumentError>(
                     [&] { dtrain::allreduce(halves, {.op = ReduceOp::Adasum}); }),
                 {"Adasum", "float16", "float32"});
  std::vector<float> rows(4, 1.0f);
  check_contains(error_of<dtrain::InvalidArgumentError>(
                     [&] { (void)dtrain::reducescatter(rows, ReduceOp::Adasum); }),
                 {"reducescatter", "Adasum", "allreduce"});
  // A view that claims device memory: refused before it is read (no GPU needed).
  dtrain::TensorView on_gpu(rows.data(), 4, dtrain::DataType::float32, dtrain::Device::cuda(0));
  CHECK_THROWS_AS(dtrain::allreduce(on_gpu, {.op = ReduceOp::Adasum, .name = "adasum.cuda"}),
                  dtrain::InvalidArgumentError);
  CHECK(ints == std::vector<std::int32_t>(3, 1));
  check_still_works("adasum.after_refusals");
}

TEST_CASE("a rank's refusal fails the Adasum op on every rank; disagreements are MismatchError") {
  dtrain::init();
  const int rank = world_rank(), size = world_size();
  if (size < 2) return;
  {  // rank 1 passes an int32 tensor: it refuses its own call, the others fail with its reason
    std::vector<float> f(3, 1.0f);
    std::vector<std::int32_t> i(3, 1);
    const auto message = error_of<dtrain::Error>([&] {
      if (rank == 1) dtrain::allreduce(i, {.op = ReduceOp::Adasum, .name = "adasum.refused"});
      else dtrain::allreduce(f, {.op = ReduceOp::Adasum, .name = "adasum.refused"});
    });
    check_contains(message, {"adasum.refused", "int32"});
    if (rank != 1) check_contains(message, {"rejected on rank 1"});
    CHECK(f == std::vector<float>(3, 1.0f));
  }
  {  // rank 1 has a longer vector
    std::vector<double> v(rank == 1 ? 4 : 3, 1.0);
    check_contains(error_of<dtrain::MismatchError>([&] {
                     dtrain::allreduce(v, {.op = ReduceOp::Adasum, .name = "adasum.shape"});
                   }),
                   {"'adasum.shape'", "Adasum", "shape", "[4] on ranks [1]"});
    CHECK(v == std::vector<double>(v.size(), 1.0));
  }
  {  // rank 0 groups one tensor fewer
    std::vector<std::vector<float>> g(rank == 0 ? 1 : 2, std::vector<float>(2, 1.0f));
    check_contains(error_of<dtrain::MismatchError>([&] {
                     dtrain::grouped_allreduce(g, {.op = ReduceOp::Adasum, .name = "adasum.count"});
                   }),
                   {"'adasum.count'", "number of tensors", "1 on ranks [0]"});
  }
  {  // different prescale factors
    std::vector<float> v(2, 1.0f);
    check_contains(error_of<dtrain::MismatchError>([&] {
                     dtrain::allreduce(v, {.op = ReduceOp::Adasum,
                                           .prescale = rank == 0 ? 2.0 : 1.0,
                                           .name = "adasum.prescale"});
                   }),
                   {"prescale", "2 on ranks [0]"});
  }
  check_still_works("adasum.after_mismatches");
}

TEST_CASE("Adasum is refused while a rank has joined, on the ranks that did not") {
  dtrain::init();
  const int rank = world_rank(), size = world_size();
  if (size < 2) return;
  if (rank != size - 1) {  // the last rank joins at once; the others try an Adasum op first
    std::vector<float> v(3, 1.0f);
    check_contains(error_of<dtrain::InvalidArgumentError>([&] {
                     dtrain::allreduce(v, {.op = ReduceOp::Adasum, .name = "adasum.joined"});
                   }),
                   {"'adasum.joined'", "Adasum", fmt::format("ranks [{}] have joined", size - 1)});
    CHECK(v == std::vector<float>(3, 1.0f));
  }
  const int last = dtrain::join();
  CHECK(last >= 0);
  CHECK(last < size - 1);  // the last rank joined first: the op above waited for it
  check_still_works("adasum.after_join");
}

namespace {

// A plain optimizer for DistributedOptimizer (Note [Optimizer customization point]): SGD over two
// float64 tensors, whose gradients each rank computes from the shared weights and its rank.
struct PlainSgd {
  std::vector<std::vector<double>> params{std::vector<double>(12, 0.5),
                                          std::vector<double>(5, -1.0)};
  std::vector<std::vector<double>> grads{std::vector<double>(12), std::vector<double>(5)};
  double lr = 0.1;

  void step() {
    for (std::size_t t = 0; t < params.size(); ++t)
      for (std::size_t i = 0; i < params[t].size(); ++i) params[t][i] -= lr * grads[t][i];
  }
  std::vector<std::vector<double>>& gradients() { return grads; }
};

// Rank r's gradients at step `step` for weights `params`.
std::vector<std::vector<double>> gradients_of(const std::vector<std::vector<double>>& params,
                                              int r, int step) {
  std::vector<std::vector<double>> g;
  for (std::size_t t = 0; t < params.size(); ++t) {
    g.emplace_back(params[t].size());
    for (std::size_t i = 0; i < params[t].size(); ++i)
      g[t][i] = std::sin(0.3 * static_cast<double>(i) + 0.7 * r + 0.1 * step + t) +
                0.5 * params[t][i];
  }
  return g;
}

}  // namespace

TEST_CASE("DistributedOptimizer with op = Adasum steps on the reference tree of every gradient") {
  dtrain::init();
  const int rank = world_rank(), size = world_size();
  constexpr int kSteps = 4;
  PlainSgd sgd, reference;
  dtrain::DistributedOptimizerOptions options;
  options.op = ReduceOp::Adasum;
  options.name = "adasum.optimizer";
  dtrain::DistributedOptimizer<PlainSgd> opt(sgd, options);
  for (int step = 0; step < kSteps; ++step) {
    sgd.grads = gradients_of(sgd.params, rank, step);
    CHECK(opt.step());
    // Each gradient tensor on its own through the tree, as every rank's would be.
    std::vector<std::vector<std::vector<double>>> by_rank;
    for (int r = 0; r < size; ++r) by_rank.push_back(gradients_of(reference.params, r, step));
    for (std::size_t t = 0; t < reference.params.size(); ++t) {
      std::vector<std::vector<double>> of_tensor;
      for (int r = 0; r < size; ++r) of_tensor.push_back(by_rank[static_cast<std::size_t>(r)][t]);
      reference.grads[t] = tree(std::move(of_tensor));
    }
    reference.step();
  }
  for (std::size_t t = 0; t < sgd.params.size(); ++t)
    check_result(sgd.params[t], reference.params[t],
                 fmt::format("weights {} after Adasum steps", t));

  dtrain::DistributedOptimizerOptions compressed = options;
  compressed.compression = dtrain::Compression::fp16;
  check_contains(error_of<dtrain::InvalidArgumentError>(
                     [&] { dtrain::DistributedOptimizer<PlainSgd> bad(sgd, compressed); }),
                 {"Adasum", "compression"});
  dtrain::DistributedOptimizerOptions predivided = options;
  predivided.gradient_predivide_factor = 2.0;
  check_contains(error_of<dtrain::InvalidArgumentError>(
                     [&] { dtrain::DistributedOptimizer<PlainSgd> bad(sgd, predivided); }),
                 {"gradient_predivide_factor"});
}
