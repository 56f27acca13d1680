#pragma once
// The range concept of the public templates, spelled with <iterator> rather than <ranges>, which
// would be paid for in every file that includes <dtrain/dtrain.hpp> (Note [Build modes] in
// core/build_mode.hpp).
#include <iterator>
#include <type_traits>
#include <utility>

namespace dtrain {

// Anything a range-for loop walks: containers, spans, arrays, views.
template <class R>
concept Range = requires(R& r) {
  std::begin(r);
  std::end(r);
};

template <Range R>
using range_value_t = std::remove_cvref_t<decltype(*std::begin(std::declval<R&>()))>;

}  // namespace dtrain
