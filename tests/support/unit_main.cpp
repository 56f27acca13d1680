// Test main for the tests that need no MPI. A binary that passed but marked itself skipped
// (support/skip.hpp) exits with the skip code.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "support/skip.hpp"

int main(int argc, char** argv) {
  doctest::Context context;
  context.applyCommandLine(argc, argv);
  const int failed = context.run();
  if (failed != 0 || context.shouldExit()) return failed;
  return dtrain_test_support::was_skipped() ? dtrain_test_support::kSkippedExitCode : 0;
}
