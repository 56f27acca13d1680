// GradientBuffer: persistent views laid out so that a fused allreduce of them reduces them where
// they are (Note [Gradients in fusion memory]). Checked: the layout, the results against closed
// forms (Sum, Average, predivide), and that a fused sync of its views allocates no fusion buffer
// while the same sync of separate vectors does.
#include <doctest/doctest.h>
#include <mpi.h>

#include <cstdint>
#include <span>
#include <vector>

#include <fmt/format.h>

#include "dtrain/dtrain.hpp"
#include "support/world.hpp"

namespace {

using dtrain::GradientBuffer;
using dtrain::GradientLayout;
using dtrain::ReduceOp;
using dtrain_test_support::world_rank;
using dtrain_test_support::world_size;

// Small and large (>= 1 MiB of float) gradients interleaved, in backward order; odd counts.
const std::vector<std::int64_t> kSizes = {7, 300007, 1001, 33, 262145, 5, 4099};

double value(int rank, std::size_t t, std::int64_t i) {
  return static_cast<double>((rank + 1) * 4 + static_cast<int>(t) + static_cast<int>(i % 7));
}

// Fills every gradient, reduces them (grouped: one fused response; else one op each, in order)
// and checks them against the closed form.
template <class Span>
void sync_and_check(std::vector<Span> grads, dtrain::AllreduceOptions options, bool grouped,
                    const std::string& what) {
  const int rank = world_rank(), size = world_size();
  for (std::size_t t = 0; t < grads.size(); ++t)
    for (std::size_t i = 0; i < grads[t].size(); ++i)
      grads[t][i] = static_cast<float>(value(rank, t, static_cast<std::int64_t>(i)));
  if (grouped) {
    dtrain::grouped_allreduce(grads, options);
  } else {
    std::vector<dtrain::Handle> handles;
    for (std::size_t t = 0; t < grads.size(); ++t) {
      auto o = options;
      o.name = fmt::format("{}.{}", options.name, t);
      handles.push_back(dtrain::allreduce_async(grads[t], o));
    }
    for (auto& h : handles) h.wait();
  }
  std::int64_t bad = 0;
  for (std::size_t t = 0; t < grads.size(); ++t) {
    for (std::size_t i = 0; i < grads[t].size(); ++i) {
      double sum = 0;
      for (int k = 0; k < size; ++k) sum += options.prescale * value(k, t, static_cast<std::int64_t>(i));
      if (options.op == ReduceOp::Average) sum /= size;
      const double want = sum * options.postscale;
      if (std::abs(grads[t][i] - want) > 1e-6 * std::abs(want)) ++bad;
    }
  }
  CHECK_MESSAGE(bad == 0, fmt::format("rank {}: {}: {} elements wrong", rank, what, bad));
}

}  // namespace

TEST_CASE("GradientBuffer lays out persistent views") {
  for (GradientLayout layout : {GradientLayout::in_order, GradientLayout::large_last}) {
    GradientBuffer<float> b(kSizes, layout);
    REQUIRE(b.count() == kSizes.size());
    std::int64_t total = 0;
    for (std::size_t i = 0; i < kSizes.size(); ++i) {
      CHECK(static_cast<std::int64_t>(b.view(i).size()) == kSizes[i]);
      total += kSizes[i];
    }
    CHECK(b.total_numel() == total);
    CHECK(b.flat().size() == static_cast<std::size_t>(total));
    const float* p0 = b.view(0).data();
    CHECK(p0 == b.flat().data());
    if (layout == GradientLayout::in_order) {
      for (std::size_t i = 1; i < kSizes.size(); ++i)
        CHECK(b.view(i).data() == b.view(i - 1).data() + kSizes[i - 1]);
    } else {
      // The small ones back to back in order, then the large ones in order.
      CHECK(b.view(2).data() == b.view(0).data() + 7);
      CHECK(b.view(3).data() == b.view(2).data() + 1001);
      CHECK(b.view(5).data() == b.view(3).data() + 33);
      CHECK(b.view(6).data() == b.view(5).data() + 5);
      CHECK(b.view(1).data() == b.view(6).data() + 4099);
      CHECK(b.view(4).data() == b.view(1).data() + 300007);
    }
  }
  CHECK_THROWS_AS(GradientBuffer<float>({3, -1}, GradientLayout::in_order),
                  dtrain::InvalidArgumentError);
  GradientBuffer<float> b({3}, GradientLayout::in_order);
  CHECK_THROWS_WITH_AS(b.view(1), doctest::Contains("holds 1 gradients"), dtrain::InvalidArgumentError);
}

TEST_CASE("GradientBuffer views reduce to the closed forms") {
  dtrain::init();
  GradientBuffer<float> b(kSizes);
  std::vector<std::span<float>> views;
  for (std::size_t i = 0; i < b.count(); ++i) views.push_back(b.view(i));
  sync_and_check(views, {.op = ReduceOp::Sum, .name = "gb.sum"}, true, "grouped Sum");
  sync_and_check(views, {.op = ReduceOp::Average, .name = "gb.avg"}, true, "grouped Average");
  sync_and_check(views, {.op = ReduceOp::Average, .prescale = 0.25, .postscale = 4.0, .name = "gb.pre"},
                 true, "grouped predivide");
  sync_and_check(views, {.op = ReduceOp::Average, .name = "gb.async"}, false, "async Average");
  for (GradientLayout layout : {GradientLayout::in_order, GradientLayout::large_last}) {
    GradientBuffer<float> other(kSizes, layout);
    std::vector<std::span<float>> v;
    for (std::size_t i = 0; i < other.count(); ++i) v.push_back(other.view(i));
    sync_and_check(v, {.op = ReduceOp::Average, .name = "gb.layout"}, true, "either layout");
  }
}

TEST_CASE("a fused sync of GradientBuffer views copies nothing; of separate vectors it packs") {
  // A fresh runtime, so its buffer counters start at zero.
  dtrain::shutdown();
  dtrain::init();
  GradientBuffer<float> b(kSizes);
  std::vector<std::span<float>> views;
  for (std::size_t i = 0; i < b.count(); ++i) views.push_back(b.view(i));
  const auto before = dtrain::engine_stats();
  sync_and_check(views, {.op = ReduceOp::Sum, .name = "gb.nocopy"}, true, "in fusion memory");
  const auto after = dtrain::engine_stats();
  CHECK(after.fused_collectives > before.fused_collectives);
  CHECK_MESSAGE(after.buffer_allocations == before.buffer_allocations,
                "a fused sync of GradientBuffer views allocated a fusion buffer");

  std::vector<std::vector<float>> separate;
  for (auto n : kSizes) separate.emplace_back(static_cast<std::size_t>(n));
  std::vector<std::span<float>> spans(separate.begin(), separate.end());
  sync_and_check(spans, {.op = ReduceOp::Sum, .name = "gb.copy"}, true, "separate vectors");
  CHECK_MESSAGE(dtrain::engine_stats().buffer_allocations > after.buffer_allocations,
                "separate vectors were expected to be packed into the fusion buffer");
}

TEST_CASE("GradientLayout::automatic needs a running runtime") {
  dtrain::shutdown();
  CHECK_THROWS_WITH_AS(GradientBuffer<float>({3, 4}), doctest::Contains("dtrain::init() first"),
                       dtrain::Error);
}
