#include "dtrain/data/file_sharder.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "support/error_message.hpp"
#include "support/temp_dir.hpp"

namespace {

namespace fs = std::filesystem;
using Files = std::vector<std::string>;

Files numbered(int n) {
  Files files;
  for (int i = 0; i < n; ++i) files.push_back("part-" + std::to_string(i) + ".rec");
  return files;
}

using dtrain::test::message_of;

}  // namespace

TEST_CASE("every part gets the same number of files and together they cover the list") {
  for (const auto& c : std::vector<std::pair<int, int>>{{10, 4}, {3, 5}, {8, 4}, {1, 3}}) {
    const int n = c.first;
    const int shards = c.second;
    CAPTURE(n);
    CAPTURE(shards);
    const Files files = numbered(n);
    std::map<std::string, int> count;
    for (int s = 0; s < shards; ++s) {
      const Files mine =
          dtrain::shard_files(files, {.parts = shards, .part = s}, {.seed = 5, .epoch = 2});
      CHECK(static_cast<int>(mine.size()) == (n + shards - 1) / shards);
      for (const auto& f : mine) ++count[f];
    }
    CHECK(static_cast<int>(count.size()) == n);
    int repeats = 0;
    for (const auto& [f, c] : count) repeats += c - 1;
    CHECK(repeats == (n + shards - 1) / shards * shards - n);
  }
}

TEST_CASE("without shuffle files are strided and wrap around") {
  const Files files = numbered(10);
  CHECK(dtrain::shard_files(files, {.parts = 4, .part = 0}, {.shuffle = false}) ==
        Files{files[0], files[4], files[8]});
  CHECK(dtrain::shard_files(files, {.parts = 4, .part = 2}, {.shuffle = false}) ==
        Files{files[2], files[6], files[0]});
  CHECK(dtrain::shard_files(files, {.parts = 4, .part = 3},
                            {.shuffle = false, .epoch = 9}) == Files{files[3], files[7], files[1]});
}

TEST_CASE("shuffled sharding is deterministic and changes with the epoch") {
  const Files files = numbered(40);
  const Files epoch3 = dtrain::shard_files(files, {.parts = 4, .part = 1}, {.seed = 8, .epoch = 3});
  CHECK(epoch3 == dtrain::shard_files(files, {.parts = 4, .part = 1}, {.seed = 8, .epoch = 3}));
  CHECK(epoch3 != dtrain::shard_files(files, {.parts = 4, .part = 1}, {.seed = 8, .epoch = 4}));
  // It is the DistributedSampler's assignment over file positions (golden: N=10, R=3, seed 42).
  const Files ten = numbered(10);
  CHECK(dtrain::shard_files(ten, {.parts = 3, .part = 0}, {.seed = 42}) ==
        Files{ten[9], ten[0], ten[3], ten[7]});
}

TEST_CASE("invalid arguments are rejected with a clear message") {
  auto m = message_of([] { dtrain::shard_files(Files{}, {.parts = 2, .part = 0}); });
  CHECK(m.find("files is empty") != std::string::npos);
  m = message_of([] { dtrain::shard_files(numbered(3), {.parts = 0, .part = 0}); });
  CHECK(m.find("partition.parts") != std::string::npos);
  CHECK(m.find("got 0") != std::string::npos);
  m = message_of([] { dtrain::shard_files(numbered(3), {.parts = 2, .part = 2}); });
  CHECK(m.find("partition.part ") != std::string::npos);
  CHECK(m.find("got 2") != std::string::npos);
  m = message_of([] { dtrain::shard_files(numbered(3), {.parts = 2, .part = -1}); });
  CHECK(m.find("partition.part ") != std::string::npos);
  m = message_of([] { dtrain::shard_files(numbered(3), {.parts = 2, .part = 0}, {.epoch = -5}); });
  CHECK(m.find("options.epoch") != std::string::npos);
  CHECK(m.find("-5") != std::string::npos);
}

TEST_CASE("glob_match") {
  using dtrain::detail::glob_match;
  CHECK(glob_match("*", "anything"));
  CHECK(glob_match("*", ""));
  CHECK(glob_match("*.rec", "a.rec"));
  CHECK(glob_match("*.rec", ".rec"));
  CHECK_FALSE(glob_match("*.rec", "a.rec.tmp"));
  CHECK_FALSE(glob_match("*.rec", "a.re"));
  CHECK(glob_match("train-??.tar", "train-07.tar"));
  CHECK_FALSE(glob_match("train-??.tar", "train-7.tar"));
  CHECK(glob_match("*a*a*b", "xaayaab"));
  CHECK_FALSE(glob_match("*a*a*b", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaac"));
  CHECK(glob_match("exact.txt", "exact.txt"));
  CHECK_FALSE(glob_match("exact.txt", "exact.txt2"));
  CHECK_FALSE(glob_match("", "x"));
}

TEST_CASE("directory listing: regular files matching the pattern, sorted by name") {
  dtrain::test::TempDir dir("dtrain-file-sharder-");
  // Created out of order so the test fails if the listing relies on creation order.
  for (const char* name : {"c.rec", "a.rec", "notes.txt", "b.rec", "d.rec.partial"}) {
    dtrain::test::write_text(dir / name, name);
  }
  fs::create_directory(dir.path() / "e.rec");  // a directory, not a file
  const Files listed = dtrain::list_files(dir.path(), "*.rec");
  CHECK(listed == Files{(dir.path() / "a.rec").string(), (dir.path() / "b.rec").string(),
                        (dir.path() / "c.rec").string()});
  CHECK(dtrain::list_files(dir.path()).size() == 5);

  // Sharding a directory equals sharding its sorted listing.
  for (int s = 0; s < 2; ++s) {
    CHECK(dtrain::shard_files(dir.path(), "*.rec", {.parts = 2, .part = s},
                              {.seed = 1, .epoch = 4}) ==
          dtrain::shard_files(listed, {.parts = 2, .part = s}, {.seed = 1, .epoch = 4}));
  }
  CHECK(dtrain::shard_files(dir.path(), "*.rec", {.parts = 2, .part = 1}, {.shuffle = false}) ==
        Files{(dir.path() / "b.rec").string(), (dir.path() / "a.rec").string()});
}

TEST_CASE("directory errors name the directory and the pattern") {
  dtrain::test::TempDir dir("dtrain-file-sharder-");
  dtrain::test::write_text(dir / "only.txt", "only.txt");
  auto m = message_of([&] { dtrain::shard_files(dir.path(), "*.rec", {.parts = 2, .part = 0}); });
  CHECK(m.find("*.rec") != std::string::npos);
  CHECK(m.find(dir.path().string()) != std::string::npos);
  const fs::path missing = dir.path() / "missing";
  m = message_of([&] { dtrain::list_files(missing, "*"); });
  CHECK(m.find(missing.string()) != std::string::npos);
  m = message_of(
      [&] { dtrain::shard_files(dir.path() / "only.txt", "*", {.parts = 2, .part = 0}); });
  CHECK(m.find("not a readable directory") != std::string::npos);
}
