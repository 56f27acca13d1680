#include "matcher.hpp"

#include <algorithm>
#include <random>
#include <vector>

namespace mask_rcnn {

torch::Tensor Matcher::operator()(const torch::Tensor& quality) const {
  const auto n = quality.size(1);
  if (quality.size(0) == 0) {
    return torch::full({n}, below_low, quality.options().dtype(torch::kLong));
  }
  const auto [best, index] = quality.max(0);
  auto matches = index.clone();
  matches.masked_fill_(best < low, below_low);
  matches.masked_fill_((best >= low).logical_and(best < high), between);
  if (allow_low_quality_matches) {
    // For each ground truth, the candidates that reach its highest overlap get it back.
    const auto best_per_gt = std::get<0>(quality.max(1, /*keepdim=*/true));
    const auto claims = (quality == best_per_gt).logical_and(best_per_gt > 0).any(0);
    matches = torch::where(claims, index, matches);
  }
  return matches;
}

namespace {

// Up to `count` of `pool`, chosen uniformly at random, returned sorted.
std::vector<std::int64_t> choose(std::vector<std::int64_t> pool, std::int64_t count,
                                 std::mt19937_64& rng) {
  const auto k = std::min<std::size_t>(pool.size(), static_cast<std::size_t>(std::max<std::int64_t>(count, 0)));
  for (std::size_t i = 0; i < k; ++i) {
    std::uniform_int_distribution<std::size_t> pick(i, pool.size() - 1);
    std::swap(pool[i], pool[pick(rng)]);
  }
  pool.resize(k);
  std::sort(pool.begin(), pool.end());
  return pool;
}

}  // namespace

std::pair<torch::Tensor, torch::Tensor> BalancedSampler::operator()(const torch::Tensor& labels,
                                                                    std::uint64_t seed) const {
  const auto cpu = labels.to(torch::kCPU, torch::kLong).contiguous();
  const auto* l = cpu.data_ptr<std::int64_t>();
  std::vector<std::int64_t> positives, negatives;
  for (std::int64_t i = 0; i < cpu.numel(); ++i) {
    if (l[i] > 0) positives.push_back(i);
    else if (l[i] == 0) negatives.push_back(i);
  }
  std::mt19937_64 rng(seed);
  const auto max_positives = static_cast<std::int64_t>(static_cast<double>(per_image) * positive_fraction);
  auto pos = choose(std::move(positives), max_positives, rng);
  auto neg = choose(std::move(negatives), per_image - static_cast<std::int64_t>(pos.size()), rng);
  const auto options = torch::TensorOptions().dtype(torch::kLong);
  return {torch::tensor(pos, options).to(labels.device()),
          torch::tensor(neg, options).to(labels.device())};
}

}  // namespace mask_rcnn
