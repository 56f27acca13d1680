#include "dtrain/data/split_sorted_bucket_sampler.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "dtrain/data/permutation.hpp"
#include "support/error_message.hpp"

namespace {

using dtrain::test::message_of;

using Indices = std::vector<std::int64_t>;
using Batches = std::vector<Indices>;

struct Plan {
  std::vector<Batches> parts;  // parts[p][step] = sample indices
};

Plan plan_all(const std::vector<double>& sizes, std::int64_t batch_size, std::int64_t parts,
              bool shuffle, std::uint64_t seed, bool drop_last, std::int64_t epoch) {
  Plan plan;
  for (std::int64_t p = 0; p < parts; ++p) {
    dtrain::SplitSortedBucketSampler s(sizes, batch_size, {.parts = parts, .part = p},
                                       {.shuffle = shuffle, .seed = seed, .drop_last = drop_last});
    s.set_epoch(epoch);
    CHECK(static_cast<std::int64_t>(s.batches().size()) == s.num_batches());
    plan.parts.push_back(s.batches());
  }
  return plan;
}

double cost(const std::vector<double>& sizes, const Indices& batch) {
  double c = 0;
  for (const auto i : batch) c += sizes[static_cast<std::size_t>(i)];
  return c;
}

// Deterministic pseudo-random sizes in [lo, hi).
std::vector<double> random_sizes(std::int64_t n, double lo, double hi, std::uint64_t seed) {
  auto engine = dtrain::detail::make_engine(seed, 0);
  std::vector<double> sizes;
  for (std::int64_t i = 0; i < n; ++i) {
    sizes.push_back(lo + (hi - lo) *
                             static_cast<double>(dtrain::detail::uniform_below(engine, 1000000)) /
                             1e6);
  }
  return sizes;
}

void check_contract(const std::vector<double>& sizes, std::int64_t batch_size,
                    std::int64_t parts, bool shuffle, bool drop_last, std::int64_t epoch) {
  const auto n = static_cast<std::int64_t>(sizes.size());
  CAPTURE(n);
  CAPTURE(batch_size);
  CAPTURE(parts);
  CAPTURE(shuffle);
  CAPTURE(drop_last);
  CAPTURE(epoch);
  const Plan plan = plan_all(sizes, batch_size, parts, shuffle, 3, drop_last, epoch);
  const std::int64_t sample_batches =
      drop_last ? n / batch_size : (n + batch_size - 1) / batch_size;
  const std::int64_t steps =
      drop_last ? sample_batches / parts : (sample_batches + parts - 1) / parts;

  // Equal step counts on every part.
  for (const auto& part : plan.parts) CHECK(static_cast<std::int64_t>(part.size()) == steps);

  // Distinct batches (a padded batch may appear twice) partition the samples they hold.
  std::set<Indices> distinct;
  for (const auto& part : plan.parts) {
    for (const auto& batch : part) {
      CHECK(!batch.empty());
      CHECK(static_cast<std::int64_t>(batch.size()) <= batch_size);
      if (drop_last) CHECK(static_cast<std::int64_t>(batch.size()) == batch_size);
      distinct.insert(batch);
    }
  }
  std::map<std::int64_t, int> seen;
  std::int64_t partial = 0;
  for (const auto& batch : distinct) {
    if (static_cast<std::int64_t>(batch.size()) < batch_size) ++partial;
    for (const auto i : batch) {
      CHECK(i >= 0);
      CHECK(i < n);
      ++seen[i];
    }
  }
  CHECK(partial <= 1);
  for (const auto& [i, c] : seen) CHECK(c == 1);
  if (!drop_last) {
    // Coverage: every sample is in some batch.
    CHECK(static_cast<std::int64_t>(seen.size()) == n);
    CHECK(static_cast<std::int64_t>(distinct.size()) == sample_batches);
  } else {
    CHECK(static_cast<std::int64_t>(distinct.size()) == steps * parts);
  }

  // Batches group similar sizes: no other sample in play this epoch lies strictly inside a
  // batch's size range (with drop_last the samples sitting out may).
  for (const auto& batch : distinct) {
    double lo = std::numeric_limits<double>::infinity();
    double hi = -lo;
    for (const auto i : batch) {
      lo = std::min(lo, sizes[static_cast<std::size_t>(i)]);
      hi = std::max(hi, sizes[static_cast<std::size_t>(i)]);
    }
    for (const auto& [i, c] : seen) {
      const double s = sizes[static_cast<std::size_t>(i)];
      if (s > lo && s < hi) CHECK(std::find(batch.begin(), batch.end(), i) != batch.end());
    }
  }
}

}  // namespace

TEST_CASE("parts have equal step counts and batches cover the samples, for uneven sizes") {
  const auto sizes37 = random_sizes(37, 1, 10, 1);
  const auto sizes10 = random_sizes(10, 0, 3, 2);
  const std::vector<double> equal(13, 2.5);
  for (const bool shuffle : {true, false}) {
    for (const bool drop_last : {false, true}) {
      for (const std::int64_t epoch : {0, 1}) {
        check_contract(sizes37, 4, 3, shuffle, drop_last, epoch);   // 10 batches over 3 parts
        check_contract(sizes37, 5, 4, shuffle, drop_last, epoch);   // partial batch, 8 batches
        check_contract(sizes10, 3, 3, shuffle, drop_last, epoch);   // 4 batches over 3 parts
        check_contract(sizes10, 2, 7, shuffle, drop_last, epoch);   // fewer batches than parts
        check_contract(sizes10, 20, 2, shuffle, drop_last, epoch);  // one partial batch
        check_contract(equal, 3, 2, shuffle, drop_last, epoch);     // all ties
        check_contract({}, 3, 2, shuffle, drop_last, epoch);        // empty dataset
      }
    }
  }
}

TEST_CASE("step counts in uneven cases") {
  const auto sizes = random_sizes(10, 1, 2, 5);
  // 10 samples, batch 3: 4 batches (last of 1) or 3 full ones with drop_last.
  CHECK(dtrain::SplitSortedBucketSampler(sizes, 3, {.parts = 3, .part = 0}).num_batches() == 2);
  CHECK(dtrain::SplitSortedBucketSampler(sizes, 3, {.parts = 3, .part = 0}, {.drop_last = true})
            .num_batches() == 1);
  CHECK(dtrain::SplitSortedBucketSampler(sizes, 3, {.parts = 4, .part = 3}).num_batches() == 1);
  CHECK(dtrain::SplitSortedBucketSampler(sizes, 3, {.parts = 4, .part = 3}, {.drop_last = true})
            .num_batches() == 0);
  const dtrain::SplitSortedBucketSampler none(sizes, 3, {.parts = 4, .part = 3},
                                              {.drop_last = true});
  CHECK(none.batches().empty());
  CHECK(dtrain::SplitSortedBucketSampler({}, 3, {.parts = 2, .part = 1}).num_batches() == 0);
  // Fewer batches than parts: wrapping gives every part one.
  dtrain::SplitSortedBucketSampler small({1, 2, 3}, 2, {.parts = 4, .part = 3});
  CHECK(small.num_batches() == 1);
  CHECK(small.batches().size() == 1);
  CHECK(small.parts() == 4);
  CHECK(small.part() == 3);
}

TEST_CASE("without shuffle the plan is plain serpentine over cost-sorted rounds") {
  // Sizes 0..7 in scrambled positions; batches of 2 by size: {0,1} {2,3} {4,5} {6,7} by value.
  const std::vector<double> sizes = {6, 0, 3, 7, 1, 5, 2, 4};
  // Sample index of value v.
  auto at = [&](double v) {
    return static_cast<std::int64_t>(std::find(sizes.begin(), sizes.end(), v) - sizes.begin());
  };
  dtrain::SplitSortedBucketSampler p0(sizes, 2, {.parts = 2, .part = 0}, {.shuffle = false});
  dtrain::SplitSortedBucketSampler p1(sizes, 2, {.parts = 2, .part = 1}, {.shuffle = false});
  // Round 0 = batches of cost 1 and 5, round 1 = 9 and 13. Part 0 takes the first of round 0
  // and the last of round 1; part 1 the others: both total 14.
  CHECK(p0.batches() == Batches{{at(0), at(1)}, {at(6), at(7)}});
  CHECK(p1.batches() == Batches{{at(2), at(3)}, {at(4), at(5)}});
  p0.set_epoch(3);
  CHECK(p0.batches() == Batches{{at(0), at(1)}, {at(6), at(7)}});
}

TEST_CASE("golden plan for a fixed seed") {
  // Pins the scheme: tie keys, batch order, round order, pair permutations.
  const std::vector<double> sizes = {5, 1, 4, 1, 3, 9, 2, 6, 7, 8, 2, 5};
  const Plan e0 = plan_all(sizes, 2, 2, true, 7, false, 0);
  CHECK(e0.parts[0] == Batches{{9, 5}, {4, 2}, {6, 10}});
  CHECK(e0.parts[1] == Batches{{7, 8}, {0, 11}, {3, 1}});
  const Plan e1 = plan_all(sizes, 2, 2, true, 7, false, 1);
  CHECK(e1.parts[0] == Batches{{4, 2}, {7, 8}, {10, 6}});
  CHECK(e1.parts[1] == Batches{{11, 0}, {9, 5}, {3, 1}});
}

TEST_CASE("deterministic per (seed, epoch); epochs change the order and each part's share") {
  const auto sizes = random_sizes(200, 1, 5, 9);
  const Plan a = plan_all(sizes, 4, 4, true, 21, false, 2);
  const Plan b = plan_all(sizes, 4, 4, true, 21, false, 2);
  CHECK(a.parts == b.parts);
  const Plan c = plan_all(sizes, 4, 4, true, 21, false, 3);
  CHECK(c.parts[0] != a.parts[0]);
  const Plan d = plan_all(sizes, 4, 4, true, 22, false, 2);
  CHECK(d.parts[0] != a.parts[0]);
  // Not only the order: the set of samples part 0 sees changes between epochs, also when
  // nothing is padded or dropped (192 samples = 48 batches = 4 parts x 12 steps). With 4 parts
  // a random share overlaps another epoch's share by about a quarter.
  const auto exact = random_sizes(192, 1, 5, 9);
  auto share = [&](std::int64_t epoch) {
    dtrain::SplitSortedBucketSampler s(exact, 4, {.parts = 4, .part = 0}, {.seed = 21});
    s.set_epoch(epoch);
    std::set<std::int64_t> samples;
    for (const auto& batch : s.batches()) samples.insert(batch.begin(), batch.end());
    return samples;
  };
  const auto s0 = share(0);
  const auto s1 = share(1);
  REQUIRE(s0.size() == 48);
  std::vector<std::int64_t> common;
  std::set_intersection(s0.begin(), s0.end(), s1.begin(), s1.end(), std::back_inserter(common));
  CHECK(common.size() < 24);
}

TEST_CASE("ties between equal sizes are mixed differently per epoch") {
  const std::vector<double> sizes(12, 1.0);
  dtrain::SplitSortedBucketSampler s(sizes, 3, {.parts = 1, .part = 0}, {.seed = 4});
  std::set<Indices> e0(s.batches().begin(), s.batches().end());
  s.set_epoch(1);
  std::set<Indices> e1(s.batches().begin(), s.batches().end());
  CHECK(e0 != e1);
}

TEST_CASE("drop_last skips different samples in different epochs") {
  const auto sizes = random_sizes(11, 1, 5, 12);  // batch 4: 3 samples sit out
  auto kept = [&](std::int64_t epoch) {
    dtrain::SplitSortedBucketSampler s(sizes, 4, {.parts = 1, .part = 0}, {.drop_last = true});
    s.set_epoch(epoch);
    std::set<std::int64_t> k;
    for (const auto& batch : s.batches()) k.insert(batch.begin(), batch.end());
    CHECK(k.size() == 8);
    return k;
  };
  CHECK(kept(0) != kept(1));
}

TEST_CASE("parts are balanced by cost (1000 samples, sizes in [1,10), batch 4, 8 parts)") {
  // 250 batches over 8 parts: 32 steps each, 6 padded batches. Stated bound: the most loaded
  // part costs at most 1% more than the least loaded; the spread never exceeds the range of
  // batch costs (Note [Split sorted buckets]); and at every step the parts hold batches from one
  // contiguous cost band, so the slowest rank at a step is at most 30% slower than the fastest.
  const auto sizes = random_sizes(1000, 1, 10, 2024);
  for (const bool shuffle : {true, false}) {
    for (std::int64_t epoch = 0; epoch < 4; ++epoch) {
      CAPTURE(shuffle);
      CAPTURE(epoch);
      const Plan plan = plan_all(sizes, 4, 8, shuffle, 11, false, epoch);
      std::vector<double> totals;
      double batch_min = std::numeric_limits<double>::infinity();
      double batch_max = 0;
      std::vector<std::pair<double, double>> step_range(32, {batch_min, 0.0});
      for (const auto& part : plan.parts) {
        REQUIRE(part.size() == 32);
        double total = 0;
        for (std::size_t t = 0; t < part.size(); ++t) {
          const double c = cost(sizes, part[t]);
          total += c;
          batch_min = std::min(batch_min, c);
          batch_max = std::max(batch_max, c);
          step_range[t].first = std::min(step_range[t].first, c);
          step_range[t].second = std::max(step_range[t].second, c);
        }
        totals.push_back(total);
      }
      const double hi = *std::max_element(totals.begin(), totals.end());
      const double lo = *std::min_element(totals.begin(), totals.end());
      CHECK(hi / lo <= 1.01);
      CHECK(hi - lo <= batch_max - batch_min);
      std::sort(step_range.begin(), step_range.end());
      for (std::size_t t = 0; t < step_range.size(); ++t) {
        CHECK(step_range[t].second / step_range[t].first <= 1.3);
        if (t + 1 < step_range.size()) CHECK(step_range[t].second <= step_range[t + 1].first);
      }
    }
  }
}

TEST_CASE("the balance bound holds for skewed costs") {
  // A few huge samples among small ones; the difference between parts stays within the range.
  std::vector<double> sizes = random_sizes(90, 1, 2, 31);
  sizes[3] = 500;
  sizes[40] = 300;
  sizes[77] = 250;
  for (std::int64_t epoch = 0; epoch < 5; ++epoch) {
    const Plan plan = plan_all(sizes, 3, 4, true, 5, false, epoch);
    std::vector<double> totals;
    double batch_min = std::numeric_limits<double>::infinity();
    double batch_max = 0;
    for (const auto& part : plan.parts) {
      double total = 0;
      for (const auto& batch : part) {
        const double c = cost(sizes, batch);
        total += c;
        batch_min = std::min(batch_min, c);
        batch_max = std::max(batch_max, c);
      }
      totals.push_back(total);
    }
    CHECK(*std::max_element(totals.begin(), totals.end()) -
              *std::min_element(totals.begin(), totals.end()) <=
          batch_max - batch_min);
  }
}

TEST_CASE("invalid arguments name the argument and the value") {
  const std::vector<double> sizes = {1, 2, 3};
  auto m = message_of([&] { dtrain::SplitSortedBucketSampler(sizes, 0, {.parts = 2, .part = 0}); });
  CHECK(m.find("batch_size") != std::string::npos);
  CHECK(m.find("got 0") != std::string::npos);
  m = message_of([&] { dtrain::SplitSortedBucketSampler(sizes, 2, {.parts = 0, .part = 0}); });
  CHECK(m.find("partition.parts") != std::string::npos);
  m = message_of([&] { dtrain::SplitSortedBucketSampler(sizes, 2, {.parts = 2, .part = 2}); });
  CHECK(m.find("partition.part ") != std::string::npos);
  CHECK(m.find("got 2") != std::string::npos);
  m = message_of([&] { dtrain::SplitSortedBucketSampler(sizes, 2, {.parts = 2, .part = -1}); });
  CHECK(m.find("partition.part ") != std::string::npos);
  m = message_of([] { dtrain::SplitSortedBucketSampler({1, -4, 2}, 2, {.parts = 2, .part = 0}); });
  CHECK(m.find("sizes[1]") != std::string::npos);
  CHECK(m.find("-4") != std::string::npos);
  m = message_of([] {
    dtrain::SplitSortedBucketSampler({1, std::numeric_limits<double>::quiet_NaN()}, 2,
                                     {.parts = 2, .part = 0});
  });
  CHECK(m.find("sizes[1]") != std::string::npos);
  m = message_of(
      [&] { dtrain::SplitSortedBucketSampler(sizes, 2, {.parts = 2, .part = 0}).set_epoch(-1); });
  CHECK(m.find("epoch") != std::string::npos);
  CHECK(m.find("-1") != std::string::npos);
}

TEST_CASE("the spec's positional form is the same sampler, and its errors use its names") {
  std::vector<double> sizes;
  for (int i = 0; i < 41; ++i) sizes.push_back((i * 7) % 11 + 0.5);
  for (const std::int64_t parts : {1, 3, 4}) {
    for (const bool shuffle : {false, true}) {
      for (const bool drop_last : {false, true}) {
        for (std::int64_t part = 0; part < parts; ++part) {
          CAPTURE(parts);
          CAPTURE(part);
          CAPTURE(shuffle);
          CAPTURE(drop_last);
          dtrain::SplitSortedBucketSampler positional(sizes, 4, parts, part, shuffle, 3, drop_last);
          dtrain::SplitSortedBucketSampler options(
              sizes, 4, {.parts = parts, .part = part},
              {.shuffle = shuffle, .seed = 3, .drop_last = drop_last});
          for (const std::int64_t epoch : {0, 2}) {
            positional.set_epoch(epoch);
            options.set_epoch(epoch);
            CHECK(positional.batches() == options.batches());
          }
          CHECK(positional.num_parts() == parts);
          CHECK(positional.part_index() == part);
          CHECK(options.num_parts() == options.parts());
          CHECK(options.part_index() == options.part());
        }
      }
    }
  }
  auto m = message_of([&] { dtrain::SplitSortedBucketSampler(sizes, 2, 0, 0); });
  CHECK(m.find("num_parts must be >= 1") != std::string::npos);
  m = message_of([&] { dtrain::SplitSortedBucketSampler(sizes, 2, 2, 5); });
  CHECK(m.find("part_index must be in [0, num_parts)") != std::string::npos);
}
