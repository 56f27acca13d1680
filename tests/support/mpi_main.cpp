// Test main for every dtrain test binary, single- or multi-process.
//
// MPI is initialized here (as a user program would) so dtrain's "MPI already initialized: use it,
// do not finalize it" path is exercised by every test. Rank 0 prints the full console report;
// other ranks print only their failures. The verdict is OR-reduced so a failure on any rank fails
// the process on every rank, and ctest sees one answer. A binary that passed but marked itself
// skipped on any rank (support/skip.hpp) exits with the skip code on every rank.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <mpi.h>

#include <cstdio>

#include "dtrain/dtrain.hpp"
#include "support/skip.hpp"

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);

  doctest::Context context;
  context.applyCommandLine(argc, argv);
  if (rank != 0) context.setOption("minimal", true);
  int failed = context.run() != 0 ? 1 : 0;
  if (context.shouldExit()) {
    MPI_Finalize();
    return failed;
  }

  try {
    dtrain::shutdown();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[rank %d] dtrain::shutdown failed: %s\n", rank, e.what());
    failed = 1;
  }
  if (failed) std::fprintf(stderr, "[rank %d] test failures on this rank\n", rank);
  int any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  int skipped = dtrain_test_support::was_skipped() ? 1 : 0, any_skipped = 0;
  MPI_Allreduce(&skipped, &any_skipped, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  if (any_failed) return 1;
  return any_skipped ? dtrain_test_support::kSkippedExitCode : 0;
}
