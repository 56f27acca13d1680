// DistributedSampler::state / load_state (Note [Sampler position]): the same world continues each
// rank's shard exactly; another world takes the rest of the epoch's order, each sample once; a
// sampler built differently refuses the state.
#include "dtrain/data/distributed_sampler.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <map>
#include <vector>

#include "dtrain/data/permutation.hpp"
#include "dtrain/core/serialize.hpp"

namespace {

using Indices = std::vector<std::int64_t>;

dtrain::DistributedSampler make(std::int64_t n, std::int64_t replicas, std::int64_t rank,
                                bool drop_last = false) {
  return dtrain::DistributedSampler(n, replicas, rank, /*shuffle=*/true, /*seed=*/42, drop_last);
}

// The epoch's global order, computed here independently of the sampler.
Indices global_order(std::int64_t n, std::int64_t epoch) {
  auto engine = dtrain::detail::make_engine(42, epoch);
  return dtrain::detail::random_permutation(n, engine);
}

}  // namespace

TEST_CASE("sampler state: the same world continues every rank's shard where it stopped") {
  for (std::int64_t n : {10, 97, 100}) {
    for (std::int64_t replicas : {1, 2, 3, 4}) {
      for (bool drop_last : {false, true}) {
        for (std::int64_t taken = 0; taken <= make(n, replicas, 0, drop_last).size(); ++taken) {
          CAPTURE(n);
          CAPTURE(replicas);
          CAPTURE(drop_last);
          CAPTURE(taken);
          for (std::int64_t r = 0; r < replicas; ++r) {
            auto before = make(n, replicas, r, drop_last);
            before.set_epoch(3);
            const Indices full = before.indices();
            const dtrain::SamplerState s = before.state(taken);
            CHECK(s.epoch == 3);
            CHECK(s.position == taken * replicas);

            auto after = make(n, replicas, r, drop_last);
            after.load_state(s);
            after.set_epoch(3);  // the loaded epoch: keeps the position
            CHECK(after.epoch() == 3);
            CHECK(after.remaining() == before.size() - taken);
            CHECK(after.indices() == Indices(full.begin() + taken, full.end()));
            after.set_epoch(4);  // another epoch starts at its beginning
            auto fresh = make(n, replicas, r, drop_last);
            fresh.set_epoch(4);
            CHECK(after.indices() == fresh.indices());
          }
        }
      }
    }
  }
}

TEST_CASE("sampler state: another world takes the rest of the epoch, each sample once") {
  const std::int64_t epoch = 1;
  for (std::int64_t n : {10, 97, 100, 101}) {
    for (std::int64_t old_world : {1, 2, 3, 4}) {
      for (std::int64_t new_world : {1, 2, 3, 5}) {
        for (bool drop_last : {false, true}) {
          const std::int64_t per_rank = make(n, old_world, 0, drop_last).size();
          for (std::int64_t taken = 0; taken <= per_rank; taken += 1 + per_rank / 5) {
            CAPTURE(n);
            CAPTURE(old_world);
            CAPTURE(new_world);
            CAPTURE(drop_last);
            CAPTURE(taken);
            std::map<std::int64_t, int> seen;  // sample -> times taken this epoch
            dtrain::SamplerState saved;
            for (std::int64_t r = 0; r < old_world; ++r) {
              auto s = make(n, old_world, r, drop_last);
              s.set_epoch(epoch);
              const Indices mine = s.indices();
              for (std::int64_t k = 0; k < taken; ++k) ++seen[mine[static_cast<std::size_t>(k)]];
              saved = s.state(taken);  // the same on every rank
            }
            const std::int64_t position = taken * old_world;
            const std::int64_t rest = position >= n ? 0 : n - position;
            const std::int64_t expected_remaining =
                drop_last ? rest / new_world : (rest + new_world - 1) / new_world;
            const Indices order = global_order(n, epoch);
            for (std::int64_t r = 0; r < new_world; ++r) {
              auto s = make(n, new_world, r, drop_last);
              s.load_state(saved);
              s.set_epoch(epoch);
              const Indices mine = s.indices();
              CHECK(static_cast<std::int64_t>(mine.size()) == expected_remaining);
              // Strided over the rest of the same global order.
              for (std::size_t k = 0; k < mine.size(); ++k)
                CHECK(mine[k] == order[static_cast<std::size_t>(
                                     (position + r + static_cast<std::int64_t>(k) * new_world) % n)]);
              for (auto i : mine) ++seen[i];
            }
            // The first min(position, n) samples of the order were taken before, the rest after:
            // together each sample once, apart from padding (no drop_last) or the cut tail.
            if (!drop_last) {
              CHECK(static_cast<std::int64_t>(seen.size()) == n);
              std::int64_t extra = 0;
              for (const auto& [i, c] : seen) extra += c - 1;
              const std::int64_t padding_before = std::max<std::int64_t>(0, position - n);
              const std::int64_t padding_after = expected_remaining * new_world - rest;
              CHECK(extra == padding_before + padding_after);
            } else {
              for (const auto& [i, c] : seen) CHECK(c == 1);
              CHECK(static_cast<std::int64_t>(seen.size()) ==
                    std::min(position, n) + expected_remaining * new_world);
            }
          }
        }
      }
    }
  }
}

TEST_CASE("sampler state: a sampler built differently refuses it, naming the field") {
  auto saver = make(100, 2, 0);
  saver.set_epoch(2);
  const dtrain::SamplerState s = saver.state(10);

  auto other_size = make(99, 2, 0);
  CHECK_THROWS_WITH_AS(other_size.load_state(s),
                       doctest::Contains("saved sampler has dataset_size 100, this one has 99"),
                       dtrain::InvalidArgumentError);
  dtrain::DistributedSampler other_seed(100, 2, 0, true, 43);
  CHECK_THROWS_WITH_AS(other_seed.load_state(s), doctest::Contains("seed 42, this one has 43"),
                       dtrain::InvalidArgumentError);
  dtrain::DistributedSampler unshuffled(100, 2, 0, false, 42);
  CHECK_THROWS_WITH_AS(unshuffled.load_state(s), doctest::Contains("shuffle true, this one has false"),
                       dtrain::InvalidArgumentError);
  auto dropping = make(100, 2, 0, true);
  CHECK_THROWS_WITH_AS(dropping.load_state(s), doctest::Contains("drop_last"),
                       dtrain::InvalidArgumentError);
  CHECK_THROWS_AS(saver.state(-1), dtrain::InvalidArgumentError);
  CHECK_THROWS_AS(saver.state(51), dtrain::InvalidArgumentError);
  CHECK_NOTHROW(saver.state(50));
}

TEST_CASE("sampler state: serialized field by field, the same bytes for the same state") {
  auto sampler = make(1000, 4, 1, true);
  sampler.set_epoch(7);
  const dtrain::SamplerState s = sampler.state(12);
  const auto bytes = dtrain::serialize_object(s);
  CHECK(bytes.size() == 8 + 8 + 1 + 1 + 8 + 8 + 8);
  CHECK(dtrain::serialize_object(sampler.state(12)) == bytes);
  const auto back = dtrain::deserialize_object<dtrain::SamplerState>(bytes.data(), bytes.size());
  CHECK(back == s);
  CHECK(back.position == 48);
  CHECK(back.num_replicas == 4);
}
