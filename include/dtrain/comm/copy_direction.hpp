#pragma once
// Which way a copy between tensors and a fusion buffer goes; the host fusion pipeline and the
// device copy plans both say it with this one name.
#include <cstdint>

namespace dtrain::detail {

enum class CopyDirection : std::uint8_t {
  pack,    // tensors -> fusion buffer, before the collective
  unpack,  // fusion buffer -> tensors, after it
};

}  // namespace dtrain::detail
