#pragma once
// What the multi-rank reliability tests share: the odd rank out (always the last one) and a check
// that a call throws the expected exception type with every expected fragment in its message.
#include <exception>
#include <initializer_list>
#include <string>
#include <typeinfo>

#include "engine/engine_test.hpp"

namespace dtrain::test {

inline int last_rank() { return world_size() - 1; }
inline bool is_odd_one() { return world_rank() == last_rank(); }

// Runs `call`, expects exception E whose message contains every fragment.
template <class E, class F>
void expect(F&& call, std::initializer_list<std::string> fragments, const std::string& what) {
  try {
    call();
    FAIL_CHECK(what << ": no exception on rank " << world_rank());
  } catch (const E& e) {
    const std::string message = e.what();
    INFO(what, " on rank ", world_rank(), ": ", message);
    for (const auto& f : fragments)
      CHECK_MESSAGE(message.find(f) != std::string::npos, "missing '" << f << "'");
  } catch (const std::exception& e) {
    FAIL_CHECK(what << ": wrong exception type on rank " << world_rank() << ": "
                    << std::string(typeid(e).name()) << ": " << std::string(e.what()));
  }
}

}  // namespace dtrain::test
