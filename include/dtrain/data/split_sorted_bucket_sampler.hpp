#pragma once
// Batches variable-sized samples (detection images of different shapes) so that each batch holds
// samples of similar size, and splits the batches into equal-length, cost-balanced parts, one
// per data-parallel rank.
//
// Note [Split sorted buckets]
// Goal: every rank takes the same number of steps per epoch (Note [Equal steps on every rank]
// in distributed_sampler.hpp), padding inside a batch is small (similar sizes together), and
// ranks wait little for each other, both at every step and over the epoch.
// Per epoch, all ranks compute the same global plan from (seed, epoch) and keep their part:
//  1. Tie keys: a random permutation of the samples (the index itself without shuffle). With
//     drop_last the samples with the n mod batch_size highest keys sit out this epoch, so every
//     batch is full and which samples are skipped changes per epoch.
//  2. Sort the remaining samples by (size, tie key) and cut them into batches of batch_size; the
//     last batch (largest samples) may be smaller without drop_last. Random tie keys mix samples
//     of equal size (say, the many 4:3 images) differently every epoch. A batch's cost is the sum
//     of its sizes; it does not depend on the tie keys.
//  3. Shuffle the B batches and take parts * L slots from that order, L = ceil(B / parts)
//     (wrapping around, so a few random batches run twice) or, with drop_last, L = floor(B/parts)
//     (a few random batches are skipped).
//  4. Sort the slots by cost and cut them into L rounds of `parts` slots. A round is one global
//     step: every part gets exactly one batch of each round, so at every step all ranks hold
//     batches of neighbouring cost and nobody waits long for a straggler.
//  5. Inside a round, batches go to parts serpentine-fashion over pairs of rounds: part j takes
//     position s(j) in the even round and parts-1-s(j) in the odd one, so the pair sums are
//     nearly equal; s is a fresh random permutation for every pair, so a rank's share of the
//     data changes from epoch to epoch instead of being fixed.
//  6. The order of rounds (steps) is shuffled.
// Balance guarantee: because every part takes one batch from each round and rounds are
// contiguous in cost order, for any two parts |total_a - total_b| <= max batch cost - min batch
// cost (write each total as a sum over rounds; a batch of round r costs at most any batch of round
// r-1, so the difference telescopes to first-round max minus last-round min). Serpentine pairing
// makes the typical difference much smaller than that bound.
// Without shuffle there are no random choices: ties by index, the trailing samples and batches
// are the ones dropped, padding repeats the first batches, pairs are plain serpentine, and
// rounds run from cheapest to most expensive.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "dtrain/core/error.hpp"
#include "dtrain/data/partition.hpp"
#include "dtrain/data/permutation.hpp"
#include "dtrain/data/sampler_options.hpp"

namespace dtrain {

class SplitSortedBucketSampler {
 public:
  // sizes[i]: the size or cost of sample i (pixels, tokens, an aspect ratio); finite and >= 0.
  // This rank takes part `partition.part` of `partition.parts`:
  //   SplitSortedBucketSampler sampler(sizes, batch_size,
  //                                    {.parts = dtrain::size(), .part = dtrain::rank()},
  //                                    {.seed = 7});
  SplitSortedBucketSampler(std::vector<double> sizes, std::int64_t batch_size, Partition partition,
                           SamplerOptions options = {})
      : SplitSortedBucketSampler(std::move(sizes), batch_size, partition, options,
                                 detail::PartitionNames{}) {}

  // The spec's positional form, the same sampler: part `part_index` of `num_parts`.
  SplitSortedBucketSampler(std::vector<double> sizes, std::int64_t batch_size,
                           std::int64_t num_parts, std::int64_t part_index, bool shuffle = true,
                           std::uint64_t seed = 0, bool drop_last = false)
      : SplitSortedBucketSampler(std::move(sizes), batch_size, Partition{num_parts, part_index},
                                 SamplerOptions{shuffle, seed, drop_last},
                                 detail::PartitionNames{"num_parts", "part_index"}) {}

 private:
  SplitSortedBucketSampler(std::vector<double> sizes, std::int64_t batch_size, Partition partition,
                           SamplerOptions options, detail::PartitionNames names)
      : sizes_(std::move(sizes)),
        batch_size_(batch_size),
        parts_(partition.parts),
        part_(partition.part),
        shuffle_(options.shuffle),
        seed_(options.seed),
        drop_last_(options.drop_last) {
    if (batch_size <= 0) {
      throw InvalidArgumentError(fmt::format(
          "dtrain: SplitSortedBucketSampler: batch_size must be >= 1, got {}", batch_size));
    }
    detail::check_partition("SplitSortedBucketSampler", partition, names);
    for (std::size_t i = 0; i < sizes_.size(); ++i) {
      if (!std::isfinite(sizes_[i]) || sizes_[i] < 0) {
        throw InvalidArgumentError(fmt::format(
            "dtrain: SplitSortedBucketSampler: sizes[{}] must be finite and >= 0, got {}", i,
            sizes_[i]));
      }
    }
    const auto n = static_cast<std::int64_t>(sizes_.size());
    num_sample_batches_ = drop_last_ ? n / batch_size : (n + batch_size - 1) / batch_size;
    num_batches_ = drop_last_ ? num_sample_batches_ / parts_
                              : (num_sample_batches_ + parts_ - 1) / parts_;
    plan();
  }

 public:
  // Selects the epoch's plan. Call it at the start of every epoch with the same value on every
  // rank; without it every epoch repeats epoch 0's plan.
  void set_epoch(std::int64_t epoch) {
    if (epoch < 0) {
      throw InvalidArgumentError(fmt::format(
          "dtrain: SplitSortedBucketSampler::set_epoch: epoch must be >= 0, got {}", epoch));
    }
    epoch_ = epoch;
    plan();
  }

  std::int64_t epoch() const noexcept { return epoch_; }

  // This part's batches for the current epoch, in step order; each holds sample indices.
  const std::vector<std::vector<std::int64_t>>& batches() const noexcept { return batches_; }

  // Batches (steps) per part per epoch; the same for every part.
  std::int64_t num_batches() const noexcept { return num_batches_; }

  std::int64_t batch_size() const noexcept { return batch_size_; }
  std::int64_t parts() const noexcept { return parts_; }
  std::int64_t part() const noexcept { return part_; }
  std::int64_t num_parts() const noexcept { return parts_; }   // the spec's names for the two
  std::int64_t part_index() const noexcept { return part_; }
  std::int64_t dataset_size() const noexcept { return static_cast<std::int64_t>(sizes_.size()); }
  const std::vector<double>& sizes() const noexcept { return sizes_; }

 private:
  void plan() {
    batches_.clear();
    if (num_batches_ == 0) return;
    const auto n = static_cast<std::int64_t>(sizes_.size());
    const std::int64_t parts = parts_;
    auto engine = detail::make_engine(seed_, epoch_);

    // Steps 1-2: tie keys, sit-outs, sorted batches and their costs.
    const std::vector<std::int64_t> key =
        shuffle_ ? detail::random_permutation(n, engine) : detail::identity_permutation(n);
    const std::int64_t kept = drop_last_ ? n - n % batch_size_ : n;
    std::vector<std::int64_t> order;
    order.reserve(static_cast<std::size_t>(kept));
    for (std::int64_t i = 0; i < n; ++i) {
      if (key[static_cast<std::size_t>(i)] < kept) order.push_back(i);
    }
    std::sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) {
      const double sa = sizes_[static_cast<std::size_t>(a)];
      const double sb = sizes_[static_cast<std::size_t>(b)];
      if (sa != sb) return sa < sb;
      return key[static_cast<std::size_t>(a)] < key[static_cast<std::size_t>(b)];
    });
    const std::int64_t num_sample_batches = num_sample_batches_;
    std::vector<double> cost(static_cast<std::size_t>(num_sample_batches), 0.0);
    for (std::int64_t p = 0; p < kept; ++p) {
      cost[static_cast<std::size_t>(p / batch_size_)] +=
          sizes_[static_cast<std::size_t>(order[static_cast<std::size_t>(p)])];
    }

    // Step 3: slots, each naming a batch.
    const std::vector<std::int64_t> batch_order =
        shuffle_ ? detail::random_permutation(num_sample_batches, engine)
                 : detail::identity_permutation(num_sample_batches);
    const std::int64_t num_slots = num_batches_ * parts;
    std::vector<std::int64_t> slot_batch(static_cast<std::size_t>(num_slots));
    for (std::int64_t s = 0; s < num_slots; ++s) {
      slot_batch[static_cast<std::size_t>(s)] =
          batch_order[static_cast<std::size_t>(s % num_sample_batches)];
    }

    // Step 4: rounds in cost order; (cost, batch, slot) is a total order, so the result does not
    // depend on the sort implementation.
    std::vector<std::int64_t> slots = detail::identity_permutation(num_slots);
    std::sort(slots.begin(), slots.end(), [&](std::int64_t a, std::int64_t b) {
      const std::int64_t ba = slot_batch[static_cast<std::size_t>(a)];
      const std::int64_t bb = slot_batch[static_cast<std::size_t>(b)];
      const double ca = cost[static_cast<std::size_t>(ba)];
      const double cb = cost[static_cast<std::size_t>(bb)];
      if (ca != cb) return ca < cb;
      if (ba != bb) return ba < bb;
      return a < b;
    });

    // Steps 5-6: the step order, then one position permutation per pair of rounds. Every rank
    // draws all of them so the engine stays in step across ranks.
    const std::vector<std::int64_t> round_order =
        shuffle_ ? detail::random_permutation(num_batches_, engine)
                 : detail::identity_permutation(num_batches_);
    const std::int64_t num_pairs = (num_batches_ + 1) / 2;
    std::vector<std::int64_t> my_position_in_pair(static_cast<std::size_t>(num_pairs));
    for (std::int64_t pair = 0; pair < num_pairs; ++pair) {
      const std::vector<std::int64_t> position = shuffle_
                                                     ? detail::random_permutation(parts, engine)
                                                     : detail::identity_permutation(parts);
      my_position_in_pair[static_cast<std::size_t>(pair)] =
          position[static_cast<std::size_t>(part_)];
    }

    batches_.reserve(static_cast<std::size_t>(num_batches_));
    for (std::int64_t step = 0; step < num_batches_; ++step) {
      const std::int64_t round = round_order[static_cast<std::size_t>(step)];
      const std::int64_t s = my_position_in_pair[static_cast<std::size_t>(round / 2)];
      const std::int64_t position = round % 2 == 0 ? s : parts - 1 - s;
      const std::int64_t slot = slots[static_cast<std::size_t>(round * parts + position)];
      const std::int64_t batch = slot_batch[static_cast<std::size_t>(slot)];
      const std::int64_t begin = batch * batch_size_;
      const std::int64_t end = std::min(begin + batch_size_, kept);
      batches_.emplace_back(order.begin() + begin, order.begin() + end);
    }
  }

  std::vector<double> sizes_;
  std::int64_t batch_size_;
  std::int64_t parts_;
  std::int64_t part_;
  bool shuffle_;
  std::uint64_t seed_;
  bool drop_last_;
  std::int64_t num_sample_batches_ = 0;
  std::int64_t num_batches_ = 0;
  std::int64_t epoch_ = 0;
  std::vector<std::vector<std::int64_t>> batches_;
};

}  // namespace dtrain
