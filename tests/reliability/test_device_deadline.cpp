// One op deadline on every path (Note [One op deadline] in runtime/execution/op_deadline.hpp): the
// device paths' deadlines use rank 0's DTRAIN_OP_TIMEOUT_SECONDS, as the host path's watchdog does,
// and discount the process's own pauses. Checked on the CPU: the rule itself, and what the engine
// hands a device backend, through a stand-in backend registered where <dtrain/cuda.hpp> registers
// the real one.
#include <chrono>
#include <mutex>
#include <span>
#include <vector>

#include "dtrain/runtime/device_registry.hpp"
#include "dtrain/runtime/execution/backend.hpp"
#include "dtrain/runtime/execution/op_deadline.hpp"
#include "engine/engine_test.hpp"

namespace {

using namespace dtrain;
using namespace std::chrono_literals;
using detail::OpDeadline;
using detail::OwnPauses;
using test::world_rank;
using test::world_size;

// What the engine handed the stand-in device backend.
struct Seen {
  std::mutex mutex;
  double op_timeout_seconds = -1;
  const OwnPauses* own_pauses = nullptr;
  int executed = 0;
};
Seen& seen() {
  static Seen s;
  return s;
}

class StandInDevice final : public detail::Backend {
 public:
  explicit StandInDevice(const detail::BackendContext& ctx) {
    std::lock_guard lock(seen().mutex);
    seen().op_timeout_seconds = ctx.op_timeout_seconds;
    seen().own_pauses = ctx.own_pauses;
  }
  void execute(const detail::Response&, std::span<detail::Entry* const>,
               std::chrono::steady_clock::time_point) override {
    std::lock_guard lock(seen().mutex);
    ++seen().executed;
  }
};

std::unique_ptr<detail::Backend> make_stand_in(const detail::BackendContext& ctx) {
  return std::make_unique<StandInDevice>(ctx);
}

}  // namespace

TEST_CASE("an op deadline does not count the process's own pauses") {
  const auto t0 = OpDeadline::Clock::now();
  OwnPauses pauses;
  pauses.add(5s);  // before the op: not its concern
  const OpDeadline d = OpDeadline::after(2.0, &pauses, t0);
  CHECK_FALSE(d.passed(t0 + 1500ms));
  CHECK(d.passed(t0 + 2100ms));
  pauses.add(3s);  // the process was stopped for 3 s while the op ran
  CHECK_FALSE(d.passed(t0 + 4500ms));
  CHECK(d.passed(t0 + 5100ms));
  CHECK_FALSE(OpDeadline::after(0, &pauses, t0).passed(t0 + 1000h));  // 0: never
  CHECK(OpDeadline::after(1.0, nullptr, t0).passed(t0 + 1s));
}

TEST_CASE("device backends get rank 0's op timeout and the watchdog's pauses, not their own") {
  auto& factory = detail::device_backend_factory();
  const auto saved = factory;
  factory = &make_stand_in;
  {
    Config c = Config::from_env();
    c.op_timeout_seconds = world_rank() == 0 ? 30 : 7;  // the others' values are ignored
    test::Initialized dt(c);
    std::vector<float> host(16, 1.0f);
    TensorView on_device(host.data(), 16, DataType::float32, Device::cuda(0));
    allreduce(on_device, {.op = ReduceOp::Sum, .name = "device.op"});
    std::lock_guard lock(seen().mutex);
    CHECK(seen().executed == 1);
    CHECK(seen().op_timeout_seconds == 30);
    CHECK(seen().own_pauses != nullptr);
  }
  factory = saved;
}
