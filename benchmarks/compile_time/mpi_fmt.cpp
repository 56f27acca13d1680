// The baseline of benchmarks/compile_time.sh: one_allreduce.cpp written with MPI and {fmt}.
#include <mpi.h>

#include <fmt/format.h>

#include <vector>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  std::vector<float> v(10, 1.0f);
  MPI_Allreduce(MPI_IN_PLACE, v.data(), 10, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  for (auto& x : v) x /= static_cast<float>(size);
  fmt::print("{}\n", v[0]);
  MPI_Finalize();
  return v[0] == 1.0f ? 0 : 1;
}
