#pragma once
// Definitions of runtime/handle.hpp (Note [Build modes] in core/build_mode.hpp).
#include <atomic>
#include <chrono>
#include <exception>
#include <memory>
#include <mutex>
#include <vector>

#include "dtrain/runtime/engine/profile_hooks.hpp"
#include "dtrain/runtime/execution/op_state.hpp"
#include "dtrain/runtime/handle.hpp"

namespace dtrain::detail {

DTRAIN_API std::shared_ptr<OpState> make_op_state() { return std::make_shared<OpState>(); }

DTRAIN_API bool op_done(const OpState& state) noexcept { return state.done(); }

// A profile charges the time to the step's communication wait (Note [Profile hooks]), even when
// the op is already done: the step then shows that it waited, for no time.
DTRAIN_API void op_wait(OpState& state) {
  if (!waits_observed()) return state.wait();
  const WaitTimer timer;
  state.wait();
}

DTRAIN_API bool op_wait_for(OpState& state, std::chrono::nanoseconds timeout) {
  if (!waits_observed()) return state.wait_for(timeout);
  const WaitTimer timer;
  return state.wait_for(timeout);
}

DTRAIN_API bool op_complete(OpState& state, std::exception_ptr error) noexcept {
  return state.complete(std::move(error));
}

DTRAIN_API std::shared_ptr<OpState> complete_together(
    const std::vector<std::shared_ptr<OpState>>& members) {
  struct Shared {
    std::shared_ptr<OpState> all = std::make_shared<OpState>();
    std::atomic<std::size_t> remaining;
    std::mutex mutex;  // guards first_error
    std::exception_ptr first_error;
    explicit Shared(std::size_t n) : remaining(n) {}
  };
  auto shared = std::make_shared<Shared>(members.size());
  if (members.empty()) shared->all->complete();
  for (const auto& m : members) {
    m->then = [shared](std::exception_ptr err) {
      if (err) {
        std::lock_guard lock(shared->mutex);
        if (!shared->first_error) shared->first_error = err;
      }
      if (shared->remaining.fetch_sub(1) == 1) {
        std::lock_guard lock(shared->mutex);
        shared->all->complete(shared->first_error);
      }
    };
  }
  return shared->all;
}

}  // namespace dtrain::detail
