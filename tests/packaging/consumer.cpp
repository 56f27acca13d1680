// The program every packaging test builds: it uses the public API the way a user would, so a
// package that installs, exports or vendors dtrain incompletely fails to compile, link or run.
// Optional argument: the number of ranks the test launched, so a launcher that silently started
// independent singletons (each with size 1, where the sum trivially matches) is caught.
#include <dtrain/dtrain.hpp>

#include <cstdlib>
#include <iostream>
#include <vector>

int main(int argc, char** argv) {
  dtrain::Session session(argc, argv);
  const int rank = dtrain::rank();
  const int size = dtrain::size();

  std::vector<float> v{float(dtrain::rank() + 1)};
  dtrain::allreduce(v, dtrain::AllreduceOptions{.op = dtrain::ReduceOp::Sum});

  const float expected = float(size * (size + 1) / 2);
  std::cout << "rank " << rank << "/" << size << ": dtrain " << dtrain::version()
            << ", allreduce sum " << v[0] << " (expected " << expected << ")" << std::endl;
  if (v[0] != expected) {
    std::cerr << "rank " << rank << ": allreduce returned " << v[0] << ", expected " << expected
              << std::endl;
    return 1;
  }
  if (argc > 1 && std::atoi(argv[1]) != size) {
    std::cerr << "rank " << rank << ": launched with " << argv[1] << " ranks but dtrain::size() is "
              << size << std::endl;
    return 1;
  }
  return 0;
}
