#pragma once
// How data/ is told which share of the data a rank takes: the data is split into `parts` equal
// parts (one per data-parallel rank, usually dtrain::size()) and this rank takes part `part`
// (usually dtrain::rank()). DistributedSampler, SplitSortedBucketSampler and shard_files all take
// one, so the two numbers have one name wherever data is split.
#include <cstdint>
#include <string_view>

#include <fmt/format.h>

#include "dtrain/core/error.hpp"

namespace dtrain {

struct Partition {
  std::int64_t parts = 0;  // how many parts; >= 1. No default: forgetting it is an error
  std::int64_t part = 0;   // which one this rank takes; in [0, parts)
};

namespace detail {

// The names a caller knows the two numbers by: the fields, or the positional parameters of
// DistributedSampler's spec'd constructor (num_replicas, rank).
struct PartitionNames {
  std::string_view parts = "partition.parts";
  std::string_view part = "partition.part";
};

inline void check_partition(std::string_view who, const Partition& p, PartitionNames names = {}) {
  if (p.parts <= 0) {
    throw InvalidArgumentError(fmt::format(
        "dtrain: {}: {} must be >= 1, got {} (the number of ranks sharing the data, e.g. "
        "dtrain::size())",
        who, names.parts, p.parts));
  }
  if (p.part < 0 || p.part >= p.parts) {
    throw InvalidArgumentError(fmt::format(
        "dtrain: {}: {} must be in [0, {}) = [0, {}), got {} (this rank's index, e.g. "
        "dtrain::rank())",
        who, names.part, names.parts, p.parts, p.part));
  }
}

}  // namespace detail

}  // namespace dtrain
