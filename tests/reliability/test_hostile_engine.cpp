// Hostile use of the engine: joins followed by unnamed ops, one op name from two threads, names
// that look generated, a process set MPI cannot create, DTRAIN_HOST_ID or an invalid setting on
// some ranks only. Every case ends with the right result or an error on every rank, never a wrong
// result or a wait for the op timeout. Runs at 2, 3 and 4 ranks; the odd rank out is the last one.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <numeric>
#include <string>
#include <thread>
#include <typeinfo>
#include <vector>

#include "dtrain/runtime/grouped_collectives.hpp"
#include "dtrain/runtime/process_set.hpp"
#include "dtrain/runtime/execution/response_executor.hpp"  // detail::fail_set_creation_at()
#include "engine/engine_test.hpp"
#include "reliability/expected_errors.hpp"

namespace {

using namespace dtrain;
using namespace std::chrono_literals;
using test::expect;
using test::Initialized;
using test::is_odd_one;
using test::last_rank;
using test::world_rank;
using test::world_size;

// Short deadlines: a case that waits for a peer that never comes fails in seconds, not minutes.
Config quick_config() {
  Config c = Config::from_env();
  c.stall_check_time_seconds = 1;
  c.op_timeout_seconds = 15;
  return c;
}

void check_still_works() {
  std::vector<std::int64_t> v{1};
  allreduce(v, {.op = ReduceOp::Sum});
  CHECK(v[0] == world_size());
}

// Every rank but the last: a process set that is not the world (which cannot be made again).
std::vector<int> all_but_last() {
  std::vector<int> ranks(static_cast<std::size_t>(world_size() - 1));
  std::iota(ranks.begin(), ranks.end(), 0);
  return ranks;
}

std::int64_t sum_of_ranks_plus_one() {
  const std::int64_t n = world_size();
  return n * (n + 1) / 2;
}

}  // namespace

TEST_CASE("unnamed ops after join() pair with the same ops on every rank") {
  Initialized dt(quick_config());
  const bool worker = world_rank() == 0;  // the one rank with data left; every other rank joins
  if (worker) {
    for (int i = 0; i < 3; ++i) {
      std::vector<std::int64_t> v{i + 1};
      allreduce(v, {.op = ReduceOp::Sum});  // the joined ranks contribute zeros
      CHECK(v[0] == i + 1);
    }
    std::vector<std::int64_t> rows{7, 8};
    auto gathered = allgather(rows);  // joined ranks contribute no rows
    CHECK(gathered == std::vector<std::int64_t>{7, 8});
    std::vector<std::vector<float>> group{{1.0f}, {2.0f}};
    grouped_allreduce(group, {.op = ReduceOp::Sum});
    CHECK(group[1][0] == 2.0f);
  }
  CHECK(join() >= 0);
  // Every rank's next unnamed ops of each kind must pair (before the fix the joined ranks' counts
  // were behind: allreduce.0 against allreduce.3, a stall until the op timeout).
  std::vector<std::int64_t> v{world_rank() + 1};
  allreduce(v, {.op = ReduceOp::Sum});
  CHECK(v[0] == sum_of_ranks_plus_one());
  std::vector<std::int64_t> mine{world_rank()};
  auto all = allgather(mine);
  std::vector<std::int64_t> expected(static_cast<std::size_t>(world_size()));
  std::iota(expected.begin(), expected.end(), 0);
  CHECK(all == expected);
  std::vector<std::vector<float>> group{{1.0f}, {static_cast<float>(world_rank())}};
  grouped_allreduce(group, {.op = ReduceOp::Sum});
  CHECK(group[0][0] == static_cast<float>(world_size()));
  // A process set created after the join pairs too, and works.
  ProcessSet set = add_process_set(all_but_last());
  if (set.included()) {
    std::vector<std::int64_t> s{2};
    allreduce(s, {.op = ReduceOp::Sum, .process_set = set});
    CHECK(s[0] == 2 * (world_size() - 1));
  }
  check_still_works();
}

TEST_CASE("a join on a process set brings its members' generated names in step") {
  Initialized dt(quick_config());
  ProcessSet set = add_process_set(all_but_last());  // two or more members from 3 ranks on
  if (!set.included() || set.size() < 2) return;
  if (world_rank() == 0) {
    for (int i = 0; i < 2; ++i) {
      std::vector<std::int64_t> v{1};
      allreduce(v, {.op = ReduceOp::Sum, .process_set = set});
      CHECK(v[0] == 1);
    }
  }
  join(set);
  std::vector<std::int64_t> v{world_rank() + 1};
  allreduce(v, {.op = ReduceOp::Sum, .process_set = set});
  const std::int64_t n = set.size();
  CHECK(v[0] == n * (n + 1) / 2);
}

TEST_CASE("names that look generated are refused: they could stand for an unnamed op") {
  Initialized dt(quick_config());
  std::vector<float> v(4, 1.0f);
  expect<InvalidArgumentError>([&] { allreduce(v, {.name = "allreduce.1"}); },
                               {"'allreduce.1'", "reserved"}, "allreduce.1");
  expect<InvalidArgumentError>([&] { broadcast(v, 0, "allgather.0.1"); }, {"reserved"},
                               "a generated group member's name");
  // Names that merely start with a kind, or a generated name and words, are the user's.
  allreduce(v, {.op = ReduceOp::Sum, .name = "allreduce.weights"});
  std::vector<float> u(4, 1.0f);
  allreduce(u, {.op = ReduceOp::Sum, .name = "allreduce.0.bias"});
  CHECK(u[0] == static_cast<float>(world_size()));
  CHECK(v[0] == static_cast<float>(world_size()));
  std::vector<float> w(4, 1.0f);
  allreduce(w, {.op = ReduceOp::Sum, .name = "allreduce"});
  CHECK(w[0] == static_cast<float>(world_size()));
  check_still_works();
}

TEST_CASE("DTRAIN_HOST_ID on some ranks only: init fails on every rank, naming them") {
  Config c = Config::from_env();
  c.host_id = is_odd_one() ? "emulated-host" : "";
  expect<InvalidArgumentError>(
      [&] { init(c); },
      {"DTRAIN_HOST_ID is set on ranks [" + std::to_string(last_rank()) + "]", "not on ranks [0"},
      "host id on one rank");
  CHECK_FALSE(is_initialized());
  Initialized fine;
  check_still_works();
}

TEST_CASE("an invalid setting on one rank: init fails on every rank at once, naming the rank") {
  // The environment is read by init() itself; only the last rank's is wrong.
  if (is_odd_one()) setenv("DTRAIN_OP_TIMEOUT_SECONDS", "bogus", 1);
  const auto start = std::chrono::steady_clock::now();
  expect<InvalidArgumentError>(
      [&] { init(); },
      {fmt::format("ranks [{}]", last_rank()), "DTRAIN_OP_TIMEOUT_SECONDS", "bogus"},
      "invalid setting on one rank");
  CHECK(std::chrono::steady_clock::now() - start < 10s);
  CHECK_FALSE(is_initialized());
  if (is_odd_one()) unsetenv("DTRAIN_OP_TIMEOUT_SECONDS");
  // An invalid Config on one rank, likewise.
  Config c = Config::from_env();
  if (is_odd_one()) c.cycle_time_ms = -1;
  expect<InvalidArgumentError>([&] { init(c); },
                               {fmt::format("ranks [{}]", last_rank()), "cycle_time_ms = -1"},
                               "invalid Config on one rank");
  CHECK_FALSE(is_initialized());
  Initialized fine;
  check_still_works();
}

TEST_CASE("a process set MPI cannot create fails on every rank, and the job goes on") {
  // The last rank's second creation fails after its MPI calls, as running out of communicators
  // does (Note [Communicator limit]).
  detail::fail_set_creation_at() = is_odd_one() ? 2 : 0;
  Config c = quick_config();
  c.op_timeout_seconds = 2;  // the watchdog runs while the creation is judged
  Initialized dt(c);
  const std::vector<int> first_ranks{0}, other_ranks{last_rank()};
  ProcessSet first = add_process_set(first_ranks);
  expect<Error>([&] { (void)add_process_set(other_ranks); },
                {fmt::format("could not create the set's communicators on ranks [{}]", last_rank()),
                 "2048", "reuse them"},
                "the failing creation");
  std::this_thread::sleep_for(3s);  // past the op timeout: nothing of the failed op is watched
  ProcessSet again = add_process_set(other_ranks);  // the failed set was never made
  for (const ProcessSet& set : {first, again}) {
    if (!set.included()) continue;
    std::vector<std::int64_t> v{5};
    allreduce(v, {.op = ReduceOp::Sum, .process_set = set});
    CHECK(v[0] == 5);
  }
  check_still_works();
  detail::fail_set_creation_at() = 0;
}

TEST_CASE("one op name in flight from two threads ends the job on every rank") {
  SUBCASE("the same thread's second submission is refused alone; the first completes") {
    // The last rank submits only once the others have been refused, so their first op cannot
    // have completed (and the name left flight) before their second submission.
    Initialized dt(quick_config());
    std::vector<float> a(4, 1.0f), b(4, 2.0f);
    Handle h;
    if (!is_odd_one()) {
      h = allreduce_async(a, {.op = ReduceOp::Sum, .name = "same.thread"});
      expect<InvalidArgumentError>(
          [&] { allreduce(b, {.op = ReduceOp::Sum, .name = "same.thread"}); },
          {"'same.thread' is already in flight"}, "second submission, same thread");
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (is_odd_one()) h = allreduce_async(a, {.op = ReduceOp::Sum, .name = "same.thread"});
    h.wait();
    CHECK(a[0] == static_cast<float>(world_size()));
    check_still_works();
  }
  SUBCASE("rank 0's second thread submits a name its first thread has in flight") {
    Initialized dt(quick_config());
    const std::string ended = "two threads use the op name 'shared'";
    if (world_rank() == 0) {
      std::vector<float> a(4, 1.0f);
      auto h = allreduce_async(a, {.op = ReduceOp::Sum, .name = "shared"});
      std::thread other([&] {
        std::vector<float> b(4, 1000.0f);
        expect<InvalidArgumentError>([&] { allreduce(b, {.op = ReduceOp::Sum, .name = "shared"}); },
                                     {ended, "different names"}, "the second thread");
      });
      other.join();
      expect<ShutdownError>([&] { h.wait(); }, {ended}, "the first thread's op");
    } else {
      std::vector<float> v(4, 1.0f);
      expect<ShutdownError>([&] { allreduce(v, {.name = "elsewhere"}); }, {ended}, "a peer's op");
    }
  }
  SUBCASE("two threads share names under load: every result is right or an error") {
    // Each thread reduces its own value; a result that pairs one thread's op with another
    // thread's on a peer is 1 + 1000 per pair instead of a multiple of either. Before, the ranks
    // refused different threads' ops and the survivors paired on: half of the later sums wrong,
    // no error. Now the first name found in flight from both threads ends the job on every rank,
    // so no op after it returns a result. The ops that paired before it, while the two threads'
    // ops did not overlap on a rank, cannot be told from one thread reusing its names (hence the
    // rule: names differ between threads), so a wrong result there is possible and not checked.
    // Whether the two threads' ops overlap on a rank within one round is up to the scheduler (on
    // an oversubscribed machine one thread may finish a round before the other starts), so rounds
    // repeat until one does. Every rank leaves the loop in the same round: a round without an
    // error on one rank completed every op on every rank, and an error on one rank ends the job
    // on all of them.
    Initialized dt(quick_config());
    std::atomic<int> results_after_error{0}, failed{0};
    constexpr int max_rounds = 50;
    int rounds = 0;
    for (; rounds < max_rounds && failed.load() == 0; ++rounds) {
      std::atomic<int> ready{0};
      auto run = [&](float value) {
        ++ready;
        while (ready.load() < 2) std::this_thread::yield();
        bool ended = false;
        for (int i = 0; i < 200; ++i) {
          std::vector<float> t(8, value);
          try {
            allreduce(t, {.op = ReduceOp::Sum, .name = fmt::format("op.{}.{}", rounds, i)});
            if (ended) ++results_after_error;
          } catch (const Error&) {
            ended = true;
            ++failed;
          }
        }
      };
      std::thread a([&] { run(1.0f); });
      std::thread b([&] { run(1000.0f); });
      a.join();
      b.join();
    }
    INFO("rounds ", rounds);
    INFO("failed ", failed.load(), ", results after an error ", results_after_error.load());
    CHECK(failed > 0);                     // the job ended on this rank
    CHECK(results_after_error.load() == 0);  // and nothing paired after it
  }
  Initialized again;
  check_still_works();
}
