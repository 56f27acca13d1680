// The compiled mode without dtrain's CMake (README, "Add dtrain to your project", way 4): the
// program's own file that compiles dtrain's engine once; every file defines DTRAIN_COMPILED_LIB.
#include <dtrain/implementation.hpp>
