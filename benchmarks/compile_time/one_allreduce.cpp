// The compile-time probe: a file that uses dtrain the way a trainer's file does (the umbrella
// header, a session, one allreduce). benchmarks/compile_time.sh compiles it in both build modes
// beside mpi_fmt.cpp, the same program written with MPI and {fmt}.
#include <dtrain/dtrain.hpp>

#include <vector>

int main(int argc, char** argv) {
  dtrain::Session session(argc, argv);
  std::vector<float> v(10, 1.0f);
  dtrain::allreduce(v);
  return v[0] == 1.0f ? 0 : 1;
}
