// PowerSGD as a GradientHook (Note [PowerSGD] in train/powersgd.hpp). Every rank's gradient is a
// function of its rank, so each rank recomputes every rank's inputs and runs a plain single-process
// PowerSGD written here: P = sum_i M_i Q, orthonormalize P, Q = sum_i M_i^T P / N, M^ = P Q^T,
// e_i = M_i - M^. Each case also checks that what it compares is not what a broken hook would give
// (the plain average, another Q, no error feedback).
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_test_util.hpp"
#include "dtrain/dtrain.hpp"
#include "dtrain/train/powersgd.hpp"
#include "dtrain/train/powersgd_math.hpp"  // the random Q the hook and the reference start from
#include "train/train_test_util.hpp"

namespace {

using namespace train_test;
using dtrain::DataType;
using dtrain::GradientBucket;
using dtrain::InvalidArgumentError;
using dtrain::PowerSGDOptions;
using dtrain::ReduceOp;
using dtrain::TensorView;
using Matrix = std::vector<double>;  // row-major

// Rank k's gradient element i of tensor `tensor` at step t: far from low rank, different per rank.
double grad_value(int k, int tensor, int t, std::int64_t i) {
  const double x = std::sin(12.9898 * i + 78.233 * k + 37.719 * t + 4.1 * tensor) * 43758.5453;
  return (x - std::floor(x)) - 0.5 + 0.3 * std::sin(0.37 * i + 1.3 * k + 0.7 * t);
}

Matrix rank_gradient(int k, int tensor, int t, std::int64_t numel) {
  Matrix g(static_cast<std::size_t>(numel));
  for (std::int64_t i = 0; i < numel; ++i) g[i] = grad_value(k, tensor, t, i);
  return g;
}

Matrix average_over_ranks(int tensor, int t, std::int64_t numel) {
  Matrix avg(static_cast<std::size_t>(numel), 0.0);
  for (int k = 0; k < world_size(); ++k) {
    const Matrix g = rank_gradient(k, tensor, t, numel);
    for (std::int64_t i = 0; i < numel; ++i) avg[i] += g[i] / world_size();
  }
  return avg;
}

// ---- the reference ----------------------------------------------------------------------------

void gram_schmidt(Matrix& a, std::int64_t rows, int r) {
  for (int i = 0; i < r; ++i) {
    double norm = 0;
    for (std::int64_t x = 0; x < rows; ++x) norm += a[x * r + i] * a[x * r + i];
    norm = std::sqrt(norm);
    for (std::int64_t x = 0; x < rows; ++x) a[x * r + i] /= norm;
    for (int j = i + 1; j < r; ++j) {
      double dot = 0;
      for (std::int64_t x = 0; x < rows; ++x) dot += a[x * r + i] * a[x * r + j];
      for (std::int64_t x = 0; x < rows; ++x) a[x * r + j] -= dot * a[x * r + i];
    }
  }
}

// One gradient's PowerSGD, as one process that holds every rank's gradient.
struct Reference {
  std::int64_t n, m;
  int r;
  bool feedback = true;
  Matrix q;                   // the last reduced Q
  std::vector<Matrix> error;  // per rank

  Reference(std::int64_t rows, std::int64_t cols, int rank, bool error_feedback)
      : n(rows),
        m(cols),
        r(rank),
        feedback(error_feedback),
        error(static_cast<std::size_t>(world_size()), Matrix(rows * cols, 0.0)) {}

  // The average M^ every rank ends with, from the ranks' gradients and the starting Q.
  Matrix step(const std::vector<Matrix>& grads, const Matrix& q_start) {
    const int world = world_size();
    std::vector<Matrix> M = grads;
    if (feedback)
      for (int k = 0; k < world; ++k)
        for (std::int64_t i = 0; i < n * m; ++i) M[k][i] += error[k][i];
    Matrix p(n * r, 0.0);
    for (int k = 0; k < world; ++k)
      for (std::int64_t i = 0; i < n; ++i)
        for (std::int64_t j = 0; j < m; ++j)
          for (int c = 0; c < r; ++c) p[i * r + c] += M[k][i * m + j] * q_start[j * r + c];
    gram_schmidt(p, n, r);
    q.assign(m * r, 0.0);
    for (int k = 0; k < world; ++k)
      for (std::int64_t i = 0; i < n; ++i)
        for (std::int64_t j = 0; j < m; ++j)
          for (int c = 0; c < r; ++c) q[j * r + c] += M[k][i * m + j] * p[i * r + c] / world;
    Matrix approx(n * m, 0.0);
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t j = 0; j < m; ++j)
        for (int c = 0; c < r; ++c) approx[i * m + j] += p[i * r + c] * q[j * r + c];
    if (feedback)
      for (int k = 0; k < world; ++k)
        for (std::int64_t i = 0; i < n * m; ++i) error[k][i] = M[k][i] - approx[i];
    return approx;
  }

  Matrix random_q(std::uint64_t seed, const std::string& name, std::int64_t step) const {
    return dtrain::detail::powersgd_random_q(seed, name, step, m, r);
  }
};

std::vector<Matrix> every_rank(int tensor, int t, std::int64_t numel) {
  std::vector<Matrix> out;
  for (int k = 0; k < world_size(); ++k) out.push_back(rank_gradient(k, tensor, t, numel));
  return out;
}

Matrix scaled(Matrix a, double f) {
  for (double& v : a) v *= f;
  return a;
}

// ---- driving the hook directly ----------------------------------------------------------------

// One gradient this rank hands the hook: float64 or float32 storage with a shape.
struct Gradient {
  std::string name;
  dtrain::Shape shape;
  DataType dtype = DataType::float64;
  Matrix d;
  std::vector<float> f;

  Gradient(std::string n, dtrain::Shape s, DataType t = DataType::float64)
      : name(std::move(n)), shape(std::move(s)), dtype(t) {}
  std::int64_t numel() const { return dtrain::detail::numel(shape); }
  void set(const Matrix& values) {
    if (dtype == DataType::float64)
      d = values;
    else
      f.assign(values.begin(), values.end());
  }
  Matrix get() const { return dtype == DataType::float64 ? d : Matrix(f.begin(), f.end()); }
  TensorView view() {
    void* data = dtype == DataType::float64 ? static_cast<void*>(d.data()) : f.data();
    return TensorView(data, numel(), dtype, dtrain::Device::cpu(), shape);
  }
};

void run_bucket(dtrain::GradientHook& hook, std::vector<Gradient*> grads, std::int64_t step,
                dtrain::AllreduceOptions options = {}) {
  GradientBucket bucket;
  for (auto* g : grads) {
    bucket.gradients.push_back(g->view());
    bucket.names.push_back(g->name);
  }
  bucket.options = options;
  bucket.step = step;
  hook.start(std::move(bucket))->wait();
}

}  // namespace

TEST_CASE("one round equals the reference; 1-D and small tensors travel as they are") {
  dtrain::init();
  PowerSGDOptions o{.rank = 2, .start_step = 0, .seed = 11};
  auto hook = dtrain::powersgd_hook(o);
  Gradient a("one.a", {16, 12});                      // 192 / (28 * 2) = 3.4: compressed
  Gradient b("one.b", {6, 4, 5}, DataType::float32);  // 6 x 20: 120 / (26 * 2) = 2.3: compressed
  Gradient c("one.c", {10});                          // 1-D: as it is
  Gradient d("one.d", {4, 3});                        // 12 / (7 * 2) = 0.9: as it is
  std::vector<Gradient*> all{&a, &b, &c, &d};
  for (int t = 0; t < 4; ++t) all[t]->set(rank_gradient(world_rank(), t, 0, all[t]->numel()));
  run_bucket(*hook, all, 0);

  Reference ra(16, 12, 2, true), rb(6, 20, 2, true);
  const Matrix want_a = ra.step(every_rank(0, 0, 192), ra.random_q(11, "one.a", 0));
  const Matrix want_b = rb.step(every_rank(1, 0, 120), rb.random_q(11, "one.b", 0));
  check_close(a.get(), want_a, 1e-5, "2-D float64 gradient");
  check_close(b.get(), want_b, 1e-5, "3-D float32 gradient");
  // Compression happened: a rank-2 approximation is far from the exact average.
  CHECK(max_rel_error(a.get(), average_over_ranks(0, 0, 192)) > 1e-2);
  CHECK(max_rel_error(b.get(), average_over_ranks(1, 0, 120)) > 1e-2);
  check_close(c.get(), average_over_ranks(2, 0, 10), 1e-12, "1-D gradient");
  check_close(d.get(), average_over_ranks(3, 0, 12), 1e-12, "gradient under the rate");
  CHECK(same_on_all_ranks(a.d.data(), a.d.size() * sizeof(double)));
}

TEST_CASE("error feedback over 3 steps follows the reference: Average, Sum, scaled Average") {
  dtrain::init();
  const int n = world_size();
  struct Variant {
    std::string name;
    dtrain::AllreduceOptions options;
    double factor;  // of the averaged result
  };
  const std::vector<Variant> variants{
      {"ef.average", {.op = ReduceOp::Average}, 1.0},
      {"ef.sum", {.op = ReduceOp::Sum}, static_cast<double>(n)},
      {"ef.scaled", {.op = ReduceOp::Average, .prescale = 0.5, .postscale = 3.0}, 1.5}};
  for (const auto& v : variants) {
    CAPTURE(v.name);
    auto hook = dtrain::powersgd_hook({.rank = 1, .start_step = 0, .seed = 3});
    auto plain =
        dtrain::powersgd_hook({.rank = 1, .start_step = 0, .error_feedback = false, .seed = 3});
    Gradient g(v.name, {16, 12}), h(v.name, {16, 12});
    Reference ref(16, 12, 1, true), ref_plain(16, 12, 1, false);
    for (int t = 0; t < 3; ++t) {
      CAPTURE(t);
      g.set(rank_gradient(world_rank(), 0, t, 192));
      h.set(g.get());
      run_bucket(*hook, {&g}, t, v.options);
      run_bucket(*plain, {&h}, t, v.options);
      const auto grads = every_rank(0, t, 192);
      const Matrix q0 = t == 0 ? ref.random_q(3, v.name, 0) : ref.q;
      const Matrix q0_plain = t == 0 ? ref_plain.random_q(3, v.name, 0) : ref_plain.q;
      const Matrix want = scaled(ref.step(grads, q0), v.factor);
      const Matrix want_plain = scaled(ref_plain.step(grads, q0_plain), v.factor);
      check_close(g.get(), want, 1e-9, "with error feedback");
      check_close(h.get(), want_plain, 1e-9, "without error feedback");
      // From the second step the two differ: the error carried over is what the check sees.
      if (t > 0) CHECK(max_rel_error(want, want_plain) > 1e-3);
    }
  }
}

TEST_CASE("warm start reuses the reduced Q; without it Q is drawn afresh each step") {
  dtrain::init();
  for (bool warm : {true, false}) {
    CAPTURE(warm);
    const std::string name = warm ? "warm.on" : "warm.off";
    auto hook = dtrain::powersgd_hook(
        {.rank = 2, .start_step = 0, .error_feedback = false, .warm_start = warm, .seed = 5});
    Gradient g(name, {16, 12});
    Reference ref(16, 12, 2, false);
    g.set(rank_gradient(world_rank(), 0, 0, 192));
    run_bucket(*hook, {&g}, 0);
    check_close(g.get(), ref.step(every_rank(0, 0, 192), ref.random_q(5, name, 0)), 1e-9,
                "first step");
    const Matrix first_q = ref.q;

    g.set(rank_gradient(world_rank(), 0, 1, 192));
    run_bucket(*hook, {&g}, 1);
    const auto grads = every_rank(0, 1, 192);
    Reference with_first_q = ref, with_fresh_q = ref;
    const Matrix from_first_q = with_first_q.step(grads, first_q);
    const Matrix from_fresh_q = with_fresh_q.step(grads, ref.random_q(5, name, 1));
    CHECK(max_rel_error(from_first_q, from_fresh_q) > 1e-3);  // the two Qs give different results
    check_close(g.get(), warm ? from_first_q : from_fresh_q, 1e-9, "second step");
  }
}

TEST_CASE("before start_step gradients are allreduced as they are") {
  dtrain::init();
  auto hook = dtrain::powersgd_hook({.rank = 1, .start_step = 2, .seed = 9});
  Gradient g("late", {16, 12});
  for (int t = 0; t < 2; ++t) {
    g.set(rank_gradient(world_rank(), 0, t, 192));
    Matrix plain = g.get();
    dtrain::allreduce(plain, {.name = "late.plain"});
    run_bucket(*hook, {&g}, t);
    CHECK(g.get() == plain);
  }
  // At start_step compression begins, with no error carried from the plain steps.
  g.set(rank_gradient(world_rank(), 0, 2, 192));
  run_bucket(*hook, {&g}, 2);
  Reference ref(16, 12, 1, true);
  check_close(g.get(), ref.step(every_rank(0, 2, 192), ref.random_q(9, "late", 2)), 1e-9,
              "first compressed step");
  CHECK(max_rel_error(g.get(), average_over_ranks(0, 2, 192)) > 1e-2);
}

TEST_CASE("a matrix of rank r on every rank comes back exactly from PowerSGD of rank r") {
  dtrain::init();
  const int n = world_size();
  // M = sum_c u_c v_c^T with r = 1 and r = 2, the same on every rank.
  for (int r : {1, 2}) {
    CAPTURE(r);
    const std::string name = "exact." + std::to_string(r);
    Matrix m(16 * 12, 0.0);
    for (int c = 0; c < r; ++c)
      for (int i = 0; i < 16; ++i)
        for (int j = 0; j < 12; ++j)
          m[i * 12 + j] += std::sin(0.5 * i + c + 0.2) * std::cos(0.3 * j - 2.0 * c);
    auto hook = dtrain::powersgd_hook({.rank = r, .start_step = 0, .seed = 1});
    Gradient g(name, {16, 12});
    for (int t = 0; t < 2; ++t) {  // the second step checks that the error stayed zero
      g.set(m);
      run_bucket(*hook, {&g}, t);
      check_close(g.get(), m, 1e-12, "Average of a rank-r matrix");
    }
    g.set(m);
    run_bucket(*hook, {&g}, 2, {.op = ReduceOp::Sum});
    check_close(g.get(), scaled(m, n), 1e-12, "Sum of a rank-r matrix");
  }
}

TEST_CASE("a zero gradient stays zero; the next step draws a new Q, not the zero one") {
  dtrain::init();
  auto hook = dtrain::powersgd_hook({.rank = 2, .start_step = 0, .seed = 6});
  Gradient g("zero", {16, 12});
  g.set(Matrix(192, 0.0));
  run_bucket(*hook, {&g}, 0);
  CHECK(g.get() == Matrix(192, 0.0));  // not NaN: nothing divided by a zero norm
  g.set(rank_gradient(world_rank(), 0, 1, 192));
  run_bucket(*hook, {&g}, 1);
  Reference ref(16, 12, 2, true);
  check_close(g.get(), ref.step(every_rank(0, 1, 192), ref.random_q(6, "zero", 1)), 1e-9,
              "the step after a zero gradient");
  CHECK(max_rel_error(g.get(), Matrix(192, 0.0)) > 1e-2);
}

TEST_CASE("buckets waited for in different orders on different ranks complete") {
  dtrain::init();
  // Rank 0 waits for A first, rank 1 for B: a hook that posted only its own bucket's Qs in wait()
  // would leave each rank waiting for the Qs the other has not posted yet.
  auto hook = dtrain::powersgd_hook({.rank = 1, .start_step = 0, .seed = 2});
  Gradient a("order.a", {16, 12}), b("order.b", {12, 16});
  a.set(rank_gradient(world_rank(), 0, 0, 192));
  b.set(rank_gradient(world_rank(), 1, 0, 192));
  auto bucket_of = [](Gradient& g) {
    GradientBucket bucket;
    bucket.gradients.push_back(g.view());
    bucket.names.push_back(g.name);
    return bucket;
  };
  auto pending_a = hook->start(bucket_of(a));
  auto pending_b = hook->start(bucket_of(b));
  if (world_rank() % 2 == 0) {
    pending_a->wait();
    pending_b->wait();
  } else {
    pending_b->wait();
    pending_a->wait();
  }
  Reference ra(16, 12, 1, true), rb(12, 16, 1, true);
  check_close(a.get(), ra.step(every_rank(0, 0, 192), ra.random_q(2, "order.a", 0)), 1e-9, "A");
  check_close(b.get(), rb.step(every_rank(1, 0, 192), rb.random_q(2, "order.b", 0)), 1e-9, "B");
}

namespace {

// Linear regression y = W x + b, W [6, 8], with hand-written gradients that carry their shapes,
// as the generic DistributedOptimizer hands them to the hook.
constexpr int kOut = 6, kIn = 8, kBatch = 2;
constexpr double kLr = 0.1;

struct Linear {
  Matrix w = Matrix(kOut * kIn), b = Matrix(kOut), gw = Matrix(kOut * kIn), gb = Matrix(kOut);
  Linear() {
    for (int i = 0; i < kOut * kIn; ++i) w[i] = 0.3 * std::sin(0.7 * i);
  }
  void step() {
    for (int i = 0; i < kOut * kIn; ++i) w[i] -= kLr * gw[i];
    for (int i = 0; i < kOut; ++i) b[i] -= kLr * gb[i];
  }
  std::vector<TensorView> gradients() {
    return {
        TensorView(gw.data(), kOut * kIn, DataType::float64, dtrain::Device::cpu(), {kOut, kIn}),
        TensorView(gb.data(), kOut, DataType::float64)};
  }
};

double input(std::int64_t s, int j) { return std::cos(0.91 * s + 1.7 * j); }
double target(std::int64_t s, int o) { return std::sin(0.43 * s - 0.8 * o); }

// Rank k's gradients at step t (mean over its kBatch samples).
void rank_gradients(const Linear& model, int k, int t, Matrix& gw, Matrix& gb) {
  gw.assign(kOut * kIn, 0.0);
  gb.assign(kOut, 0.0);
  for (int s = 0; s < kBatch; ++s) {
    const std::int64_t sample = (static_cast<std::int64_t>(t) * world_size() + k) * kBatch + s;
    for (int o = 0; o < kOut; ++o) {
      double err = model.b[o] - target(sample, o);
      for (int j = 0; j < kIn; ++j) err += model.w[o * kIn + j] * input(sample, j);
      gb[o] += err / kBatch;
      for (int j = 0; j < kIn; ++j) gw[o * kIn + j] += err * input(sample, j) / kBatch;
    }
  }
}

// `steps` steps of the optimizer from `from`, with `hook` (none: the plain average).
void train(Linear& model, int from, int steps, std::shared_ptr<dtrain::GradientHook> hook,
           const std::string& name) {
  dtrain::DistributedOptimizer<Linear> opt(model, {.name = name, .hook = std::move(hook)});
  for (int t = from; t < from + steps; ++t) {
    rank_gradients(model, world_rank(), t, model.gw, model.gb);
    CHECK(opt.step());
  }
}

}  // namespace

TEST_CASE("a DistributedOptimizer with the PowerSGD hook trains as the reference does") {
  dtrain::init();
  const int steps = 6, start = 2;
  Linear model;
  train(model, 0, steps, dtrain::powersgd_hook({.rank = 1, .start_step = start, .seed = 4}),
        "psgd");

  Linear ref;
  Reference w_ref(kOut, kIn, 1, true);
  for (int t = 0; t < steps; ++t) {
    std::vector<Matrix> gws(world_size()), gbs(world_size());
    for (int k = 0; k < world_size(); ++k) rank_gradients(ref, k, t, gws[k], gbs[k]);
    ref.gw.assign(kOut * kIn, 0.0);
    ref.gb.assign(kOut, 0.0);
    for (int k = 0; k < world_size(); ++k) {
      for (int i = 0; i < kOut * kIn; ++i) ref.gw[i] += gws[k][i] / world_size();
      for (int i = 0; i < kOut; ++i) ref.gb[i] += gbs[k][i] / world_size();
    }
    if (t >= start)  // W's name: the group's name and its place among the gradients
      ref.gw = w_ref.step(gws, t == start ? w_ref.random_q(4, "psgd.0", t) : w_ref.q);
    ref.step();
  }
  check_close(model.w, ref.w, 1e-9, "W");
  check_close(model.b, ref.b, 1e-9, "b");
  Linear uncompressed;
  train(uncompressed, 0, steps, nullptr, "psgd_plain");
  CHECK(max_rel_error(model.w, uncompressed.w) > 1e-4);
}

TEST_CASE("PowerSGD state saved in a checkpoint continues bit for bit") {
  dtrain::init();
  const PowerSGDOptions o{.rank = 1, .start_step = 1, .seed = 8};
  const int total = 6, cut = 3;
  Linear whole;
  train(whole, 0, total, dtrain::powersgd_hook(o), "ckpt");

  checkpoint_test::SharedTempDir dir;
  {
    Linear first;
    auto hook = dtrain::powersgd_hook(o);
    train(first, 0, cut, hook, "ckpt");
    dtrain::Checkpoint checkpoint({.directory = dir.path().string()});
    checkpoint.save({.step = cut},
                    {{"w", first.w}, {"b", first.b}, {"powersgd", hook->gather_state()}});
    checkpoint.wait();
  }
  // A new process would start here: a new model, hook and optimizer (whose count starts at 0).
  auto resume = [&](bool with_state) {
    Linear model;
    auto hook = dtrain::powersgd_hook(o);
    dtrain::Checkpoint checkpoint({.directory = dir.path().string()});
    auto restored = checkpoint.restore();
    REQUIRE(restored);
    restored->load("w", model.w);
    restored->load("b", model.b);
    if (with_state) hook->load_state(restored->get<dtrain::PowerSGDState>("powersgd"));
    dtrain::DistributedOptimizer<Linear> opt(model, {.name = "ckpt", .hook = hook});
    for (int t = cut; t < total; ++t) {
      rank_gradients(model, world_rank(), t, model.gw, model.gb);
      CHECK(opt.step());
    }
    return model;
  };
  const Linear resumed = resume(true);
  CHECK(resumed.w == whole.w);
  CHECK(resumed.b == whole.b);
  // Without its state the hook starts over (plain steps, a new Q, no errors): not the same run.
  CHECK(resume(false).w != whole.w);
}

TEST_CASE("load_state: errors carry per rank on the same world size, averaged on another") {
  dtrain::init();
  const int n = world_size();
  auto hook = dtrain::powersgd_hook({.rank = 1});
  auto state_of = [&](int saved_world, bool summed) {
    dtrain::PowerSGDState s;
    s.rank = 1;
    s.world_size = saved_world;
    s.step = 17;
    auto& m = s.matrices["state.w"];
    m = {4, 3, 1, summed, {1.0, 2.0, 3.0}, {}};
    for (int k = 0; k < saved_world; ++k) m.errors.push_back(Matrix(12, k + 1.0));
    return s;
  };
  hook->load_state(state_of(n, false));
  auto got = hook->gather_state();
  CHECK(got.step == 17);
  CHECK(got.matrices.at("state.w").q == Matrix{1.0, 2.0, 3.0});
  for (int k = 0; k < n; ++k) CHECK(got.matrices.at("state.w").errors[k] == Matrix(12, k + 1.0));

  // One more rank saved it: the mean (Average) keeps the averaged residual, the sum over the new
  // count (Sum) keeps the summed one.
  const double total = (n + 1) * (n + 2) / 2.0;
  for (bool summed : {false, true}) {
    CAPTURE(summed);
    hook->load_state(state_of(n + 1, summed));
    got = hook->gather_state();
    const double want = summed ? total / n : total / (n + 1);
    for (int k = 0; k < n; ++k)
      check_close(got.matrices.at("state.w").errors[k], Matrix(12, want), 1e-15, "error");
  }
}

TEST_CASE("PowerSGD refuses bad options, ops other than Average and Sum, and device gradients") {
  dtrain::init();
  auto refuses = [](PowerSGDOptions o, const char* what) {
    CHECK_THROWS_WITH_AS(dtrain::powersgd_hook(o), doctest::Contains(what), InvalidArgumentError);
  };
  const double nan = std::nan(""), inf = INFINITY;
  refuses({.rank = 0}, "PowerSGDOptions::rank = 0");
  refuses({.rank = -2}, "PowerSGDOptions::rank = -2");
  refuses({.start_step = -1}, "PowerSGDOptions::start_step = -1");
  for (double v : {-1.0, nan, inf})
    refuses({.min_compression_rate = v}, "PowerSGDOptions::min_compression_rate");
  for (double v : {-1e-8, nan, inf})
    refuses({.orthogonalization_epsilon = v}, "PowerSGDOptions::orthogonalization_epsilon");

  auto hook = dtrain::powersgd_hook({.rank = 1, .start_step = 0});
  Gradient g("refused", {16, 12});
  g.set(Matrix(192, 1.0));
  for (ReduceOp op : {ReduceOp::Min, ReduceOp::Max, ReduceOp::Product}) {
    CHECK_THROWS_WITH_AS(run_bucket(*hook, {&g}, 0, {.op = op}),
                         doctest::Contains(fmt::format("ReduceOp::{}", op).c_str()),
                         InvalidArgumentError);
  }
  // A view that says CUDA over host memory: refused before anything reads it, in every phase.
  for (std::int64_t step : {0, 5}) {
    auto late = dtrain::powersgd_hook({.start_step = 3});
    GradientBucket bucket;
    bucket.gradients.push_back(
        TensorView(g.d.data(), 192, DataType::float64, dtrain::Device::cuda(0), {16, 12}));
    bucket.names.push_back("on_device");
    bucket.step = step;
    CHECK_THROWS_WITH_AS(
        late->start(std::move(bucket)),
        doctest::Contains("'on_device' is on cuda:0: PowerSGD is built for host gradients"),
        InvalidArgumentError);
  }
  // The same gradient twice in flight.
  Gradient twice("twice", {16, 12});
  twice.set(Matrix(192, 1.0));
  CHECK_THROWS_WITH_AS(run_bucket(*hook, {&twice, &twice}, 0), doctest::Contains("'twice'"),
                       InvalidArgumentError);
  // A state of another rank.
  dtrain::PowerSGDState other;
  other.rank = 3;
  other.world_size = 1;
  CHECK_THROWS_WITH_AS(hook->load_state(other), doctest::Contains("rank 3"), InvalidArgumentError);
}

TEST_CASE("settings() names every option, and ranks with different settings fail together") {
  dtrain::init();
  const auto s = dtrain::PowerSGDHook({.rank = 2,
                                       .start_step = 5,
                                       .min_compression_rate = 1.5,
                                       .error_feedback = false,
                                       .warm_start = true,
                                       .seed = 7,
                                       .orthogonalization_epsilon = 1e-8})
                     .settings();
  for (const char* part :
       {"powersgd", "rank=2", "start_step=5", "min_compression_rate=1.5", "error_feedback=false",
        "warm_start=true", "seed=7", "orthogonalization_epsilon=1e-08"})
    CHECK_MESSAGE(s.find(part) != std::string::npos, s);
  if (world_size() < 2) return;
  const bool last = world_rank() == world_size() - 1;
  Linear model;
  auto make_and_step = [&] {  // the optimizer compares the hooks when it is made
    dtrain::DistributedOptimizer<Linear> opt(
        model, {.name = "mixed_powersgd", .hook = dtrain::powersgd_hook({.rank = last ? 2 : 1})});
    rank_gradients(model, world_rank(), 0, model.gw, model.gb);
    opt.step();
  };
  const std::string want = fmt::format("rank(s) {} differ from rank 0", world_size() - 1);
  CHECK_THROWS_WITH_AS(make_and_step(), doctest::Contains(want.c_str()), InvalidArgumentError);
}
