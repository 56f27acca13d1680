#pragma once
// The size from which a tensor of a fused response is reduced in its own memory rather than
// packed (Note [Direct segments] in runtime/execution/fusion_pipeline.hpp), for the engine and for
// the gradient layouts that follow it (GradientBuffer, GradientViews).
#include <cstdint>

namespace dtrain::detail {

inline constexpr std::int64_t kFusionDirectMinBytes = std::int64_t{1} << 20;

}  // namespace dtrain::detail
