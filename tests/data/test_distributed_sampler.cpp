#include "dtrain/data/distributed_sampler.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "dtrain/data/permutation.hpp"
#include "support/error_message.hpp"

namespace {

using dtrain::test::message_of;

using Indices = std::vector<std::int64_t>;

std::vector<Indices> all_shards(std::int64_t n, std::int64_t replicas, bool shuffle,
                                std::uint64_t seed, bool drop_last, std::int64_t epoch) {
  std::vector<Indices> shards;
  for (std::int64_t r = 0; r < replicas; ++r) {
    dtrain::DistributedSampler sampler(n, replicas, r, shuffle, seed, drop_last);
    sampler.set_epoch(epoch);
    shards.push_back(sampler.indices());
    CHECK(static_cast<std::int64_t>(shards.back().size()) == sampler.size());
  }
  return shards;
}

// Checks the contract for one configuration: equal lengths, indices in range, coverage without
// drop_last, disjointness apart from the padding.
void check_contract(std::int64_t n, std::int64_t replicas, bool shuffle, bool drop_last,
                    std::int64_t epoch) {
  CAPTURE(n);
  CAPTURE(replicas);
  CAPTURE(shuffle);
  CAPTURE(drop_last);
  CAPTURE(epoch);
  const auto shards = all_shards(n, replicas, shuffle, 1234, drop_last, epoch);
  const std::int64_t expected_len = drop_last ? n / replicas : (n + replicas - 1) / replicas;
  std::map<std::int64_t, int> count;
  for (const auto& shard : shards) {
    CHECK(static_cast<std::int64_t>(shard.size()) == expected_len);
    for (const auto i : shard) {
      CHECK(i >= 0);
      CHECK(i < n);
      ++count[i];
    }
  }
  const std::int64_t total = expected_len * replicas;
  if (drop_last) {
    // No index twice: shards are disjoint.
    for (const auto& [index, c] : count) CHECK(c == 1);
    CHECK(static_cast<std::int64_t>(count.size()) == total);
  } else {
    // Every index at least once; the only repeats are the total - n padding entries, spread as
    // evenly as wrapping allows.
    CHECK(static_cast<std::int64_t>(count.size()) == n);
    std::int64_t repeats = 0;
    for (const auto& [index, c] : count) {
      CHECK(c >= total / std::max<std::int64_t>(n, 1));
      CHECK(c <= (total + n - 1) / std::max<std::int64_t>(n, 1));
      repeats += c - 1;
    }
    CHECK(repeats == total - n);
  }
}

}  // namespace

TEST_CASE("the standard engine and the bounded draw are the portable ones") {
  // The C++ standard fixes the 10000th output of a default-constructed mt19937_64.
  std::mt19937_64 standard;
  standard.discard(9999);
  CHECK(standard() == 9981545732273789042ULL);
  // Golden values pin the (seed, epoch) mixing and the bounded draw.
  CHECK(dtrain::detail::mix_seed(0, 0) == 0xA706DD2F4D197E6FULL);
  auto engine = dtrain::detail::make_engine(0, 0);
  CHECK(engine() == 8892643065069030078ULL);
  auto e1 = dtrain::detail::make_engine(3, 5);
  std::vector<std::uint64_t> draws;
  for (int i = 0; i < 6; ++i) draws.push_back(dtrain::detail::uniform_below(e1, 7));
  CHECK(draws == std::vector<std::uint64_t>{3, 1, 0, 4, 0, 5});
}

TEST_CASE("dtrain's Mt19937_64 draws the numbers of std::mt19937_64") {
  // The samplers' engine is spelled out (Note [Portable shuffling]); it must stay the standard's.
  for (std::uint64_t seed : {0ULL, 1ULL, 5489ULL, 0xA706DD2F4D197E6FULL, ~0ULL}) {
    std::mt19937_64 standard(seed);
    dtrain::detail::Mt19937_64 ours(seed);
    bool same = true;
    for (int i = 0; i < 2000 && same; ++i) same = standard() == ours();  // crosses 6 twists
    CHECK_MESSAGE(same, "seed " << seed);
  }
  dtrain::detail::Mt19937_64 ours(5489);  // the standard's default seed
  for (int i = 0; i < 9999; ++i) (void)ours();
  CHECK(ours() == 9981545732273789042ULL);
}

TEST_CASE("uniform_below stays in range and is unbiased for a bound that does not divide 2^64") {
  auto engine = dtrain::detail::make_engine(99, 0);
  const std::uint64_t bound = 3;
  std::vector<int> hist(bound, 0);
  const int draws = 30000;
  for (int i = 0; i < draws; ++i) {
    const auto x = dtrain::detail::uniform_below(engine, bound);
    REQUIRE(x < bound);
    ++hist[x];
  }
  // Fixed seed, so this is deterministic; each bucket within 3% of the expected 10000.
  for (const int h : hist) CHECK(std::abs(h - draws / 3) < 300);
  CHECK(dtrain::detail::uniform_below(engine, 1) == 0);
}

TEST_CASE("uniform_below rejects the biased range for large bounds") {
  // bound = 3 * 2^62: a plain `x % bound` lands in [0, 2^62) half the time (those values are hit
  // twice), the unbiased draw a third of the time.
  auto engine = dtrain::detail::make_engine(7, 0);
  const std::uint64_t quarter = std::uint64_t{1} << 62;
  const std::uint64_t bound = 3 * quarter;
  int low = 0;
  for (int i = 0; i < 3000; ++i) {
    const auto x = dtrain::detail::uniform_below(engine, bound);
    REQUIRE(x < bound);
    if (x < quarter) ++low;
  }
  CHECK(low > 850);
  CHECK(low < 1150);
}

TEST_CASE("shuffle_in_place is a permutation") {
  auto engine = dtrain::detail::make_engine(5, 2);
  auto perm = dtrain::detail::random_permutation(50, engine);
  CHECK(perm != dtrain::detail::identity_permutation(50));
  std::sort(perm.begin(), perm.end());
  CHECK(perm == dtrain::detail::identity_permutation(50));
}

TEST_CASE("shards are equal-length, cover the dataset and are disjoint apart from padding") {
  // Sizes that do not divide evenly, a dataset smaller than the world, an empty one, exact fits.
  const std::vector<std::pair<std::int64_t, std::int64_t>> cases = {
      {10, 3}, {7, 4}, {0, 3}, {2, 5}, {1, 4}, {12, 4}, {5, 1}, {101, 8}, {3, 3}};
  for (const auto& [n, r] : cases) {
    for (const bool shuffle : {true, false}) {
      for (const bool drop_last : {false, true}) {
        for (const std::int64_t epoch : {0, 3}) check_contract(n, r, shuffle, drop_last, epoch);
      }
    }
  }
}

TEST_CASE("size and num_batches agree on every rank, including uneven cases") {
  struct Case {
    std::int64_t n, r;
    bool drop_last;
    std::int64_t size;
  };
  for (const Case c : {Case{10, 3, false, 4}, Case{10, 3, true, 3}, Case{7, 4, false, 2},
                       Case{7, 4, true, 1}, Case{0, 3, false, 0}, Case{2, 5, false, 1},
                       Case{2, 5, true, 0}}) {
    CAPTURE(c.n);
    CAPTURE(c.r);
    for (std::int64_t rank = 0; rank < c.r; ++rank) {
      dtrain::DistributedSampler s(c.n, c.r, rank, true, 0, c.drop_last);
      CHECK(s.size() == c.size);
      CHECK(s.num_batches(3, false) == (c.size + 2) / 3);
      CHECK(s.num_batches(3, true) == c.size / 3);
    }
  }
  dtrain::DistributedSampler s(10, 3, 0);  // 4 samples per rank
  CHECK(s.num_batches(1, false) == 4);
  CHECK(s.num_batches(3, false) == 2);
  CHECK(s.num_batches(3, true) == 1);
  CHECK(s.num_batches(4, true) == 1);
  CHECK(s.num_batches(5, true) == 0);
  CHECK(s.num_batches(5, false) == 1);
}

TEST_CASE("without shuffle shards are strided over the index list and wrap around") {
  CHECK(dtrain::DistributedSampler(10, 3, 0, false).indices() == Indices{0, 3, 6, 9});
  CHECK(dtrain::DistributedSampler(10, 3, 1, false).indices() == Indices{1, 4, 7, 0});
  CHECK(dtrain::DistributedSampler(10, 3, 2, false).indices() == Indices{2, 5, 8, 1});
  CHECK(dtrain::DistributedSampler(10, 3, 2, false, 0, true).indices() == Indices{2, 5, 8});
  CHECK(dtrain::DistributedSampler(2, 5, 4, false).indices() == Indices{0});
  CHECK(dtrain::DistributedSampler(2, 5, 3, false).indices() == Indices{1});
  // Without shuffle the epoch does not matter.
  dtrain::DistributedSampler s(10, 3, 1, false);
  s.set_epoch(7);
  CHECK(s.indices() == Indices{1, 4, 7, 0});
}

TEST_CASE("golden shards for a fixed seed (N=10, R=3, seed=42)") {
  // These pin the shuffling scheme: a change here changes every user's data order.
  const auto e0 = all_shards(10, 3, true, 42, false, 0);
  CHECK(e0[0] == Indices{9, 0, 3, 7});
  CHECK(e0[1] == Indices{6, 1, 8, 9});
  CHECK(e0[2] == Indices{2, 4, 5, 6});
  const auto e1 = all_shards(10, 3, true, 42, false, 1);
  CHECK(e1[0] == Indices{5, 3, 7, 9});
  CHECK(e1[1] == Indices{4, 0, 8, 5});
  CHECK(e1[2] == Indices{1, 2, 6, 4});
  const auto d0 = all_shards(7, 4, true, 42, true, 0);
  CHECK(d0 == std::vector<Indices>{Indices{6}, Indices{2}, Indices{3}, Indices{1}});
}

TEST_CASE("the order is a function of seed and epoch only") {
  dtrain::DistributedSampler a(1000, 4, 2, true, 17);
  dtrain::DistributedSampler b(1000, 4, 2, true, 17);
  a.set_epoch(5);
  b.set_epoch(5);
  CHECK(a.indices() == b.indices());
  CHECK(a.indices() == a.indices());

  dtrain::DistributedSampler c(1000, 4, 2, true, 17);
  c.set_epoch(6);
  CHECK(c.indices() != a.indices());

  dtrain::DistributedSampler d(1000, 4, 2, true, 18);
  d.set_epoch(5);
  CHECK(d.indices() != a.indices());

  // (seed, epoch) pairs with the same sum must not give the same order.
  dtrain::DistributedSampler s1e0(1000, 4, 2, true, 1);
  dtrain::DistributedSampler s0e1(1000, 4, 2, true, 0);
  s0e1.set_epoch(1);
  CHECK(s1e0.indices() != s0e1.indices());

  // Shuffling changes the order.
  CHECK(dtrain::DistributedSampler(1000, 4, 2, true, 17).indices() !=
        dtrain::DistributedSampler(1000, 4, 2, false, 17).indices());
}

TEST_CASE("set_epoch and epoch") {
  dtrain::DistributedSampler s(10, 2, 1);
  CHECK(s.epoch() == 0);
  s.set_epoch(4);
  CHECK(s.epoch() == 4);
  CHECK(s.dataset_size() == 10);
  CHECK(s.num_replicas() == 2);
  CHECK(s.rank() == 1);
}

TEST_CASE("invalid arguments name the argument and the value") {
  auto m = message_of([] { dtrain::DistributedSampler(-1, 2, 0); });
  CHECK(m.find("dataset_size") != std::string::npos);
  CHECK(m.find("-1") != std::string::npos);
  m = message_of([] { dtrain::DistributedSampler(10, 0, 0); });
  CHECK(m.find("num_replicas") != std::string::npos);
  CHECK(m.find("got 0") != std::string::npos);
  m = message_of([] { dtrain::DistributedSampler(10, -2, 0); });
  CHECK(m.find("num_replicas") != std::string::npos);
  m = message_of([] { dtrain::DistributedSampler(10, 3, 3); });
  CHECK(m.find("rank") != std::string::npos);
  CHECK(m.find("got 3") != std::string::npos);
  m = message_of([] { dtrain::DistributedSampler(10, 3, -1); });
  CHECK(m.find("rank") != std::string::npos);
  m = message_of([] { dtrain::DistributedSampler(10, 3, 0).num_batches(0, false); });
  CHECK(m.find("batch_size") != std::string::npos);
  m = message_of([] { dtrain::DistributedSampler(10, 3, 0).set_epoch(-2); });
  CHECK(m.find("epoch") != std::string::npos);
  CHECK(m.find("-2") != std::string::npos);
  m = message_of([] {
    dtrain::DistributedSampler(std::numeric_limits<std::int64_t>::max(), 2, 0);
  });
  CHECK(m.find("overflows") != std::string::npos);
  // The same size without padding is fine.
  CHECK(dtrain::DistributedSampler(std::numeric_limits<std::int64_t>::max(), 2, 0, true, 0, true)
            .size() == std::numeric_limits<std::int64_t>::max() / 2);
  // Errors are catchable as the library's base class too.
  CHECK_THROWS_AS(dtrain::DistributedSampler(10, 3, 5), dtrain::Error);
}

TEST_CASE("the options form hands out exactly what the positional form does") {
  for (const std::int64_t n : {0, 1, 7, 10, 33}) {
    for (const std::int64_t parts : {1, 2, 3, 5}) {
      for (const bool shuffle : {false, true}) {
        for (const bool drop_last : {false, true}) {
          for (const std::uint64_t seed : {0u, 7u}) {
            for (std::int64_t part = 0; part < parts; ++part) {
              CAPTURE(n);
              CAPTURE(parts);
              CAPTURE(part);
              CAPTURE(shuffle);
              CAPTURE(drop_last);
              CAPTURE(seed);
              dtrain::DistributedSampler positional(n, parts, part, shuffle, seed, drop_last);
              dtrain::DistributedSampler options(
                  n, {.parts = parts, .part = part},
                  {.shuffle = shuffle, .seed = seed, .drop_last = drop_last});
              for (const std::int64_t epoch : {0, 3}) {
                positional.set_epoch(epoch);
                options.set_epoch(epoch);
                CHECK(options.indices() == positional.indices());
                CHECK(options.size() == positional.size());
                CHECK(options.state(0) == positional.state(0));
              }
            }
          }
        }
      }
    }
  }
  // The defaults are the positional defaults: shuffled, seed 0, padded.
  CHECK(dtrain::DistributedSampler(10, {.parts = 3, .part = 2}).indices() ==
        dtrain::DistributedSampler(10, 3, 2).indices());
  CHECK(dtrain::DistributedSampler(10, {.parts = 3, .part = 2}, {.seed = 9}).indices() ==
        dtrain::DistributedSampler(10, 3, 2, true, 9).indices());
  CHECK(dtrain::DistributedSampler(10, {.parts = 3, .part = 2}, {.shuffle = false}).indices() ==
        Indices{2, 5, 8, 1});
}

TEST_CASE("both forms report the partition under both names") {
  const dtrain::DistributedSampler s(10, {.parts = 4, .part = 3}, {.seed = 5, .drop_last = true});
  CHECK(s.parts() == 4);
  CHECK(s.part() == 3);
  CHECK(s.num_replicas() == 4);
  CHECK(s.rank() == 3);
  CHECK(s.shuffle());
  CHECK(s.seed() == 5);
  CHECK(s.drop_last());
  const dtrain::DistributedSampler p(10, 4, 3);
  CHECK(p.parts() == 4);
  CHECK(p.part() == 3);
}

TEST_CASE("options-form errors name the field") {
  // A Partition without .parts is refused rather than read as one part.
  auto m = message_of([] { dtrain::DistributedSampler(10, {.part = 1}); });
  CHECK(m.find("partition.parts must be >= 1") != std::string::npos);
  CHECK(m.find("got 0") != std::string::npos);
  m = message_of([] { dtrain::DistributedSampler(10, {.parts = -3, .part = 0}); });
  CHECK(m.find("partition.parts") != std::string::npos);
  CHECK(m.find("got -3") != std::string::npos);
  m = message_of([] { dtrain::DistributedSampler(10, {.parts = 3, .part = 3}); });
  CHECK(m.find("partition.part must be in [0, partition.parts) = [0, 3), got 3") !=
        std::string::npos);
  m = message_of([] { dtrain::DistributedSampler(10, {.parts = 3, .part = -1}); });
  CHECK(m.find("partition.part ") != std::string::npos);
  m = message_of([] { dtrain::DistributedSampler(-4, {.parts = 3, .part = 0}); });
  CHECK(m.find("dataset_size must be >= 0, got -4") != std::string::npos);
  m = message_of([] {
    dtrain::DistributedSampler(std::numeric_limits<std::int64_t>::max(), {.parts = 2, .part = 0});
  });
  CHECK(m.find("partition.parts 2 overflows") != std::string::npos);
  // The positional form keeps its own parameter names.
  m = message_of([] { dtrain::DistributedSampler(10, 3, 3); });
  CHECK(m.find("rank must be in [0, num_replicas)") != std::string::npos);
  CHECK(m.rfind("dtrain: DistributedSampler:", 0) == 0);
}
