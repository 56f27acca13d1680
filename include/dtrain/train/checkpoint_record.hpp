#pragma once
// The index of a checkpoint's payload (Note [Checkpoint file format] in
// train/checkpoint_format.hpp): where each item's bytes lie, as RestoredCheckpoint reads them.
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace dtrain::detail {

// Byte ranges of one item inside a payload.
struct ItemBytes {
  std::size_t offset = 0;
  std::size_t size = 0;
};

struct CheckpointRecord {
  std::int64_t step = 0;
  std::int64_t epoch = 0;
  std::int64_t world_size = 0;
  std::string writer;
  std::vector<std::pair<std::string, ItemBytes>> shared;
  std::vector<std::pair<std::string, std::vector<ItemBytes>>> per_rank;  // one range per rank
};

}  // namespace dtrain::detail
