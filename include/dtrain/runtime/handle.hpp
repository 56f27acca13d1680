#pragma once
// Handles to in-flight ops: what the caller holds while an op runs. The state they share with the
// engine lives in runtime/execution/op_state.hpp, reached through the functions below (Note [Build
// modes] in core/build_mode.hpp).
#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "dtrain/core/build_mode.hpp"
#include "dtrain/core/error.hpp"

namespace dtrain {
namespace detail {

class OpState;

DTRAIN_API std::shared_ptr<OpState> make_op_state();
DTRAIN_API bool op_done(const OpState& state) noexcept;
// Blocks until the op completes, then rethrows its error.
DTRAIN_API void op_wait(OpState& state);
// False if the op is still running after `timeout`; rethrows its error once it has completed.
DTRAIN_API bool op_wait_for(OpState& state, std::chrono::nanoseconds timeout);
// Completes the op; false if it had already completed.
DTRAIN_API bool op_complete(OpState& state, std::exception_ptr error = nullptr) noexcept;
// One state that completes when the last of `members` does, with the first member's error. The
// members must not have completed yet, nor have a continuation of their own.
DTRAIN_API std::shared_ptr<OpState> complete_together(
    const std::vector<std::shared_ptr<OpState>>& members);

}  // namespace detail

// Handle to an async op. `wait()` blocks until the op completes and rethrows its error;
// `poll()` tells without blocking; `wait_for(d)` returns false if the op is still running after d.
// Buffers passed to the op must stay alive and untouched until it completes.
class Handle {
 public:
  Handle() = default;
  explicit Handle(std::shared_ptr<detail::OpState> s) : state_(std::move(s)) {}

  bool valid() const noexcept { return state_ != nullptr; }
  bool poll() const {
    check();
    return detail::op_done(*state_);
  }
  void wait() const {
    check();
    detail::op_wait(*state_);
  }
  template <class Rep, class Period>
  bool wait_for(std::chrono::duration<Rep, Period> d) const {
    check();
    return detail::op_wait_for(*state_, std::chrono::ceil<std::chrono::nanoseconds>(d));
  }

 protected:
  void check() const {
    if (!state_) throw InvalidArgumentError("dtrain: Handle is empty (default-constructed or moved-from)");
  }
  std::shared_ptr<detail::OpState> state_;
};

// Handle to an op that produces a value (allgather, alltoall, reducescatter, join).
template <class R>
class ResultHandle : public Handle {
 public:
  ResultHandle() = default;
  ResultHandle(std::shared_ptr<detail::OpState> s, std::shared_ptr<std::optional<R>> slot)
      : Handle(std::move(s)), slot_(std::move(slot)) {}

  // Waits, then moves the result out (call once).
  R get() {
    wait();
    if (!slot_ || !slot_->has_value())
      throw InvalidArgumentError("dtrain: ResultHandle::get() called twice or on an empty handle");
    R out = std::move(**slot_);
    slot_->reset();
    return out;
  }

 private:
  std::shared_ptr<std::optional<R>> slot_;
};

}  // namespace dtrain

#ifdef DTRAIN_HEADER_ONLY
#include "dtrain/runtime/detail/handle_impl.hpp"
#endif
