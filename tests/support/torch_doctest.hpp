#pragma once
// Include first in every test file that uses libtorch: it brings in libtorch and doctest in the one
// order that works.
//
// Note [glog's CHECK]: a libtorch built with glog (Debian's is) includes <glog/logging.h>, which
// defines CHECK, CHECK_EQ, ... as fatal runtime assertions; other builds define c10's look-alikes.
// Whichever of them and doctest is included last owns the names, so a test could silently abort on
// its first failure instead of reporting it, or fail to compile. libtorch goes first, its short
// names are dropped, then doctest defines its own; glog's include guard keeps later torch includes
// from redefining them.

// clang-format off
#include <torch/torch.h>
#undef CHECK
#undef CHECK_EQ
#undef CHECK_NE
#undef CHECK_LT
#undef CHECK_LE
#undef CHECK_GT
#undef CHECK_GE
#include <doctest/doctest.h>
// clang-format on
