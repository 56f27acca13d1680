#pragma once
// Where a DistributedSampler stands: enough to continue an epoch after a restart, on the same or
// on a different number of ranks.
//
// Note [Sampler position]
// An epoch's order is a pure function of (seed, epoch) (Note [Portable shuffling]); rank r of R
// takes positions r, r+R, r+2R, ... of it. After every rank has taken k samples, exactly the
// positions [0, kR) are consumed, whatever R is, so one number, the global position kR, says where
// the epoch stands. A sampler that loads it hands out the rest of the same order, positions
// [kR, N), strided over its own world: with the same R it continues each rank's old shard exactly
// (bitwise-equal restarts), with another R' it re-shards the rest, so no sample is skipped or
// taken twice apart from the usual end-of-epoch padding (or, with drop_last, cut).
#include <cstdint>

#include "dtrain/core/serialize.hpp"

namespace dtrain {

struct SamplerState {
  std::int64_t dataset_size = 0;
  std::uint64_t seed = 0;
  bool shuffle = true;
  bool drop_last = false;
  std::int64_t epoch = 0;
  std::int64_t position = 0;      // samples of the epoch's order taken so far, over all ranks
  std::int64_t num_replicas = 1;  // the world that took them (informational)
  friend bool operator==(const SamplerState&, const SamplerState&) = default;
};

// Field by field, so the bytes are deterministic (a struct copy would include padding).
inline void dtrain_serialize(ObjectWriter& w, const SamplerState& s) {
  w.write(s.dataset_size);
  w.write(s.seed);
  w.write(static_cast<std::uint8_t>(s.shuffle));
  w.write(static_cast<std::uint8_t>(s.drop_last));
  w.write(s.epoch);
  w.write(s.position);
  w.write(s.num_replicas);
}

inline void dtrain_deserialize(ObjectReader& r, SamplerState& s) {
  std::uint8_t shuffle = 0, drop_last = 0;
  r.read(s.dataset_size);
  r.read(s.seed);
  r.read(shuffle);
  r.read(drop_last);
  r.read(s.epoch);
  r.read(s.position);
  r.read(s.num_replicas);
  s.shuffle = shuffle != 0;
  s.drop_last = drop_last != 0;
}

}  // namespace dtrain
