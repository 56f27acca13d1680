#pragma once
// The test's own rank and size in MPI_COMM_WORLD, straight from MPI (not from dtrain, whose
// answers are what many tests check).
#include <mpi.h>

namespace dtrain_test_support {

inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
inline int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

}  // namespace dtrain_test_support
