// Compiled once per candidate type by tests/compile_fail/CMakeLists.txt; nothing else changes
// between the builds, so the std::vector<float> control compiling proves the flags are right and
// the other candidates fail for their type alone.
#include <dtrain/dtrain.hpp>

#include <string>
#include <vector>

namespace {
struct NotATensor {
  int value = 0;
};
}  // namespace

#if defined(DTRAIN_CANDIDATE_VECTOR_OF_FLOAT)
using Candidate = std::vector<float>;
#elif defined(DTRAIN_CANDIDATE_NOT_A_TENSOR)
using Candidate = NotATensor;
#elif defined(DTRAIN_CANDIDATE_VECTOR_OF_STRING)
using Candidate = std::vector<std::string>;
#else
#error "define one DTRAIN_CANDIDATE_* macro"
#endif

void submit_candidate(Candidate& candidate) { dtrain::allreduce(candidate); }
