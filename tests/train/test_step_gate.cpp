// detail::StepGate, the step()/skip_synchronize() bookkeeping both DistributedOptimizers share
// (Note [Gradient accumulation]), checked without MPI against a plain count of calls.
#include "dtrain/train/step_gate.hpp"

#include <doctest/doctest.h>

#include <string>

namespace {

struct Calls {
  std::string log;  // 's' per synchronize, 'a' per apply, in order
  bool step(dtrain::detail::StepGate& gate) {
    return gate.step([&] { log += 's'; }, [&] { log += 'a'; });
  }
};

}  // namespace

TEST_CASE("one pass per step: every call synchronizes, then applies") {
  dtrain::detail::StepGate gate(1);
  Calls c;
  for (int i = 0; i < 3; ++i) CHECK(c.step(gate));
  CHECK(c.log == "sasasa");
}

TEST_CASE("k passes per step: only every k-th call synchronizes and applies") {
  dtrain::detail::StepGate gate(3);
  Calls c;
  std::string stepped;
  for (int i = 0; i < 7; ++i) stepped += c.step(gate) ? '1' : '0';
  CHECK(stepped == "0010010");
  CHECK(c.log == "sasa");
}

TEST_CASE("a skip scope skips the synchronize of the next step only") {
  dtrain::detail::StepGate gate(1);
  Calls c;
  {
    auto scope = gate.skip_synchronize();
    CHECK(c.step(gate));
    CHECK(c.step(gate));  // the skip is used up by the first step
  }
  CHECK(c.log == "asa");
  // A scope that closes before any step leaves the next step synchronizing.
  { auto scope = gate.skip_synchronize(); }
  c.log.clear();
  CHECK(c.step(gate));
  CHECK(c.log == "sa");
}

TEST_CASE("a skip scope survives the passes that do not step") {
  dtrain::detail::StepGate gate(2);
  Calls c;
  const auto scope = gate.skip_synchronize();
  const bool counted_only = !c.step(gate);
  const bool stepped = c.step(gate);
  CHECK((counted_only && stepped && c.log == "a"));
}
