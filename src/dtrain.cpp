// The compiled half of dtrain (Note [Build modes] in include/dtrain/core/build_mode.hpp): the
// definitions the public headers declare DTRAIN_API, compiled once into the library that the CMake
// target dtrain::dtrain builds. Compiled with DTRAIN_COMPILED_LIB, like every file that links it.
#include "dtrain/core/config_impl.hpp"
#include "dtrain/core/logging_impl.hpp"
#include "dtrain/core/version_impl.hpp"
#include "dtrain/profile/profiler_impl.hpp"
#include "dtrain/runtime/handle_impl.hpp"
#include "dtrain/runtime/op_checks_impl.hpp"
#include "dtrain/runtime/session_impl.hpp"
#include "dtrain/runtime/submission_impl.hpp"
#include "dtrain/train/checkpoint_impl.hpp"
