// Host-side planning of the device path: batched copy descriptors, fused layouts with padding,
// and the hierarchical allreduce's division of a buffer into pieces. No GPU, no MPI.
#include "dtrain/comm/hierarchical.hpp"
#include "dtrain/cuda/copy_plan.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <map>
#include <numeric>
#include <random>
#include <vector>

using namespace dtrain::detail;

namespace {

// Replays a batch the way the kernel walks it: every block finds its descriptor and copies its
// slice. Returns, per segment, how many times each element was written.
std::vector<std::vector<int>> replay(const std::vector<DeviceCopyBatch>& batches,
                                     const std::vector<CopySegment>& segments) {
  std::map<const void*, std::size_t> index_of_dst;
  for (std::size_t i = 0; i < segments.size(); ++i) index_of_dst[segments[i].dst] = i;
  std::vector<std::vector<int>> hits(segments.size());
  for (std::size_t i = 0; i < segments.size(); ++i) hits[i].assign(segments[i].count, 0);
  for (const auto& b : batches) {
    for (std::int64_t block = 0; block < b.blocks; ++block) {
      const DeviceCopyDesc& d = b.desc[find_copy_desc(b, block)];
      const std::int64_t lo = (block - d.first_block) * b.elems_per_block;
      REQUIRE(lo >= 0);
      REQUIRE(lo < d.count);
      const std::int64_t n = std::min<std::int64_t>(b.elems_per_block, d.count - lo);
      auto& h = hits[index_of_dst.at(d.dst)];
      for (std::int64_t k = lo; k < lo + n; ++k) ++h[k];
    }
  }
  return hits;
}

std::int64_t elements_not_covered_once(const std::vector<std::vector<int>>& hits) {
  std::int64_t bad = 0;
  for (const auto& h : hits)
    for (int x : h) bad += x != 1;
  return bad;
}

std::vector<CopySegment> make_segments(const std::vector<std::int64_t>& counts,
                                       std::vector<char>& storage) {
  storage.assign(counts.size() + 1, 0);
  std::vector<CopySegment> s;
  for (std::size_t i = 0; i < counts.size(); ++i)
    s.push_back({i % 3 == 0 ? nullptr : &storage[0], &storage[i + 1], counts[i]});
  return s;
}

}  // namespace

TEST_CASE("copy plan: every element of every segment is covered exactly once") {
  std::vector<char> storage;
  // Sizes like a network's gradients: tiny, odd, block-sized, a block plus one, large.
  const std::vector<std::int64_t> counts = {1, 7, 64, 4096, 4097, 8192, 12289, 3, 100000, 0, 5};
  const auto segments = make_segments(counts, storage);
  const auto batches = plan_copy_batches(segments, 4096, 0.5);
  REQUIRE(batches.size() == 1);
  CHECK(batches[0].size == 10);  // the empty segment is dropped
  CHECK(batches[0].scale == 0.5);
  CHECK(batches[0].elems_per_block == 4096);
  std::int64_t expected_blocks = 0;
  for (auto c : counts) expected_blocks += (c + 4095) / 4096;
  CHECK(batches[0].blocks == expected_blocks);
  CHECK(elements_not_covered_once(replay(batches, segments)) == 0);
}

TEST_CASE("copy plan: more tensors than one launch holds are split across launches in order") {
  std::vector<char> storage;
  std::mt19937 rng(7);
  std::vector<std::int64_t> counts;
  for (int i = 0; i < 3 * kCopyBatchCapacity + 5; ++i) counts.push_back(1 + rng() % 20000);
  const auto segments = make_segments(counts, storage);
  const auto batches = plan_copy_batches(segments, 8192);
  REQUIRE(batches.size() == 4);
  CHECK(batches[0].size == kCopyBatchCapacity);
  CHECK(batches[3].size == 5);
  // Order is preserved and first_block is each batch's running prefix.
  std::size_t k = 0;
  for (const auto& b : batches) {
    std::int64_t prefix = 0;
    for (int i = 0; i < b.size; ++i, ++k) {
      CHECK(b.desc[i].dst == segments[k].dst);
      CHECK(b.desc[i].src == segments[k].src);
      CHECK(b.desc[i].first_block == prefix);
      prefix += (b.desc[i].count + 8191) / 8192;
    }
    CHECK(b.blocks == prefix);
  }
  CHECK(elements_not_covered_once(replay(batches, segments)) == 0);
}

TEST_CASE("copy plan: descriptor search picks the last descriptor starting at or before a block") {
  DeviceCopyBatch b;
  b.size = 4;
  const std::int64_t firsts[] = {0, 3, 4, 10};
  for (int i = 0; i < 4; ++i) b.desc[i].first_block = firsts[i];
  b.blocks = 12;
  CHECK(find_copy_desc(b, 0) == 0);
  CHECK(find_copy_desc(b, 2) == 0);
  CHECK(find_copy_desc(b, 3) == 1);
  CHECK(find_copy_desc(b, 4) == 2);
  CHECK(find_copy_desc(b, 9) == 2);
  CHECK(find_copy_desc(b, 10) == 3);
  CHECK(find_copy_desc(b, 11) == 3);
}

TEST_CASE("copy plan: rejects a non-positive block size and negative counts") {
  std::vector<CopySegment> s = {{nullptr, nullptr, 4}};
  CHECK_THROWS_AS(plan_copy_batches(s, 0), dtrain::InvalidArgumentError);
  s[0].count = -1;
  CHECK_THROWS_WITH_AS(plan_copy_batches(s, 16), doctest::Contains("negative count -1"),
                       dtrain::InvalidArgumentError);
}

TEST_CASE("copy plan: bytes per block do not depend on the element size") {
  CHECK(copy_elems_per_block(1) * 1 == kCopyBytesPerBlock);
  CHECK(copy_elems_per_block(2) * 2 == kCopyBytesPerBlock);
  CHECK(copy_elems_per_block(4) * 4 == kCopyBytesPerBlock);
  CHECK(copy_elems_per_block(8) * 8 == kCopyBytesPerBlock);
  // Every block of a 16-byte aligned tensor starts 16-byte aligned: the kernel's vector path.
  CHECK(kCopyBytesPerBlock % 16 == 0);
}

TEST_CASE("fused layout: tensors back to back, padded to a multiple for an even reduce-scatter") {
  const std::vector<std::int64_t> counts = {5, 0, 3, 9};
  const auto plain = plan_fused_layout(counts);
  CHECK(plain.offsets == std::vector<std::int64_t>{0, 5, 5, 8});
  CHECK(plain.total == 17);
  const auto padded = plan_fused_layout(counts, 4);
  CHECK(padded.offsets == plain.offsets);
  CHECK(padded.total == 20);
  CHECK(plan_fused_layout(counts, 17).total == 17);

  std::vector<float> a(5), c(3), d(9), buffer(20);
  std::vector<void*> tensors = {a.data(), nullptr, c.data(), d.data()};
  const auto pack = fused_segments(plain, counts, tensors, buffer.data(), sizeof(float), CopyDirection::pack);
  REQUIRE(pack.size() == 4);  // a joined rank's tensor is packed as zeros (null source)
  CHECK(pack[1].src == nullptr);
  CHECK(pack[2].src == c.data());
  CHECK(pack[2].dst == buffer.data() + 5);
  CHECK(pack[3].dst == buffer.data() + 8);
  const auto unpack = fused_segments(plain, counts, tensors, buffer.data(), sizeof(float), CopyDirection::unpack);
  REQUIRE(unpack.size() == 3);  // nothing to copy back for the missing tensor
  CHECK(unpack[2].src == buffer.data() + 8);
  CHECK(unpack[2].dst == d.data());
  CHECK(unpack[2].count == 9);
}

TEST_CASE("hierarchical plan: pieces cover the buffer, differ by at most one, remainder first") {
  for (int local_size = 1; local_size <= 6; ++local_size) {
    for (int parts = 1; parts <= local_size; ++parts) {
      for (std::int64_t n : {0, 1, 2, 5, 6, 7, 13, 1000, 1001}) {
        const auto p = plan_hierarchical(n, local_size, parts);
        REQUIRE(p.counts.size() == static_cast<std::size_t>(local_size));
        CHECK(std::accumulate(p.counts.begin(), p.counts.end(), std::int64_t{0}) == n);
        std::int64_t offset = 0;
        for (int k = 0; k < local_size; ++k) {
          CHECK(p.displs[k] == offset);
          offset += p.counts[k];
          if (k >= parts) CHECK(p.counts[k] == 0);  // local ranks beyond the smallest host own nothing
          else CHECK(p.counts[k] == n / parts + (k < n % parts ? 1 : 0));
        }
        CHECK(p.largest() == (n + parts - 1) / parts);
      }
    }
  }
}

TEST_CASE("hierarchical plan: invalid arguments name the values") {
  CHECK_THROWS_WITH_AS(plan_hierarchical(10, 2, 3), doctest::Contains("in 3 parts"),
                       dtrain::InvalidArgumentError);
  CHECK_THROWS_AS(plan_hierarchical(-1, 2, 1), dtrain::InvalidArgumentError);
  CHECK_THROWS_AS(plan_hierarchical(10, 0, 1), dtrain::InvalidArgumentError);
}
