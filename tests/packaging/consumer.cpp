// The program every packaging test builds: it uses the public API the way a user would, so a
// package that installs, exports or vendors dtrain incompletely fails to compile, link or run.
// It is three files that each include <dtrain/dtrain.hpp> (this one, consumer_ops.cpp,
// consumer_training.cpp), so both build modes are checked for what only shows with several
// translation units: definitions that collide at link time, or state that each file would get
// a copy of. Optional argument: the number of ranks the test launched, so a launcher that
// silently started independent singletons (each with size 1, where the sum trivially matches) is
// caught.
#include <dtrain/dtrain.hpp>

#include <cstdlib>
#include <iostream>

#include "consumer_parts.hpp"

int main(int argc, char** argv) {
  dtrain::Session session(argc, argv);
  const int rank = dtrain::rank();
  const int size = dtrain::size();
  std::cout << "rank " << rank << "/" << size << ": dtrain " << dtrain::version() << std::endl;
  bool ok = consumer_allreduce_sum_ok() && consumer_allgather_ok() && consumer_sampler_ok();
  if (argc > 1 && std::atoi(argv[1]) != size) {
    std::cerr << "rank " << rank << ": launched with " << argv[1] << " ranks but dtrain::size() is "
              << size << std::endl;
    ok = false;
  }
  return ok ? 0 : 1;
}
