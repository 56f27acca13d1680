// Two Checkpoint objects used at once from two threads, neither of them the one that called
// dtrain::init(): each saves and restores its own folder many times, and every restore must be
// that object's own last save, bit for bit, on every rank. Their collectives are named after the
// object (Note [Checkpoint op names] in train/checkpoint_impl.hpp); with one fixed name for both,
// rank 0's restore of one object paired with rank 1's of the other (a wrong restore, or a stall).
// Two live objects of one folder are told apart too, and one that only rank 0 made and dropped
// shifts no name.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <exception>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "checkpoint/checkpoint_test_util.hpp"
#include "dtrain/dtrain.hpp"

namespace {

using checkpoint_test::SharedTempDir;
using checkpoint_test::world_rank;
using checkpoint_test::world_size;

constexpr int kRounds = 80;

std::uint64_t mix(std::uint64_t x) {  // splitmix64
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Values that differ by object, round and owner (0: shared, r + 1: rank r) in every bit and in
// length, so that an item restored from another object's or another round's save cannot pass.
std::vector<double> values(int object, int round, int owner) {
  const std::size_t n = 200 + 37 * static_cast<std::size_t>(round) + 500 * object + 11 * owner;
  std::vector<double> out(n);
  std::uint64_t seed = mix((std::uint64_t(object) << 40) ^ (std::uint64_t(round) << 16) ^
                           static_cast<std::uint64_t>(owner));
  for (auto& v : out) {
    const std::uint64_t bits = seed = mix(seed);
    std::memcpy(&v, &bits, sizeof v);  // any bit pattern, NaNs included: compared as bytes
  }
  return out;
}

bool same_bits(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
}

class Problems {
 public:
  void add(std::string what) {
    std::lock_guard lock(mutex_);
    list_.push_back(std::move(what));
  }
  std::vector<std::string> list() {
    std::lock_guard lock(mutex_);
    return list_;
  }

 private:
  std::mutex mutex_;
  std::vector<std::string> list_;
};

void save_and_restore(int object, const std::filesystem::path& dir, Problems& problems) {
  const int r = world_rank();
  try {
    dtrain::Checkpoint c({.directory = dir.string(), .keep_last = 2});
    for (int round = 1; round <= kRounds; ++round) {
      const std::vector<double> model = values(object, round, 0);
      const std::vector<double> mine = values(object, round, r + 1);
      c.save({.step = round, .epoch = object}, {{"model", model}}, {{"mine", mine}});
      c.wait();
      const auto restored = c.restore();
      const auto fail = [&](const std::string& what) {
        problems.add(fmt::format("rank {}, object {}, round {}: {}", r, object, round, what));
      };
      if (!restored) return fail("restore() found nothing");
      if (restored->step() != round || restored->epoch() != object)
        return fail(fmt::format("restored step {} of epoch {}", restored->step(),
                                restored->epoch()));
      if (!same_bits(restored->get<std::vector<double>>("model"), model))
        return fail("the shared item differs from the one saved");
      if (!same_bits(restored->get<std::vector<double>>("mine"), mine))
        return fail("this rank's item differs from the one it saved");
    }
  } catch (const std::exception& e) {
    problems.add(fmt::format("rank {}, object {}: {}", r, object, e.what()));
  }
}

}  // namespace

TEST_CASE("two Checkpoint objects on two threads: every restore is the object's own last save") {
  dtrain::init();
  REQUIRE(world_size() >= 2);
  SharedTempDir first, second;
  Problems problems;
  std::thread a(save_and_restore, 0, first.path(), std::ref(problems));
  std::thread b(save_and_restore, 1, second.path(), std::ref(problems));
  a.join();
  b.join();
  for (const std::string& p : problems.list()) FAIL_CHECK(p);
}

TEST_CASE("two live Checkpoint objects of one folder restore at once from two threads") {
  dtrain::init();
  const int r = world_rank();
  SharedTempDir dir;
  const std::vector<double> model = values(2, 1, 0);
  {
    dtrain::Checkpoint writer({.directory = dir.path().string()});
    writer.save({.step = 1, .epoch = 0}, {{"model", model}});
  }
  // Made and dropped on rank 0 alone (a look at the folder): it must shift no other object's
  // name, or the objects below would wait for each other across ranks.
  if (r == 0) dtrain::Checkpoint look({.directory = dir.path().string()});
  dtrain::Checkpoint first({.directory = dir.path().string()});
  dtrain::Checkpoint second({.directory = (dir.path() / ".").string()});  // the same folder
  Problems problems;
  const auto restore_often = [&](dtrain::Checkpoint& c, int object) {
    try {
      for (int round = 0; round < kRounds; ++round) {
        const auto restored = c.restore();
        if (!restored || restored->step() != 1 ||
            !same_bits(restored->get<std::vector<double>>("model"), model))
          return problems.add(fmt::format("rank {}, object {}, round {}: a wrong restore", r,
                                          object, round));
      }
    } catch (const std::exception& e) {
      problems.add(fmt::format("rank {}, object {}: {}", r, object, e.what()));
    }
  };
  std::thread a(restore_often, std::ref(first), 0);
  std::thread b(restore_often, std::ref(second), 1);
  a.join();
  b.join();
  for (const std::string& p : problems.list()) FAIL_CHECK(p);
}
