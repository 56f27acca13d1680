#pragma once
// A lower layer that includes a higher one: check_layers.py must reject it.
#include "dtrain/runtime/engine/engine.hpp"
