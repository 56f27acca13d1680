// Checkpoint in one process: what a checkpoint holds and gives back, the file layout, keep-last-K,
// skipping of truncated, corrupted and foreign files (with a warning naming each), item errors,
// and that save() copies the state before it returns while the file is written in the background.
#include <doctest/doctest.h>
#include <sys/stat.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_test_util.hpp"
#include "dtrain/dtrain.hpp"
#include "dtrain/train/checkpoint_format.hpp"
#include "unit/log_capture.hpp"

namespace user {

// Not trivially copyable: saved through its own hooks.
struct Model {
  std::vector<float> weights;
  std::map<std::string, double> stats;
  friend bool operator==(const Model&, const Model&) = default;
};
inline void dtrain_serialize(dtrain::ObjectWriter& w, const Model& m) {
  w.write(m.weights);
  w.write(m.stats);
}
inline void dtrain_deserialize(dtrain::ObjectReader& r, Model& m) {
  r.read(m.weights);
  r.read(m.stats);
}

}  // namespace user

namespace {

using namespace checkpoint_test;
namespace fs = std::filesystem;

dtrain::CheckpointOptions options_for(const SharedTempDir& dir, int keep_last = 3) {
  return {.directory = dir.path(), .keep_last = keep_last};
}

std::vector<std::int64_t> steps_in(const fs::path& dir) {
  std::vector<std::int64_t> steps;
  for (const auto& f : dtrain::detail::list_checkpoint_files(dir)) steps.push_back(f.step);
  return steps;
}

// Saves step s with an item "value" = s.
void save_steps(dtrain::Checkpoint& c, std::initializer_list<std::int64_t> steps) {
  for (auto s : steps) c.save({.step = s, .epoch = s / 10}, {{"value", s}});
  c.wait();
}

}  // namespace

TEST_CASE("checkpoint: restores what was saved, in place, with its progress") {
  dtrain::init();
  SharedTempDir dir;
  user::Model model{{1.5f, -2.0f, 3.25f}, {{"seen", 12.0}}};
  std::vector<double> velocity(1000);
  for (std::size_t i = 0; i < velocity.size(); ++i) velocity[i] = 0.001 * static_cast<double>(i);
  std::mt19937_64 rng(99);
  rng.discard(17);
  dtrain::DistributedSampler sampler(100, 1, 0, true, 5);
  sampler.set_epoch(4);
  {
    dtrain::Checkpoint c(options_for(dir));
    CHECK_FALSE(c.restore().has_value());  // an empty folder: start afresh
    c.save({.step = 123, .epoch = 4},
           {{"model", model}, {"velocity", velocity}, {"sampler", sampler.state(30)},
            {"note", std::string("hello")}},
           {{"rng", rng}});
  }  // the destructor waits for the write
  CHECK(steps_in(dir.path()) == std::vector<std::int64_t>{123});

  user::Model model2{{0, 0, 0}, {}};
  std::vector<double> velocity2;
  std::mt19937_64 rng2(1);
  dtrain::Checkpoint c(options_for(dir));
  const auto restored = c.restore();
  REQUIRE(restored.has_value());
  CHECK(restored->step() == 123);
  CHECK(restored->epoch() == 4);
  CHECK(restored->world_size() == 1);
  CHECK(restored->file() == dir / file_name(123));
  CHECK(restored->names() == std::vector<std::string>{"model", "velocity", "sampler", "note", "rng"});
  CHECK(restored->contains("rng"));
  CHECK_FALSE(restored->contains("other"));
  restored->load("model", model2);
  restored->load("velocity", velocity2);
  restored->load("rng", rng2);
  CHECK(model2 == model);
  CHECK(velocity2 == velocity);
  CHECK(rng2() == rng());  // the generator continues where it was
  CHECK(restored->get<std::string>("note") == "hello");
  const auto position = restored->get<dtrain::SamplerState>("sampler");
  CHECK(position.epoch == 4);
  CHECK(position.position == 30);
}

TEST_CASE("checkpoint: the file has the documented layout, and a hand-written one is read") {
  dtrain::init();
  SharedTempDir dir;
  std::vector<std::int32_t> values{7, 8, 9};
  {
    dtrain::Checkpoint c(options_for(dir));
    c.save({.step = 5, .epoch = 2}, {{"values", values}});
  }
  const auto written = read_file(dir / file_name(5));
  HandWritten h;
  h.step = 5;
  h.epoch = 2;
  h.shared = {{"values", dtrain::serialize_object(values)}};
  const auto by_hand = encode(h);
  // Identical apart from the writer's name in the payload (and so the lengths and checksum).
  const std::string writer = fmt::format("dtrain {}", dtrain::version());
  REQUIRE(written.size() == by_hand.size() + writer.size() - std::string("written by hand").size());
  CHECK(std::equal(written.begin(), written.begin() + 16, by_hand.begin()));  // magic, version, probe
  CHECK(std::string(written.end() - 8, written.end()) == "DTRAINOK");

  // A file written from the documented layout alone restores, per-rank items included.
  h.step = 9;
  h.per_rank = {{"mine", {dtrain::serialize_object(std::string("rank zero"))}}};
  write_file(dir / file_name(9), encode(h));
  dtrain::Checkpoint c(options_for(dir));
  const auto restored = c.restore();
  REQUIRE(restored.has_value());
  CHECK(restored->step() == 9);
  CHECK(restored->get<std::vector<std::int32_t>>("values") == values);
  CHECK(restored->get<std::string>("mine") == "rank zero");
}

TEST_CASE("checkpoint: keeps the newest keep_last checkpoints; 0 keeps every one") {
  dtrain::init();
  {
    SharedTempDir dir;
    dtrain::Checkpoint c(options_for(dir, 2));
    save_steps(c, {1, 2, 3, 4, 5});
    CHECK(steps_in(dir.path()) == std::vector<std::int64_t>{4, 5});
    save_steps(c, {6});
    CHECK(steps_in(dir.path()) == std::vector<std::int64_t>{5, 6});
  }
  {
    SharedTempDir dir;
    dtrain::Checkpoint c(options_for(dir, 0));
    save_steps(c, {1, 2, 3, 4, 5});
    CHECK(steps_in(dir.path()) == std::vector<std::int64_t>{1, 2, 3, 4, 5});
  }
  {
    SharedTempDir dir;
    dtrain::Checkpoint c(options_for(dir, 1));
    save_steps(c, {10, 20});
    CHECK(steps_in(dir.path()) == std::vector<std::int64_t>{20});
  }
  SharedTempDir dir;
  CHECK_THROWS_WITH_AS(dtrain::Checkpoint(options_for(dir, -1)),
                       doctest::Contains("keep_last = -1"), dtrain::InvalidArgumentError);
  CHECK_THROWS_WITH_AS(dtrain::Checkpoint(dtrain::CheckpointOptions{}),
                       doctest::Contains("directory is empty"), dtrain::InvalidArgumentError);
}

TEST_CASE("checkpoint: a directory, a FIFO or a dangling link named like a checkpoint is skipped, not read") {
  // A directory reports a huge size on ext4 (reading it threw std::bad_alloc); opening a FIFO blocks
  // until a writer comes (restore() hung on rank 0 while the others waited for it).
  dtrain::init();
  SharedTempDir dir;
  {
    dtrain::Checkpoint c(options_for(dir, 0));
    save_steps(c, {1, 2});
  }
  fs::create_directory(dir / file_name(7));
  REQUIRE(::mkfifo((dir / file_name(6)).c_str(), 0600) == 0);
  fs::create_symlink(dir / "nowhere", dir / file_name(5));
  fs::rename(dir / file_name(2), dir / "kept-elsewhere");
  fs::create_symlink(dir / "kept-elsewhere", dir / file_name(2));  // a link to a checkpoint counts
  {
    dtrain::test::LogCapture log(dtrain::LogLevel::warning);
    dtrain::Checkpoint c(options_for(dir, 0));
    const auto restored = c.restore();
    REQUIRE(restored.has_value());
    CHECK(restored->file() == dir / file_name(2));
    CHECK(restored->step() == 2);
    const auto path = [&](std::int64_t s) { return (dir / file_name(s)).string(); };
    CHECK(log.count({"skipping", path(7), "is a directory"}) == 1);
    CHECK(log.count({"skipping", path(6), "is a FIFO"}) == 1);
    CHECK(log.count({"skipping", path(5), "a symbolic link to nothing"}) == 1);
    CHECK(log.count({"skipping"}) == 3);
  }
  // Not the checkpoint's own files: left where they are, and never pruned.
  CHECK(fs::is_directory(dir / file_name(7)));
  CHECK(fs::is_fifo(dir / file_name(6)));
  {
    dtrain::Checkpoint c(options_for(dir, 1));
    save_steps(c, {8});
  }
  CHECK(steps_in(dir.path()) == std::vector<std::int64_t>{8});
  CHECK(fs::is_directory(dir / file_name(7)));
  CHECK(fs::is_fifo(dir / file_name(6)));
  std::vector<char> bytes;
  CHECK(dtrain::detail::read_file_bytes(dir / file_name(6), bytes) == "is not a regular file");
  CHECK(dtrain::detail::read_file_bytes(dir / file_name(7), bytes) == "is not a regular file");
}

TEST_CASE("checkpoint: truncated, corrupted and foreign files are skipped with a warning naming them") {
  dtrain::init();
  SharedTempDir dir;
  {
    dtrain::Checkpoint c(options_for(dir, 0));
    save_steps(c, {1, 2, 3, 4, 5});
  }
  const auto size = fs::file_size(dir / file_name(5));
  truncate_to(dir / file_name(5), size / 2);            // a write cut short
  flip_byte(dir / file_name(4), size / 2);             // a flipped byte in the payload
  write_file(dir / file_name(6), {'h', 'e', 'l', 'l', 'o'});  // not a checkpoint at all
  truncate_to(dir / file_name(3), 0);                   // an empty file
  write_file(dir / "notes.txt", {'x'});                 // not named like one: ignored

  std::int64_t value = -1;
  {
    dtrain::test::LogCapture log(dtrain::LogLevel::warning);
    dtrain::Checkpoint c(options_for(dir, 0));
    const auto restored = c.restore();
    REQUIRE(restored.has_value());
    CHECK(restored->step() == 2);
    restored->load("value", value);
    CHECK(value == 2);
    const auto path = [&](std::int64_t s) { return (dir / file_name(s)).string(); };
    CHECK(log.count({"skipping checkpoint", path(6), "not a dtrain checkpoint"}) == 1);
    CHECK(log.count({"skipping checkpoint", path(5), fmt::format("truncated: {} bytes", size / 2)}) == 1);
    CHECK(log.count({"skipping checkpoint", path(4), "checksum mismatch"}) == 1);
    CHECK(log.count({"skipping checkpoint", path(3), "truncated: 0 bytes"}) == 1);
    CHECK(log.count({"skipping checkpoint"}) == 4);
  }
  // Set aside, so they are never picked (or kept instead of newer checkpoints) again.
  CHECK(steps_in(dir.path()) == std::vector<std::int64_t>{1, 2});
  for (std::int64_t s : {3, 4, 5, 6}) CHECK(fs::exists(dir / (file_name(s) + ".invalid")));
  CHECK(fs::exists(dir / "notes.txt"));

  // A damaged trailer or header field is caught too, and a folder of only bad files restores
  // nothing.
  flip_byte(dir / file_name(2), fs::file_size(dir / file_name(2)) - 1);
  flip_byte(dir / file_name(1), 12);  // the byte-order probe
  dtrain::test::LogCapture log(dtrain::LogLevel::warning);
  dtrain::Checkpoint c(options_for(dir, 0));
  CHECK_FALSE(c.restore().has_value());
  CHECK(log.count({file_name(2), "the trailer is damaged"}) == 1);
  CHECK(log.count({file_name(1), "other byte order"}) == 1);
}

TEST_CASE("checkpoint: every truncation and every flipped byte of a file is rejected") {
  dtrain::init();
  SharedTempDir dir;
  {
    dtrain::Checkpoint c(options_for(dir));
    c.save({.step = 1, .epoch = 1}, {{"a", std::vector<std::int16_t>{1, 2, 3}}, {"b", std::string("xy")}},
           {{"c", 7}});
  }
  const auto good = read_file(dir / file_name(1));
  dtrain::detail::CheckpointRecord record;
  REQUIRE(dtrain::detail::parse_checkpoint(good, record).empty());
  for (std::size_t n = 0; n < good.size(); ++n) {
    CAPTURE(n);
    CHECK_FALSE(dtrain::detail::parse_checkpoint(std::span(good.data(), n), record).empty());
  }
  for (std::size_t at = 0; at < good.size(); ++at) {
    CAPTURE(at);
    auto bad = good;
    bad[at] = static_cast<char>(bad[at] ^ 0x01);
    CHECK_FALSE(dtrain::detail::parse_checkpoint(bad, record).empty());
  }
}

TEST_CASE("checkpoint: a file whose name and contents disagree on the step is skipped") {
  dtrain::init();
  SharedTempDir dir;
  {
    dtrain::Checkpoint c(options_for(dir));
    save_steps(c, {3});
  }
  fs::copy_file(dir / file_name(3), dir / file_name(8));
  dtrain::test::LogCapture log(dtrain::LogLevel::warning);
  dtrain::Checkpoint c(options_for(dir));
  const auto restored = c.restore();
  REQUIRE(restored.has_value());
  CHECK(restored->step() == 3);
  CHECK(log.count({file_name(8), "holds step 3 but is named for step 8"}) == 1);
}

TEST_CASE("checkpoint: loading a missing item or into the wrong type names the item and file") {
  dtrain::init();
  SharedTempDir dir;
  {
    dtrain::Checkpoint c(options_for(dir));
    c.save({.step = 1}, {{"model", std::vector<float>{1, 2, 3}}, {"name", std::string("abc")}});
  }
  dtrain::Checkpoint c(options_for(dir));
  const auto restored = c.restore();
  REQUIRE(restored.has_value());
  std::vector<float> v;
  CHECK_THROWS_WITH_AS(restored->load("optimizer", v),
                       doctest::Contains("has no item 'optimizer'; it holds: model, name"),
                       dtrain::CheckpointError);
  std::vector<double> wider;  // 3 floats are 12 bytes: not a whole number of doubles' worth
  CHECK_THROWS_WITH_AS(restored->load("model", wider),
                       doctest::Contains("item 'model' of checkpoint"), dtrain::CheckpointError);
  std::int64_t number = 0;
  CHECK_THROWS_WITH_AS(restored->load("name", number), doctest::Contains("bytes were left over"),
                       dtrain::CheckpointError);
}

TEST_CASE("checkpoint: save() checks its arguments") {
  dtrain::init();
  SharedTempDir dir;
  dtrain::Checkpoint c(options_for(dir));
  const int x = 1;
  CHECK_THROWS_WITH_AS(c.save({.step = 1}, {{"a", x}, {"a", x}}),
                       doctest::Contains("item name 'a' appears twice"), dtrain::InvalidArgumentError);
  CHECK_THROWS_WITH_AS(c.save({.step = 1}, {{"a", x}}, {{"a", x}}),
                       doctest::Contains("item name 'a' appears twice"), dtrain::InvalidArgumentError);
  CHECK_THROWS_WITH_AS(c.save({.step = 1}, {{"", x}}), doctest::Contains("empty name"),
                       dtrain::InvalidArgumentError);
  CHECK_THROWS_WITH_AS(c.save({.step = -1}, {{"a", x}}), doctest::Contains("step -1"),
                       dtrain::InvalidArgumentError);
  CHECK(steps_in(dir.path()).empty());
}

TEST_CASE("checkpoint: a job that did not resume refuses to save below another run's checkpoints") {
  dtrain::init();
  SharedTempDir dir;
  {
    dtrain::Checkpoint c(options_for(dir));
    save_steps(c, {50});
  }
  {
    dtrain::Checkpoint fresh(options_for(dir));
    const std::string expected = fmt::format("already holds {}", (dir / file_name(50)).string());
    CHECK_THROWS_WITH_AS(fresh.save({.step = 5}, {{"value", 5}}), doctest::Contains(expected.c_str()),
                         dtrain::CheckpointError);
  }
  dtrain::Checkpoint resumed(options_for(dir));
  REQUIRE(resumed.restore().has_value());
  save_steps(resumed, {55});
  CHECK(steps_in(dir.path()) == std::vector<std::int64_t>{50, 55});
}

TEST_CASE("checkpoint: temporary files of interrupted writes are removed, others left alone") {
  dtrain::init();
  SharedTempDir dir;
  write_file(dir / ".checkpoint-000000000007.dtrain.tmp-999999", {'p', 'a', 'r', 't'});
  write_file(dir / ".hidden-user-file", {'u'});
  dtrain::Checkpoint c(options_for(dir));
  CHECK_FALSE(fs::exists(dir / ".checkpoint-000000000007.dtrain.tmp-999999"));
  CHECK(fs::exists(dir / ".hidden-user-file"));
}

TEST_CASE("checkpoint: save() takes its copy before returning; training may change the state at once") {
  dtrain::init();
  SharedTempDir dir;
  std::vector<float> weights(std::size_t{8} << 20, 1.0f);  // 32 MiB: the write takes a while
  dtrain::Checkpoint c(options_for(dir, 0));
  for (std::int64_t step = 1; step <= 4; ++step) {
    c.save({.step = step}, {{"weights", weights}});
    // The next "training step" overwrites the state while the write may still be in flight.
    std::fill(weights.begin(), weights.end(), static_cast<float>(step + 1));
  }
  c.wait();
  CHECK_FALSE(c.writing());
  for (std::int64_t step = 1; step <= 4; ++step) {
    CAPTURE(step);
    const auto bytes = read_file(dir / file_name(step));
    dtrain::detail::CheckpointRecord record;
    REQUIRE(dtrain::detail::parse_checkpoint(bytes, record).empty());
    REQUIRE(record.shared.size() == 1);
    const auto [offset, size] = record.shared[0].second;
    const auto saved = dtrain::deserialize_object<std::vector<float>>(bytes.data() + offset, size);
    REQUIRE(saved.size() == weights.size());
    CHECK(std::all_of(saved.begin(), saved.end(),
                      [&](float v) { return v == static_cast<float>(step); }));
  }
}
