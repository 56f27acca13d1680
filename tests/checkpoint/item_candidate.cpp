// Compiled once per candidate by tests/checkpoint/CMakeLists.txt: a checkpoint item must own its
// data. The std::vector<float> control must compile; a span or a pointer would save an address
// and must be rejected with a message saying so.
#include <dtrain/dtrain.hpp>

#include <span>
#include <vector>

void save_candidate(dtrain::Checkpoint& checkpoint, std::vector<float>& weights) {
#if defined(DTRAIN_ITEM_VECTOR)
  checkpoint.save({.step = 1}, {{"weights", weights}});
#elif defined(DTRAIN_ITEM_SPAN)
  checkpoint.save({.step = 1}, {{"weights", std::span<float>(weights)}});
#elif defined(DTRAIN_ITEM_POINTER)
  const float* p = weights.data();
  checkpoint.save({.step = 1}, {{"weights", p}});
#else
#error "define one DTRAIN_ITEM_* macro"
#endif
}
