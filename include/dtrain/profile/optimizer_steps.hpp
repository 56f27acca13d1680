#pragma once
// What a DistributedOptimizer tells the profiler: that an update ended, which ends one implicit
// step and begins the next (Note [Implicit steps] in profile/active_profile.hpp). Light on
// purpose: the optimizers' headers include it.
#include "dtrain/core/build_mode.hpp"

namespace dtrain::detail {

// Called by every DistributedOptimizer::step() that applied the gradients. While nothing is
// profiled, one relaxed atomic load.
DTRAIN_API void optimizer_stepped() noexcept;

}  // namespace dtrain::detail

#ifdef DTRAIN_HEADER_ONLY
#include "dtrain/profile/optimizer_steps_impl.hpp"
#endif
