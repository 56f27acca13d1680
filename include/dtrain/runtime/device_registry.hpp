#pragma once
// Where the opt-in device path registers itself: <dtrain/cuda.hpp> sets the factory during static
// initialization, so that including it anywhere in a program enables device tensors everywhere.
// Light on purpose: the public collectives ask it whether device tensors can be accepted.
#include <memory>

namespace dtrain::detail {

class Backend;
struct BackendContext;

using DeviceBackendFactory = std::unique_ptr<Backend> (*)(const BackendContext&);

inline DeviceBackendFactory& device_backend_factory() noexcept {
  static DeviceBackendFactory f = nullptr;
  return f;
}

}  // namespace dtrain::detail
