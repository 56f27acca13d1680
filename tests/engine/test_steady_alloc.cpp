// Steady state allocates nothing large: after warm-up, a training-like loop over a ResNet-50-like
// gradient list (shapes scaled down to keep the test fast) grows no fusion or scratch buffer and
// makes no heap allocation of 64 KiB or more through operator new.
#include <atomic>
#include <cstdlib>
#include <new>

#include <sys/resource.h>

#include "engine_test.hpp"

// ---- counting operator new/delete for this binary ----------------------------------------------
// Sanitizers replace operator new themselves; under them only the engine's own counter is checked.
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#define DTRAIN_TEST_COUNTS_ALLOCATIONS 1
namespace {
constexpr std::size_t kLarge = 64 * 1024;
std::atomic<bool> counting{false};
std::atomic<std::uint64_t> large_allocations{0};
std::atomic<std::size_t> largest{0};

void* counted(std::size_t n, std::size_t align) {
  if (counting.load(std::memory_order_relaxed) && n >= kLarge) {
    large_allocations.fetch_add(1);
    std::size_t cur = largest.load();
    while (n > cur && !largest.compare_exchange_weak(cur, n)) {
    }
  }
  void* p = align <= alignof(std::max_align_t)
                ? std::malloc(n == 0 ? 1 : n)
                : std::aligned_alloc(align, (std::max<std::size_t>(n, 1) + align - 1) / align * align);
  return p;
}
// Out of line, so the compiler does not pair an inlined free() with operator new and warn.
[[gnu::noinline]] void release(void* p) noexcept { std::free(p); }
}  // namespace

void* operator new(std::size_t n) {
  if (void* p = counted(n, 0)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) {
  if (void* p = counted(n, 0)) return p;
  throw std::bad_alloc();
}
void* operator new(std::size_t n, std::align_val_t a) {
  if (void* p = counted(n, static_cast<std::size_t>(a))) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n, std::align_val_t a) {
  if (void* p = counted(n, static_cast<std::size_t>(a))) return p;
  throw std::bad_alloc();
}
void* operator new(std::size_t n, const std::nothrow_t&) noexcept { return counted(n, 0); }
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept { return counted(n, 0); }
void* operator new(std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  return counted(n, static_cast<std::size_t>(a));
}
void* operator new[](std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  return counted(n, static_cast<std::size_t>(a));
}
void operator delete(void* p) noexcept { release(p); }
void operator delete[](void* p) noexcept { release(p); }
void operator delete(void* p, std::size_t) noexcept { release(p); }
void operator delete[](void* p, std::size_t) noexcept { release(p); }
void operator delete(void* p, std::align_val_t) noexcept { release(p); }
void operator delete[](void* p, std::align_val_t) noexcept { release(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { release(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { release(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { release(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { release(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { release(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { release(p); }
#endif

namespace {

using namespace dtrain;

long minor_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

// Element counts of a ResNet-50-like parameter list: the stem, two bottleneck blocks per stage
// (1x1 reduce, 3x3, 1x1 expand convolutions and their batch-norm scales), the classifier.
// Convolution and classifier weights are divided by 16 to keep the test quick.
std::vector<std::int64_t> resnet_like_sizes() {
  std::vector<std::int64_t> sizes = {64 * 3 * 7 * 7 / 16, 64, 64};
  std::int64_t in = 64;
  for (auto [mid, out] : {std::pair<std::int64_t, std::int64_t>{64, 256}, {128, 512}, {256, 1024}, {512, 2048}}) {
    for (int block = 0; block < 2; ++block) {
      sizes.insert(sizes.end(), {in * mid / 16, mid, mid, mid * mid * 9 / 16, mid, mid,
                                 mid * out / 16, out, out});
      in = out;
    }
  }
  sizes.insert(sizes.end(), {2048 * 1000 / 16, 1000});
  return sizes;
}

}  // namespace

TEST_CASE("steady-state steps grow no buffer and make no large allocation") {
  test::Initialized dt;
  const int rank = dtrain::rank(), size = dtrain::size();
  const auto sizes = resnet_like_sizes();
  const int count = static_cast<int>(sizes.size());
  std::vector<std::vector<float>> grads;
  for (auto n : sizes) grads.emplace_back(static_cast<std::size_t>(n), 0.0f);
  std::vector<std::string> names;
  for (int t = 0; t < count; ++t) names.push_back(fmt::format("resnet.grad.{}", t));
  std::vector<Handle> handles(static_cast<std::size_t>(count));

  auto step = [&](int s) {
    for (auto& g : grads) std::fill(g.begin(), g.end(), static_cast<float>(rank + s));
    for (int t = count - 1; t >= 0; --t)  // backward order
      handles[t] = allreduce_async(grads[t], {.name = names[t]});
    for (auto& h : handles) h.wait();
  };

  // Warm-up. One grouped reduction of the whole list makes the largest fused batch happen now;
  // afterwards the batches of a step are subsets of it, however the timing splits them.
  {
    std::vector<std::span<float>> all;
    for (auto& g : grads) all.emplace_back(g);
    grouped_allreduce(all, {.name = "warmup"});
  }
  for (int s = 0; s < 3; ++s) step(s);

  const auto before = engine_stats();
#ifdef DTRAIN_TEST_COUNTS_ALLOCATIONS
  large_allocations = 0;
  counting = true;
#endif
  constexpr int steps = 8;
  const long faults_before = minor_faults();
  for (int s = 0; s < steps; ++s) step(s);
  const long faults = minor_faults() - faults_before;
#ifdef DTRAIN_TEST_COUNTS_ALLOCATIONS
  counting = false;
#endif
  const auto after = engine_stats();

  CHECK(after.buffer_allocations == before.buffer_allocations);
  // Reported, not asserted: with 3 or more ranks MPICH's own per-call scratch (malloc'd at the
  // size of each message) faults pages in when consecutive messages differ in size, as fused
  // batches do; that is the MPI library's memory, not the engine's.
  std::int64_t grad_bytes = 0;
  for (auto n : sizes) grad_bytes += n * 4;
  MESSAGE("minor page faults over " << steps << " steady steps: " << faults << " (gradients: "
                                    << grad_bytes / 4096 << " pages per step)");
  CHECK(after.buffer_allocations > 0);  // the fused path did run and own a buffer
  CHECK(after.collectives - before.collectives > 0);
#ifdef DTRAIN_TEST_COUNTS_ALLOCATIONS
  CAPTURE(largest.load());
  CHECK(large_allocations.load() == 0);
#else
  MESSAGE("operator new is the sanitizer's here: only the engine's buffer counter is checked");
#endif
  // The loop computed the right thing: the mean over ranks of (rank + last step).
  const float want = (size - 1) / 2.0f + (steps - 1);
  for (const auto& g : grads) REQUIRE(g.front() == doctest::Approx(want));
}

// Which tensors share a batch is up to timing, so any tensor of a fused batch may later come
// alone; reduced alone, a large one is scaled in shards (Note [Scaled allreduce]). The batch has
// already sized every buffer that takes, so doing so allocates nothing.
TEST_CASE("a tensor of a fused batch reduced alone afterwards grows no buffer") {
  test::Initialized dt;
  const int rank = dtrain::rank(), size = dtrain::size();
  const auto sizes = resnet_like_sizes();
  std::vector<std::vector<float>> grads;
  for (auto n : sizes) grads.emplace_back(static_cast<std::size_t>(n), static_cast<float>(rank));
  {
    std::vector<std::span<float>> all;
    for (auto& g : grads) all.emplace_back(g);
    grouped_allreduce(all, {.name = "alone.warmup"});
  }
  const auto before = engine_stats();
  for (std::size_t t = 0; t < grads.size(); ++t)
    allreduce(grads[t], {.name = fmt::format("alone.{}", t)});
  const auto after = engine_stats();
  CHECK(after.buffer_allocations == before.buffer_allocations);
  CHECK(after.fused_collectives == before.fused_collectives);  // each one did come alone
  const float want = (size - 1) / 2.0f;  // the mean of the ranks, averaged again: unchanged
  for (const auto& g : grads) REQUIRE(g.back() == doctest::Approx(want));
}

#ifdef DTRAIN_TEST_COUNTS_ALLOCATIONS
TEST_CASE("the allocation counter sees large allocations (the check above can fail)") {
  large_allocations = 0;
  counting = true;
  auto* big = new std::vector<char>(128 * 1024);
  counting = false;
  CHECK(large_allocations.load() == 1);
  delete big;
}
#endif
