// Negotiation across processes: ops matched by name whatever each rank's submission order,
// grouped ops, duplicate names, and mismatches surfacing on every rank.
#include <numeric>
#include <random>

#include "engine_test.hpp"

namespace {

using namespace dtrain;
using dtrain::test::Buffer;
using dtrain::test::contains;

// A value every dtype holds exactly, also after summing over 4 ranks and averaging.
double value(int rank, int tensor, std::int64_t i) {
  return (rank + 1) * ((tensor % 5) + (i % 3));
}

// The exact result of reducing value(r, tensor, i) over `size` ranks.
double expected(int size, int tensor, std::int64_t i, ReduceOp op) {
  const double base = (tensor % 5) + (i % 3);
  const double sum = base * size * (size + 1) / 2.0;
  return op == ReduceOp::Average ? sum / size : sum;
}

}  // namespace

TEST_CASE("ops submitted in a different order on every rank are matched by name") {
  test::Initialized dt;
  const int rank = dtrain::rank(), size = dtrain::size();
  constexpr int count = 200;
  std::vector<Buffer> tensors;
  std::vector<ReduceOp> ops;
  for (int t = 0; t < count; ++t) {
    const DataType dtype = test::all_dtypes[t % std::size(test::all_dtypes)];
    Buffer b(dtype, 1 + (t * 7) % 37);
    for (std::int64_t i = 0; i < b.size(); ++i) b.set(i, value(rank, t, i));
    tensors.push_back(std::move(b));
    ops.push_back(is_floating_point(dtype) ? ReduceOp::Average : ReduceOp::Sum);
  }
  std::vector<int> order(count);
  std::iota(order.begin(), order.end(), 0);
  std::mt19937 rng(1234 + rank);
  std::shuffle(order.begin(), order.end(), rng);

  std::vector<Handle> handles(count);
  for (int t : order) {
    auto view = tensors[t].view();
    handles[t] = allreduce_async(view, {.op = ops[t], .name = "ooo." + std::to_string(t)});
  }
  for (auto& h : handles) h.wait();

  int wrong = 0;
  for (int t = 0; t < count; ++t)
    for (std::int64_t i = 0; i < tensors[t].size(); ++i)
      if (!test::close(tensors[t].get(i), expected(size, t, i, ops[t]), tensors[t].dtype())) {
        if (wrong++ < 5)
          FAIL_CHECK("tensor " << t << " (" << to_string(tensors[t].dtype()) << ") element " << i
                               << ": " << tensors[t].get(i) << " != " << expected(size, t, i, ops[t]));
      }
  CHECK(wrong == 0);
}

TEST_CASE("unnamed ops are matched by their per-kind call count") {
  test::Initialized dt;
  const int size = dtrain::size();
  std::vector<float> a(5, 1.0f), b(3, 2.0f);
  std::vector<double> c(2, static_cast<double>(dtrain::rank()));
  auto ha = allreduce_async(a, {.op = ReduceOp::Sum});
  auto hc = broadcast_async(c, size - 1);
  auto hb = allreduce_async(b, {.op = ReduceOp::Sum});
  ha.wait();
  hb.wait();
  hc.wait();
  CHECK(a == std::vector<float>(5, static_cast<float>(size)));
  CHECK(b == std::vector<float>(3, 2.0f * size));
  CHECK(c == std::vector<double>(2, size - 1.0));
}

TEST_CASE("grouped allreduce") {
  test::Initialized dt;
  const int rank = dtrain::rank(), size = dtrain::size();
  const std::vector<std::size_t> sizes = {3, 100, 1, 50, 7};

  SUBCASE("members complete together, fused into one collective") {
    std::vector<std::vector<float>> group;
    for (std::size_t k = 0; k < sizes.size(); ++k)
      group.emplace_back(sizes[k], static_cast<float>((rank + 1) * (k + 1)));
    const auto before = engine_stats();
    grouped_allreduce(group, {.op = ReduceOp::Sum, .name = "grp"});
    const auto after = engine_stats();
    for (std::size_t k = 0; k < sizes.size(); ++k)
      CHECK(group[k] == std::vector<float>(sizes[k], static_cast<float>(size * (size + 1) / 2 * (k + 1))));
    CHECK(after.collectives - before.collectives == 1);
    CHECK(after.fused_collectives - before.fused_collectives == 1);
  }

  SUBCASE("groups submitted in different orders on different ranks") {
    std::vector<std::vector<double>> ga, gb;
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      ga.emplace_back(sizes[k], rank + 1.0);
      gb.emplace_back(sizes[k], 10.0 * (rank + 1));
    }
    Handle ha, hb;
    if (rank % 2 == 0) {
      ha = grouped_allreduce_async(ga, {.name = "ga"});
      hb = grouped_allreduce_async(gb, {.name = "gb"});
    } else {
      hb = grouped_allreduce_async(gb, {.name = "gb"});
      ha = grouped_allreduce_async(ga, {.name = "ga"});
    }
    ha.wait();
    hb.wait();
    const double avg = (size + 1) / 2.0;
    for (std::size_t k = 0; k < sizes.size(); ++k)
      for (std::size_t i = 0; i < sizes[k]; ++i) {
        CHECK(ga[k][i] == doctest::Approx(avg));
        CHECK(gb[k][i] == doctest::Approx(10.0 * avg));
      }
  }

  SUBCASE("members of different dtypes") {
    std::vector<float> f(4, 1.5f);
    std::vector<double> d(6, 2.5);
    std::vector<std::int32_t> i(3, rank);
    std::vector<TensorView> views = {TensorView(f.data(), 4), TensorView(d.data(), 6),
                                     TensorView(i.data(), 3)};
    grouped_allreduce(views, {.op = ReduceOp::Sum, .name = "mixed"});
    CHECK(f == std::vector<float>(4, 1.5f * size));
    CHECK(d == std::vector<double>(6, 2.5 * size));
    CHECK(i == std::vector<std::int32_t>(3, size * (size - 1) / 2));
  }
}

TEST_CASE("a name already in flight on this rank is refused; the op in flight is unaffected") {
  test::Initialized dt;
  const int rank = dtrain::rank(), size = dtrain::size();
  // The late rank submits only after the others have tried the duplicate, so their first op is
  // certainly still in flight. Two rounds let every rank of a 2-rank job be early once.
  for (int late : {size - 1, 0}) {
    CAPTURE(late);
    const std::string name = "dup." + std::to_string(late);
    std::vector<float> first(8, rank + 1.0f), second(8, -1.0f);
    Handle h;
    if (rank != late) {
      h = allreduce_async(first, {.op = ReduceOp::Sum, .name = name});
      try {
        allreduce_async(second, {.op = ReduceOp::Sum, .name = name});
        FAIL_CHECK("a second in-flight op named '" << name << "' was accepted");
      } catch (const InvalidArgumentError& e) {
        CHECK(contains(e.what(), "'" + name + "'"));
        CHECK(contains(e.what(), "already in flight"));
      }
      MPI_Barrier(MPI_COMM_WORLD);
    } else {
      MPI_Barrier(MPI_COMM_WORLD);
      h = allreduce_async(first, {.op = ReduceOp::Sum, .name = name});
    }
    h.wait();
    CHECK(first == std::vector<float>(8, size * (size + 1) / 2.0f));
    CHECK(second == std::vector<float>(8, -1.0f));  // the refused op never touched its tensor
  }
  // The name is free again once the op completed.
  std::vector<float> again(2, 1.0f);
  allreduce(again, {.op = ReduceOp::Sum, .name = "dup.0"});
  CHECK(again == std::vector<float>(2, static_cast<float>(size)));
}

TEST_CASE("a group with a member name already in flight is refused as a whole") {
  test::Initialized dt;
  const int rank = dtrain::rank(), size = dtrain::size();
  const bool late = rank == size - 1;  // submits only after the others tried, as above
  std::vector<float> a(2, 1.0f);
  Handle h;
  if (!late) {
    h = allreduce_async(a, {.op = ReduceOp::Sum, .name = "clash.1"});
    std::vector<std::vector<float>> group(2, std::vector<float>(2, 1.0f));
    CHECK_THROWS_AS(grouped_allreduce_async(group, {.name = "clash"}), InvalidArgumentError);
    MPI_Barrier(MPI_COMM_WORLD);
  } else {
    MPI_Barrier(MPI_COMM_WORLD);
    h = allreduce_async(a, {.op = ReduceOp::Sum, .name = "clash.1"});
  }
  // Nothing of the refused group was submitted: "clash.0" is free.
  std::vector<float> b(2, 1.0f);
  auto hb = allreduce_async(b, {.op = ReduceOp::Sum, .name = "clash.0"});
  h.wait();
  hb.wait();
  CHECK(a == std::vector<float>(2, static_cast<float>(dtrain::size())));
  CHECK(b == std::vector<float>(2, static_cast<float>(dtrain::size())));
}

TEST_CASE("every kind of mismatch raises MismatchError on every rank, and the engine goes on") {
  test::Initialized dt;
  const int rank = dtrain::rank(), size = dtrain::size();
  const bool odd = rank == size - 1;  // the one rank that disagrees

  auto expect_mismatch = [&](const std::string& name, const std::string& field, auto&& submit) {
    CAPTURE(name);
    try {
      submit();
      FAIL_CHECK("no error for mismatched op '" << name << "'");
    } catch (const MismatchError& e) {
      const std::string what = e.what();
      CAPTURE(what);
      CHECK(contains(what, "'" + name + "'"));
      CHECK(contains(what, field));
      CHECK(contains(what, "on ranks [" + std::to_string(size - 1) + "]"));
    }
    // The engine keeps working after a failed op.
    std::vector<float> ok(3, 1.0f);
    allreduce(ok, {.op = ReduceOp::Sum, .name = name + ".after"});
    CHECK(ok == std::vector<float>(3, static_cast<float>(size)));
  };

  expect_mismatch("m.kind", "op kind", [&] {
    std::vector<float> v(4, 1.0f);
    if (odd) broadcast(v, 0, "m.kind");
    else allreduce(v, {.name = "m.kind"});
  });
  expect_mismatch("m.dtype", "dtype", [&] {
    std::vector<float> f(4, 1.0f);
    std::vector<double> d(4, 1.0);
    if (odd) allreduce(d, {.name = "m.dtype"});
    else allreduce(f, {.name = "m.dtype"});
  });
  expect_mismatch("m.shape", "shape", [&] {
    std::vector<float> v(odd ? 5 : 4, 1.0f);
    allreduce(v, {.name = "m.shape"});
  });
  expect_mismatch("m.shape2d", "shape", [&] {
    std::vector<float> v(6, 1.0f);
    TensorView t(v.data(), 6, DataType::float32, Device::cpu(), odd ? Shape{3, 2} : Shape{2, 3});
    allreduce(t, {.name = "m.shape2d"});
  });
  expect_mismatch("m.gather", "shape beyond dim 0", [&] {
    std::vector<float> v(12, 1.0f);
    TensorView t(v.data(), 12, DataType::float32, Device::cpu(), odd ? Shape{3, 4} : Shape{4, 3});
    (void)allgather(t, "m.gather");
  });
  expect_mismatch("m.root", "root rank", [&] {
    std::vector<float> v(4, 1.0f);
    broadcast(v, odd ? 1 : 0, "m.root");
  });
  expect_mismatch("m.op", "reduce op", [&] {
    std::vector<float> v(4, 1.0f);
    allreduce(v, {.op = odd ? ReduceOp::Max : ReduceOp::Sum, .name = "m.op"});
  });
  expect_mismatch("m.prescale", "prescale", [&] {
    std::vector<float> v(4, 1.0f);
    allreduce(v, {.prescale = odd ? 0.5 : 1.0, .name = "m.prescale"});
  });
  expect_mismatch("m.postscale", "postscale", [&] {
    std::vector<float> v(4, 1.0f);
    allreduce(v, {.postscale = odd ? 2.0 : 1.0, .name = "m.postscale"});
  });
  expect_mismatch("m.group.1", "shape", [&] {
    std::vector<std::vector<float>> members = {std::vector<float>(4, 1.0f),
                                               std::vector<float>(odd ? 3 : 5, 1.0f)};
    grouped_allreduce(members, {.name = "m.group"});
  });
  expect_mismatch("m.rs", "shape", [&] {
    std::vector<float> v(odd ? 6 : 4, 1.0f);
    (void)reducescatter(v, ReduceOp::Sum, "m.rs");
  });
}

TEST_CASE("a mismatch inside a burst fails only that op") {
  test::Initialized dt;
  const int rank = dtrain::rank(), size = dtrain::size();
  std::vector<std::vector<float>> good(10, std::vector<float>(16, 1.0f));
  std::vector<float> bad(rank == 0 ? 8 : 9, 1.0f);
  std::vector<Handle> hs;
  for (int k = 0; k < 5; ++k)
    hs.push_back(allreduce_async(good[k], {.op = ReduceOp::Sum, .name = "burst." + std::to_string(k)}));
  auto hbad = allreduce_async(bad, {.op = ReduceOp::Sum, .name = "burst.bad"});
  for (int k = 5; k < 10; ++k)
    hs.push_back(allreduce_async(good[k], {.op = ReduceOp::Sum, .name = "burst." + std::to_string(k)}));
  for (auto& h : hs) h.wait();
  CHECK_THROWS_AS(hbad.wait(), MismatchError);
  for (const auto& g : good) CHECK(g == std::vector<float>(16, static_cast<float>(size)));
  CHECK(bad == std::vector<float>(bad.size(), 1.0f));
}

TEST_CASE("local misuse is refused at submission, before any negotiation") {
  test::Initialized dt;
  const int size = dtrain::size();
  std::vector<std::int32_t> ints(4, 1);
  CHECK_THROWS_AS(allreduce_async(ints, {.op = ReduceOp::Average, .name = "int.avg"}),
                  InvalidArgumentError);
  std::vector<float> v(4, 1.0f);
  CHECK_THROWS_AS(broadcast_async(v, size, "bad.root"), InvalidArgumentError);
  CHECK_THROWS_AS(alltoall_async(v, std::vector<int>(size + 1, 0), "bad.splits"), InvalidArgumentError);
  // Every rank refused the same names, so they are settled: using them now starts new ops.
  allreduce(v, {.op = ReduceOp::Sum, .name = "int.avg"});
  CHECK(v == std::vector<float>(4, static_cast<float>(size)));
}

TEST_CASE("shutdown fails an op that the other ranks never submitted, naming them") {
  dtrain::init(Config::from_env());
  const int rank = dtrain::rank(), size = dtrain::size();
  std::vector<float> v(2, 1.0f);
  Handle h;
  if (rank == 0) h = allreduce_async(v, {.name = "orphan"});
  dtrain::shutdown();
  if (rank != 0) return;
  REQUIRE(h.poll());  // shutdown() returned, so the op has been failed already
  try {
    h.wait();
    FAIL_CHECK("an op that only rank 0 submitted completed");
  } catch (const ShutdownError& e) {
    const std::string what = e.what();
    CAPTURE(what);
    CHECK(contains(what, "'orphan'"));
    CHECK(contains(what, "dtrain::shutdown()"));
    // It names the ranks that had shut down when the op was failed: some of ranks 1..size-1.
    const auto open = what.find("ranks [");
    REQUIRE(open != std::string::npos);
    const std::string named = what.substr(open + 7, what.find(']', open) - open - 7);
    CAPTURE(named);
    CHECK(!named.empty());
    CHECK(!contains(named, "0"));
    CHECK(std::stoi(named) < size);
  }
  CHECK(v == std::vector<float>(2, 1.0f));
}
