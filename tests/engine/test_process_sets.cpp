// Process sets across processes: every collective on the even and odd ranks' sets and on the
// world at once, submitted in different orders on different ranks, against closed forms;
// overlapping sets; a mismatch that stays inside its set; a non-member's use refused; joins per
// set; and the errors of add_process_set (Note [Process sets] in
// runtime/negotiation/coordinator.hpp).
#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dtrain/runtime/grouped_collectives.hpp"
#include "dtrain/runtime/process_set.hpp"
#include "engine_test.hpp"

namespace {

using namespace dtrain;
using dtrain::test::contains;

// Waits for one submitted op and checks its result against its closed form.
using Check = std::function<void()>;

// The world ranks with the parity of `rank`: {0, 2, ...} or {1, 3, ...}.
std::vector<int> same_parity(int rank, int size) {
  std::vector<int> out;
  for (int r = rank % 2; r < size; r += 2) out.push_back(r);
  return out;
}

std::vector<int> everyone(int size) {
  std::vector<int> out(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r) out[static_cast<std::size_t>(r)] = r;
  return out;
}

// The rows of dim 0 member k keeps of a reducescatter of `rows` rows over `n` members.
std::int64_t scatter_rows(std::int64_t rows, int n, int k) { return rows / n + (k < rows % n); }
std::int64_t scatter_start(std::int64_t rows, int n, int k) {
  std::int64_t s = 0;
  for (int j = 0; j < k; ++j) s += scatter_rows(rows, n, j);
  return s;
}

// Submits one op of every kind on `set` (the world when `members` is every rank), the same names
// on every set, unnamed ones included; returns the checks. `reverse`: in the opposite order.
std::vector<Check> submit_every_kind(const ProcessSet& set, const std::vector<int>& m, int rank,
                                     bool reverse) {
  const int n = static_cast<int>(m.size());
  const int me = static_cast<int>(std::find(m.begin(), m.end(), rank) - m.begin());
  double members_sum = 0;  // sum of (r + 1) over the members
  for (int r : m) members_sum += r + 1;
  std::vector<std::function<Check()>> kinds;
  kinds.push_back([&, members_sum]() -> Check {
    auto x = std::make_shared<std::vector<double>>(5, rank + 1.0);
    Handle h = allreduce_async(*x, {.op = ReduceOp::Sum, .name = "sum", .process_set = set});
    return [=] { h.wait(); CHECK(*x == std::vector<double>(5, members_sum)); };
  });
  kinds.push_back([&, members_sum, n]() -> Check {
    auto x = std::make_shared<std::vector<float>>(3, static_cast<float>(rank + 1));
    Handle h = allreduce_async(*x, {.prescale = 3, .postscale = 0.5, .process_set = set});
    return [=] {
      h.wait();
      for (float v : *x) CHECK(v == doctest::Approx(members_sum * 3 * 0.5 / n));
    };
  });
  kinds.push_back([&]() -> Check {
    auto mine =
        std::make_shared<std::vector<std::int32_t>>(static_cast<std::size_t>(rank % 3), rank);
    auto h = std::make_shared<ResultHandle<std::vector<std::int32_t>>>(
        allgather_async(*mine, {.name = "gather", .process_set = set}));
    std::vector<std::int32_t> want;
    for (int r : m) want.insert(want.end(), static_cast<std::size_t>(r % 3), r);
    return [=] { CHECK(h->get() == want); (void)mine; };
  });
  kinds.push_back([&]() -> Check {
    auto x = std::make_shared<std::vector<std::int64_t>>(4, rank + 100);
    Handle h = broadcast_async(*x, m.back(), {.name = "bcast", .process_set = set});
    const std::int64_t want = m.back() + 100;
    return [=] { h.wait(); CHECK(*x == std::vector<std::int64_t>(4, want)); };
  });
  kinds.push_back([&, n, me]() -> Check {
    auto send = std::make_shared<std::vector<std::int32_t>>();
    std::vector<int> splits;
    for (int j = 0; j < n; ++j) {
      splits.push_back(j + 1);
      send->insert(send->end(), static_cast<std::size_t>(j + 1), 1000 * rank + j);
    }
    auto h = std::make_shared<ResultHandle<AlltoallResult<std::vector<std::int32_t>>>>(
        alltoall_async(*send, splits, {.name = "a2a", .process_set = set}));
    std::vector<std::int32_t> want;
    for (int r : m) want.insert(want.end(), static_cast<std::size_t>(me + 1), 1000 * r + me);
    return [=] {
      auto [received, from] = h->get();
      (void)send;
      CHECK(received == want);
      CHECK(from == std::vector<std::int64_t>(static_cast<std::size_t>(n), me + 1));
    };
  });
  kinds.push_back([&, members_sum, n, me]() -> Check {
    const std::int64_t rows = 2 * n + 1;
    auto x = std::make_shared<std::vector<double>>();
    for (std::int64_t row = 0; row < rows; ++row) x->push_back((rank + 1.0) * (row + 1));
    auto h = std::make_shared<ResultHandle<std::vector<double>>>(reducescatter_async(
        *x, {.op = ReduceOp::Sum, .prescale = 2, .postscale = 0.25, .name = "rs",
             .process_set = set}));
    std::vector<double> want;
    for (std::int64_t i = 0; i < scatter_rows(rows, n, me); ++i)
      want.push_back(members_sum * (scatter_start(rows, n, me) + i + 1) * 0.5);
    return [=] { CHECK(h->get() == want); (void)x; };
  });
  kinds.push_back([&]() -> Check {
    Handle h = barrier_async({.name = "barrier", .process_set = set});
    return [=] { h.wait(); };
  });
  kinds.push_back([&, members_sum]() -> Check {
    auto g = std::make_shared<std::vector<std::vector<float>>>();
    for (std::size_t k : {2, 7, 1}) g->emplace_back(k, static_cast<float>(rank + 1));
    Handle h =
        grouped_allreduce_async(*g, {.op = ReduceOp::Sum, .name = "group", .process_set = set});
    return [=] {
      h.wait();
      for (const auto& t : *g)
        CHECK(t == std::vector<float>(t.size(), static_cast<float>(members_sum)));
    };
  });
  kinds.push_back([&]() -> Check {
    auto g = std::make_shared<std::vector<std::vector<std::int32_t>>>();
    for (int k = 0; k < 2; ++k)
      g->emplace_back(static_cast<std::size_t>((rank + k) % 2 + 1), rank * 100 + k);
    auto h = std::make_shared<ResultHandle<std::vector<std::vector<std::int32_t>>>>(
        grouped_allgather_async(*g, {.name = "ggather", .process_set = set}));
    std::vector<std::vector<std::int32_t>> want(2);
    for (int k = 0; k < 2; ++k)
      for (int r : m)
        want[k].insert(want[k].end(), static_cast<std::size_t>((r + k) % 2 + 1), r * 100 + k);
    return [=] { CHECK(h->get() == want); (void)g; };
  });
  kinds.push_back([&, members_sum, n, me]() -> Check {
    auto g = std::make_shared<std::vector<std::vector<double>>>();
    for (int k = 0; k < 2; ++k) g->emplace_back(static_cast<std::size_t>(n + k), rank + 1.0);
    auto h = std::make_shared<ResultHandle<std::vector<std::vector<double>>>>(
        grouped_reducescatter_async(*g, {.op = ReduceOp::Sum, .name = "grs", .process_set = set}));
    std::vector<std::vector<double>> want;
    for (int k = 0; k < 2; ++k)
      want.emplace_back(static_cast<std::size_t>(scatter_rows(n + k, n, me)), members_sum);
    return [=] { CHECK(h->get() == want); (void)g; };
  });
  if (reverse) std::reverse(kinds.begin(), kinds.end());
  std::vector<Check> checks;
  for (auto& k : kinds) checks.push_back(k());
  return checks;
}

}  // namespace

TEST_CASE("every collective on two process sets and the world at once matches its closed form") {
  test::Initialized dt;
  const int rank = dtrain::rank(), size = dtrain::size();
  const ProcessSet even = add_process_set(same_parity(0, size));
  const ProcessSet odd = add_process_set(same_parity(1, size));
  const ProcessSet& mine = rank % 2 == 0 ? even : odd;
  CHECK(even.id() == 1);
  CHECK(odd.id() == 2);
  CHECK(mine.ranks() == same_parity(rank, size));
  CHECK(mine.size() == static_cast<int>(same_parity(rank, size).size()));
  CHECK(mine.rank() == rank / 2);
  CHECK(mine.included());
  CHECK_FALSE((rank % 2 == 0 ? odd : even).included());
  CHECK((rank % 2 == 0 ? odd : even).rank() == -1);
  CHECK(ProcessSet{}.size() == size);
  // Ranks 0, 1 submit the set's ops first; ranks 2, 3 the world's. Odd ranks reverse the kinds.
  const bool set_first = (rank / 2) % 2 == 0, reverse = rank % 2 == 1;
  std::vector<Check> checks, world_checks;
  if (!set_first) world_checks = submit_every_kind({}, everyone(size), rank, reverse);
  checks = submit_every_kind(mine, same_parity(rank, size), rank, reverse);
  if (set_first) world_checks = submit_every_kind({}, everyone(size), rank, reverse);
  for (auto& c : checks) c();
  for (auto& c : world_checks) c();
}

TEST_CASE("overlapping sets run side by side without deadlock") {
  test::Initialized dt;
  const int rank = dtrain::rank(), size = dtrain::size();
  if (size < 3) return;
  // {0, 1} and {1, 2}: rank 1 serves both, and submits them in the opposite order of the others.
  const ProcessSet a = add_process_set({0, 1});
  const ProcessSet b = add_process_set({2, 1});
  CHECK(b.ranks() == std::vector<int>{1, 2});
  std::vector<Check> checks;
  for (int round = 0; round < 3; ++round) {
    std::vector<const ProcessSet*> order;
    if (a.included()) order.push_back(&a);
    if (b.included()) order.push_back(&b);
    if (rank == 1 && round % 2 == 0) std::reverse(order.begin(), order.end());
    for (const ProcessSet* s : order) {
      auto x = std::make_shared<std::vector<double>>(1000, rank + 1.0);
      Handle h = allreduce_async(*x, {.op = ReduceOp::Sum, .name = fmt::format("o{}", round),
                                      .process_set = *s});
      double want = 0;
      for (int r : s->ranks()) want += r + 1;
      checks.push_back([=] { h.wait(); CHECK((*x)[999] == want); });
    }
  }
  for (auto& c : checks) c();
}

TEST_CASE("a set's repeated op travels as a response-cache id, as the world's does") {
  test::Initialized dt;
  const int rank = dtrain::rank(), size = dtrain::size();
  const ProcessSet even = add_process_set(same_parity(0, size));
  const ProcessSet odd = add_process_set(same_parity(1, size));
  const ProcessSet& mine = rank % 2 == 0 ? even : odd;
  std::vector<float> x(8, 1.0f);
  const auto before = engine_stats();
  // Both sets use the same name at once; each keeps its own cache entry.
  for (int step = 0; step < 4; ++step)
    allreduce(x, {.op = ReduceOp::Sum, .name = "cached", .process_set = mine});
  const auto after = engine_stats();
  CHECK(after.cache_ids_sent - before.cache_ids_sent == 3);  // all but the first step
  const float n = static_cast<float>(mine.size());
  CHECK(x[0] == n * n * n * n);
}

TEST_CASE("a mismatch inside a set raises on its members only") {
  test::Initialized dt;
  const int rank = dtrain::rank(), size = dtrain::size();
  const ProcessSet even = add_process_set(same_parity(0, size));
  const std::vector<int> m = even.ranks();
  if (even.included()) {
    // The last member disagrees on the shape.
    std::vector<float> x(rank == m.back() && m.size() > 1 ? 6 : 4, 1.0f);
    if (m.size() > 1) {
      try {
        allreduce(x, {.name = "mismatch", .process_set = even});
        FAIL_CHECK("a shape mismatch inside the set was accepted");
      } catch (const MismatchError& e) {
        CHECK(contains(e.what(), "on process set 1"));
        CHECK(contains(e.what(), "shape"));
      }
    }
  }
  // Every rank, members or not, goes on with the world; no rank outside the set saw an error.
  std::vector<float> after(2, 1.0f);
  allreduce(after, {.op = ReduceOp::Sum, .name = "after.mismatch"});
  CHECK(after == std::vector<float>(2, static_cast<float>(size)));
}

TEST_CASE("a rank outside a set that uses it is refused, and the members are not disturbed") {
  test::Initialized dt;
  const int rank = dtrain::rank(), size = dtrain::size();
  const ProcessSet even = add_process_set(same_parity(0, size));
  std::vector<float> x(3, 1.0f);
  if (even.included()) {
    allreduce(x, {.op = ReduceOp::Sum, .name = "shared", .process_set = even});
    CHECK(x == std::vector<float>(3, static_cast<float>(even.size())));
  } else {
    const std::string members = fmt::format("{}", fmt::join(even.ranks(), ", "));
    for (const std::string& name : {std::string("shared"), std::string()}) {
      try {
        allreduce(x, {.name = name, .process_set = even});
        FAIL_CHECK("a non-member's allreduce on the set was accepted");
      } catch (const InvalidArgumentError& e) {
        CHECK(contains(e.what(), fmt::format("rank {} is not a member of process set 1 (ranks "
                                             "[{}])", rank, members)));
      }
    }
    CHECK_THROWS_AS(join(even), InvalidArgumentError);
    CHECK_THROWS_AS(barrier({.process_set = even}), InvalidArgumentError);
    CHECK(x == std::vector<float>(3, 1.0f));
  }
  std::vector<float> after(2, 1.0f);
  allreduce(after, {.op = ReduceOp::Sum, .name = "after.refusal"});
  CHECK(after == std::vector<float>(2, static_cast<float>(size)));
}

TEST_CASE("join is per set: the set's ops go on without its joined members, the world's do not") {
  test::Initialized dt;
  const int rank = dtrain::rank(), size = dtrain::size();
  const ProcessSet even = add_process_set(same_parity(0, size));
  std::vector<int> ranks = even.ranks();
  if (even.included()) {
    // Member i runs i + 1 steps, then joins; the last member joins last.
    const int me = even.rank();
    for (int s = 0; s <= me; ++s) {
      std::vector<double> v(3, rank + 1.0);
      allreduce(v, {.name = fmt::format("step{}", s), .process_set = even});
      double sum = 0, count = 0;
      for (std::size_t k = static_cast<std::size_t>(s); k < ranks.size(); ++k, ++count)
        sum += ranks[k] + 1;
      CHECK(v[0] == doctest::Approx(sum / count));
    }
    auto last = join_async(even);
    CHECK(last.get() == ranks.back());
  }
  // The world never joined: every rank still counts.
  std::vector<double> w(2, 1.0);
  allreduce(w, {.op = ReduceOp::Sum, .name = "world.after.join"});
  CHECK(w[0] == size);
}

TEST_CASE("add_process_set refuses bad rank lists on every rank") {
  test::Initialized dt;
  const int rank = dtrain::rank(), size = dtrain::size();
  const std::string outside = fmt::format("rank {} is outside the world", size);
  CHECK_THROWS_WITH_AS(add_process_set({0, size}), doctest::Contains(outside.c_str()),
                       InvalidArgumentError);
  CHECK_THROWS_WITH_AS(add_process_set({0, 0}), doctest::Contains("appears more than once"),
                       InvalidArgumentError);
  CHECK_THROWS_AS(add_process_set({}), InvalidArgumentError);
  // Only one rank passes a bad list: every rank fails, none waits. The refusal reaches the
  // coordinator before or after the others' calls, and the error it sends to the refusing rank
  // must leave the others' calls in flight; a few rounds meet both orders.
  for (int round = 0; round < 6; ++round) {
    const int refusing = round % 2 == 0 ? 0 : size - 1;
    CHECK_THROWS_AS(add_process_set(rank == refusing ? std::vector<int>{-1} : std::vector<int>{0}),
                    InvalidArgumentError);
  }
  if (size > 1) {
    // Ranks disagree on the list.
    CHECK_THROWS_WITH_AS(add_process_set(rank == 0 ? std::vector<int>{0} : std::vector<int>{1}),
                         doctest::Contains("ranks disagree on the ranks of add_process_set"),
                         MismatchError);
  }
  const ProcessSet first = add_process_set({0});
  const std::string same = fmt::format("process set {} has the same ranks [0]", first.id());
  CHECK_THROWS_WITH_AS(add_process_set({0}), doctest::Contains(same.c_str()), InvalidArgumentError);
  CHECK_THROWS_WITH_AS(add_process_set(everyone(size)), doctest::Contains("(the world)"),
                       InvalidArgumentError);
  if (rank == 0) {
    std::vector<float> x(2, 5.0f);
    allreduce(x, {.process_set = first});  // a set of one rank
    CHECK(x == std::vector<float>(2, 5.0f));
  }
}

TEST_CASE("a set from an earlier session is refused by name") {
  ProcessSet stale;
  {
    test::Initialized dt;
    stale = add_process_set({0});
  }
  test::Initialized dt;
  if (dtrain::rank() == 0) {
    std::vector<float> x(1, 1.0f);
    CHECK_THROWS_WITH_AS(allreduce(x, {.name = "stale", .process_set = stale}),
                         doctest::Contains("is not one of this dtrain session's process sets"),
                         InvalidArgumentError);
  }
}
