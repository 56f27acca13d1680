#pragma once
// Definitions of core/config.hpp (Note [Build modes] in core/build_mode.hpp).
#include "dtrain/core/config.hpp"
#include "dtrain/core/config_knobs.hpp"
#include "dtrain/core/env.hpp"

namespace dtrain {

DTRAIN_API void Config::validate() const { detail::validate_config(*this); }

DTRAIN_API Config Config::from_env() { return detail::config_from_env(detail::ProcessEnv()); }

}  // namespace dtrain
