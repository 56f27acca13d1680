#pragma once
// Splits a dataset of indexed samples across data-parallel replicas, PyTorch-style.
//
// Note [Equal steps on every rank]
// In synchronous data-parallel training every optimizer step runs collectives (gradient
// allreduce) that all ranks must enter. If one rank's shard had one batch more than another's,
// that rank would enter an allreduce for a step the others never take and wait forever: the
// classic end-of-epoch deadlock. So size() and num_batches() are the same on every rank by
// construction: without drop_last the shuffled index list is padded by wrapping around to
// ceil(N/R)*R entries (a few samples are seen twice per epoch), with drop_last it is cut to
// floor(N/R)*R (a few samples are skipped this epoch). Shards are strided over that list
// (rank, rank+R, ...), so they are disjoint apart from the padding and, without drop_last,
// together cover the dataset.
//
// Every rank must construct the sampler with the same dataset_size and options (shuffle, seed,
// drop_last) and call set_epoch() with the same epoch; the order is then identical everywhere
// (Note [Portable shuffling] in permutation.hpp).
//
// state() and load_state() carry the position within an epoch across a restart, also to another
// number of ranks (Note [Sampler position] in sampler_state.hpp).
#include <cstdint>
#include <limits>
#include <vector>

#include <fmt/format.h>

#include "dtrain/core/error.hpp"
#include "dtrain/data/partition.hpp"
#include "dtrain/data/permutation.hpp"
#include "dtrain/data/sampler_options.hpp"
#include "dtrain/data/sampler_state.hpp"

namespace dtrain {

class DistributedSampler {
 public:
  // This rank takes part `partition.part` of `partition.parts`:
  //   DistributedSampler sampler(n, {.parts = dtrain::size(), .part = dtrain::rank()},
  //                              {.shuffle = true, .seed = 7});
  DistributedSampler(std::int64_t dataset_size, Partition partition, SamplerOptions options = {})
      : DistributedSampler(dataset_size, partition, options, detail::PartitionNames{}) {}

  // The same sampler as DistributedSampler(dataset_size, {num_replicas, rank},
  // {shuffle, seed, drop_last}), in PyTorch's argument order.
  DistributedSampler(std::int64_t dataset_size, std::int64_t num_replicas, std::int64_t rank,
                     bool shuffle = true, std::uint64_t seed = 0, bool drop_last = false)
      : DistributedSampler(dataset_size, Partition{num_replicas, rank},
                           SamplerOptions{shuffle, seed, drop_last},
                           detail::PartitionNames{"num_replicas", "rank"}) {}

  // Selects the epoch's order. Call it at the start of every epoch with the same value on every
  // rank; without it every epoch repeats epoch 0's order. An epoch other than the current one
  // starts at its beginning; the current one keeps the position load_state() gave it.
  void set_epoch(std::int64_t epoch) {
    if (epoch < 0) {
      throw InvalidArgumentError(
          fmt::format("dtrain: DistributedSampler::set_epoch: epoch must be >= 0, got {}", epoch));
    }
    if (epoch != epoch_) start_ = 0;
    epoch_ = epoch;
  }

  // The position after this rank has taken the first `taken` entries of indices(); every rank
  // passes the same count (they take batches in lockstep).
  SamplerState state(std::int64_t taken) const {
    if (taken < 0 || taken > remaining()) {
      throw InvalidArgumentError(fmt::format(
          "dtrain: DistributedSampler::state: taken must be in [0, {}] (the samples indices() "
          "hands out in this epoch), got {}",
          remaining(), taken));
    }
    SamplerState s;
    s.dataset_size = dataset_size_;
    s.seed = seed_;
    s.shuffle = shuffle_;
    s.drop_last = drop_last_;
    s.epoch = epoch_;
    s.position = start_ + taken * parts_;
    s.num_replicas = parts_;
    return s;
  }

  // Continues from a saved position: selects its epoch, and indices() then hands out the rest of
  // that epoch's order, re-sharded over this sampler's parts if their number differs from the saved
  // one (Note [Sampler position]). The dataset size, shuffle, seed and drop_last must match the
  // saved ones, or the order would not be the same.
  void load_state(const SamplerState& s) {
    auto mismatch = [&](const char* field, const auto& saved, const auto& mine) {
      return InvalidArgumentError(fmt::format(
          "dtrain: DistributedSampler::load_state: the saved sampler has {} {}, this one has {}: "
          "construct it with the dataset_size, shuffle, seed and drop_last of the run that saved "
          "it (or start that epoch afresh)",
          field, saved, mine));
    };
    if (s.dataset_size != dataset_size_) throw mismatch("dataset_size", s.dataset_size, dataset_size_);
    if (s.seed != seed_) throw mismatch("seed", s.seed, seed_);
    if (s.shuffle != shuffle_) throw mismatch("shuffle", s.shuffle, shuffle_);
    if (s.drop_last != drop_last_) throw mismatch("drop_last", s.drop_last, drop_last_);
    if (s.epoch < 0 || s.position < 0) {
      throw InvalidArgumentError(fmt::format(
          "dtrain: DistributedSampler::load_state: epoch {} and position {} must be >= 0",
          s.epoch, s.position));
    }
    epoch_ = s.epoch;
    start_ = s.position;
  }

  // Samples indices() hands out in the current epoch: size(), or fewer after load_state(). The
  // same on every rank.
  std::int64_t remaining() const noexcept {
    if (start_ == 0) return num_samples_;
    if (start_ >= dataset_size_) return 0;
    const std::int64_t rest = dataset_size_ - start_;
    return drop_last_ ? rest / parts_ : rest / parts_ + (rest % parts_ != 0);
  }

  std::int64_t epoch() const noexcept { return epoch_; }

  // Samples per rank in a whole epoch; the same on every rank.
  std::int64_t size() const noexcept { return num_samples_; }

  std::int64_t dataset_size() const noexcept { return dataset_size_; }
  std::int64_t parts() const noexcept { return parts_; }
  std::int64_t part() const noexcept { return part_; }
  std::int64_t num_replicas() const noexcept { return parts_; }  // = parts()
  std::int64_t rank() const noexcept { return part_; }                  // = part()
  bool shuffle() const noexcept { return shuffle_; }
  std::uint64_t seed() const noexcept { return seed_; }
  bool drop_last() const noexcept { return drop_last_; }

  // This rank's sample indices for the current epoch, remaining() of them (size() unless
  // load_state() moved into the epoch).
  std::vector<std::int64_t> indices() const {
    std::vector<std::int64_t> order;
    if (shuffle_) {
      auto engine = detail::make_engine(seed_, epoch_);
      order = detail::random_permutation(dataset_size_, engine);
    } else {
      order = detail::identity_permutation(dataset_size_);
    }
    // Position p of the padded (or truncated) global list is order[p mod N]; only this rank's
    // positions start+rank, start+rank+R, ... are materialized.
    const std::int64_t count = remaining();
    std::vector<std::int64_t> mine;
    mine.reserve(static_cast<std::size_t>(count));
    for (std::int64_t k = 0; k < count; ++k) {
      const std::int64_t position = start_ + part_ + k * parts_;
      mine.push_back(order[static_cast<std::size_t>(position % dataset_size_)]);
    }
    return mine;
  }

  // Batches per rank per epoch for a given per-rank batch size; the same on every rank.
  std::int64_t num_batches(std::int64_t batch_size, bool drop_last_batch) const {
    if (batch_size <= 0) {
      throw InvalidArgumentError(
          fmt::format("dtrain: DistributedSampler::num_batches: batch_size must be >= 1, got {}",
                      batch_size));
    }
    if (drop_last_batch) return num_samples_ / batch_size;
    return num_samples_ / batch_size + (num_samples_ % batch_size != 0 ? 1 : 0);
  }

 private:
  // Errors name the numbers as the caller passed them (`names`).
  DistributedSampler(std::int64_t dataset_size, Partition partition, SamplerOptions options,
                     detail::PartitionNames names)
      : dataset_size_(dataset_size),
        parts_(partition.parts),
        part_(partition.part),
        shuffle_(options.shuffle),
        seed_(options.seed),
        drop_last_(options.drop_last) {
    if (dataset_size < 0) {
      throw InvalidArgumentError(fmt::format(
          "dtrain: DistributedSampler: dataset_size must be >= 0, got {}", dataset_size));
    }
    detail::check_partition("DistributedSampler", partition, names);
    if (drop_last_) {
      num_samples_ = dataset_size / parts_;
    } else {
      // ceil(N/R) * R must fit in int64 so the padded list can be indexed.
      num_samples_ = dataset_size / parts_ + (dataset_size % parts_ != 0 ? 1 : 0);
      if (num_samples_ > std::numeric_limits<std::int64_t>::max() / parts_) {
        throw InvalidArgumentError(fmt::format(
            "dtrain: DistributedSampler: dataset_size {} padded to a multiple of {} {} "
            "overflows int64",
            dataset_size, names.parts, parts_));
      }
    }
  }

  std::int64_t dataset_size_;
  std::int64_t parts_;
  std::int64_t part_;
  bool shuffle_;
  std::uint64_t seed_;
  bool drop_last_;
  std::int64_t num_samples_ = 0;
  std::int64_t epoch_ = 0;
  std::int64_t start_ = 0;  // global position the current epoch continues from
};

}  // namespace dtrain
