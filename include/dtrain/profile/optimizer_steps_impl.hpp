#pragma once
// Definitions of profile/optimizer_steps.hpp (Note [Build modes] in core/build_mode.hpp).
#include <memory>

#include "dtrain/profile/active_profile.hpp"
#include "dtrain/profile/optimizer_steps.hpp"
#include "dtrain/runtime/engine/profile_hooks.hpp"

namespace dtrain::detail {

DTRAIN_API void optimizer_stepped() noexcept {
  if (!waits_observed()) return;  // nothing is profiled
  const std::shared_ptr<ProfilerState> state = active_profile();
  if (state && state->on_training_thread(true)) mark_implicit_step(*state);
}

}  // namespace dtrain::detail
