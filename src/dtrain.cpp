// The compiled half of dtrain (Note [Build modes] in include/dtrain/core/build_mode.hpp): the
// library that the CMake target dtrain::dtrain builds, compiled with DTRAIN_COMPILED_LIB like
// every file that links it.
#include "dtrain/implementation.hpp"
