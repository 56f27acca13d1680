// Matching candidates to objects, and the balanced choice of training examples.

#include "torch_test.hpp"  // first: see its note

#include <set>

#include "matcher.hpp"

using namespace mask_rcnn;
using mask_rcnn::test::to_vector;

TEST_CASE("Matcher: foreground, background and in-between by the best overlap") {
  const Matcher matcher{0.7, 0.3, false};
  // Columns are candidates: best overlaps 0.8 (object 0), 0.75 (object 1), 0.35, 0.65, 0.2.
  const auto quality = torch::tensor({0.8f, 0.4f, 0.1f, 0.65f, 0.2f,  //
                                      0.2f, 0.75f, 0.35f, 0.6f, 0.1f})
                           .view({2, 5});
  CHECK(to_vector(matcher(quality)) ==
        std::vector<std::int64_t>{0, 1, Matcher::between, Matcher::between, Matcher::below_low});
  // At exactly the thresholds: 0.7 is foreground, 0.3 is in between.
  CHECK(to_vector(matcher(torch::tensor({0.7f, 0.3f}).view({1, 2}))) ==
        std::vector<std::int64_t>{0, Matcher::between});
}

TEST_CASE("Matcher: low-quality matches give every object its best candidates") {
  const Matcher strict{0.7, 0.3, false}, lenient{0.7, 0.3, true};
  // Object 0 overlaps candidate 0 by 0.5 at best, object 1 candidates 1 and 2 by 0.25 (a tie).
  const auto quality = torch::tensor({0.5f, 0.1f, 0.1f, 0.4f,  //
                                      0.1f, 0.25f, 0.25f, 0.0f})
                           .view({2, 4});
  CHECK(to_vector(strict(quality)) ==
        std::vector<std::int64_t>{Matcher::between, Matcher::below_low, Matcher::below_low, Matcher::between});
  CHECK(to_vector(lenient(quality)) == std::vector<std::int64_t>{0, 1, 1, Matcher::between});
  // An object that overlaps nothing claims nothing.
  CHECK(to_vector(lenient(torch::zeros({1, 3}))) ==
        std::vector<std::int64_t>{Matcher::below_low, Matcher::below_low, Matcher::below_low});
  // No objects: everything is background.
  CHECK(to_vector(lenient(torch::zeros({0, 3}))) ==
        std::vector<std::int64_t>{Matcher::below_low, Matcher::below_low, Matcher::below_low});
}

TEST_CASE("BalancedSampler: at most the positive share, negatives fill up, ignored never chosen") {
  const BalancedSampler sampler{16, 0.25};
  std::vector<std::int64_t> l(200, 0);
  for (int i = 0; i < 10; ++i) l[static_cast<std::size_t>(i * 7)] = 1;
  for (int i = 150; i < 200; ++i) l[static_cast<std::size_t>(i)] = -1;
  const auto labels = torch::tensor(l);
  const auto [pos, neg] = sampler(labels, 7);
  CHECK(pos.size(0) == 4);
  CHECK(neg.size(0) == 12);
  for (const auto i : to_vector(pos)) CHECK(l[static_cast<std::size_t>(i)] == 1);
  for (const auto i : to_vector(neg)) CHECK(l[static_cast<std::size_t>(i)] == 0);
  std::set<std::int64_t> distinct;
  for (const auto i : to_vector(neg)) distinct.insert(i);
  CHECK(distinct.size() == 12);

  // The seed decides: the same seed, the same choice; another seed, another.
  const auto again = sampler(labels, 7);
  CHECK(to_vector(again.first) == to_vector(pos));
  CHECK(to_vector(again.second) == to_vector(neg));
  CHECK(to_vector(sampler(labels, 8).second) != to_vector(neg));

  // Few positives: all of them, and more negatives.
  const auto [p2, n2] = sampler(torch::tensor(std::vector<std::int64_t>{1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0,
                                                                         0, 0, 0, 0, 0, 0, 0, 0}),
                                1);
  CHECK(to_vector(p2) == std::vector<std::int64_t>{0, 3});
  CHECK(n2.size(0) == 14);
}
