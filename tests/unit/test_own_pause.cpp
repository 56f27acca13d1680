// Note [Own pauses] (runtime/execution/watchdog.hpp): lateness spent waiting for a CPU is not a
// pause; the rest of it, from a second on, is.
#include "dtrain/runtime/execution/watchdog.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <optional>

#include "support/skip.hpp"

using dtrain::detail::Watchdog;
using namespace std::chrono_literals;
using Ns = std::optional<std::chrono::nanoseconds>;

TEST_CASE("a late wake-up spent waiting for a CPU is not a pause") {
  // Three seconds late, two and a half of them runnable behind other work: a busy machine.
  CHECK(Watchdog::own_pause(3s, Ns(10s), Ns(12500ms)) == Watchdog::Clock::duration::zero());
  // Three seconds late, a tenth of a second waiting for a CPU: stopped for 2.9 s.
  CHECK(Watchdog::own_pause(3s, Ns(10s), Ns(10100ms)) == 2900ms);
}

TEST_CASE("without the kernel's run-queue time, all the lateness is a pause") {
  CHECK(Watchdog::own_pause(3s, std::nullopt, Ns(1s)) == 3s);
  CHECK(Watchdog::own_pause(3s, Ns(1s), std::nullopt) == 3s);
}

TEST_CASE("lateness under a second is never a pause") {
  CHECK(Watchdog::own_pause(999ms, Ns(0s), Ns(0s)) == Watchdog::Clock::duration::zero());
  CHECK(Watchdog::own_pause(1500ms, Ns(0s), Ns(600ms)) == Watchdog::Clock::duration::zero());
}

TEST_CASE("the run-queue time is read from the kernel where Linux reports it") {
  const auto waited = Watchdog::run_queue_wait();
  if (!waited) {
    // Nothing was checked: a pass would claim the kernel's figure was read.
    MESSAGE("SKIPPED: /proc/thread-self/schedstat is not readable here (pauses count all "
            "lateness); the run-queue time was not checked");
    dtrain_test_support::mark_skipped();
    return;
  }
  CHECK(waited->count() >= 0);
  const auto later = Watchdog::run_queue_wait();
  REQUIRE(later);
  CHECK(*later >= *waited);
}
