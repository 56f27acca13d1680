// Checkpoint across ranks: rank 0 writes and reads, every rank gets rank 0's shared items and its
// own per-rank items back; a checkpoint of another world size is resumed or refused
// (Note [World size on resume]); saving every step while training leaves exactly the states of
// the kept steps on disk.
#include <doctest/doctest.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_test_util.hpp"
#include "dtrain/dtrain.hpp"
#include "dtrain/train/checkpoint_format.hpp"
#include "unit/log_capture.hpp"

namespace {

using namespace checkpoint_test;
namespace fs = std::filesystem;

std::vector<double> rank_values(int r) { return std::vector<double>(static_cast<std::size_t>(r) + 2, r + 0.5); }

// Every rank sees the same verdict; MPI_LAND over ranks, independent of dtrain.
bool on_all_ranks(bool ok) {
  int mine = ok ? 1 : 0, all = 0;
  MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
  return all != 0;
}

}  // namespace

TEST_CASE("checkpoint ranks: shared items come from rank 0, per-rank items go back to their rank") {
  dtrain::init();
  const int r = world_rank(), n = world_size();
  SharedTempDir dir;
  {
    std::vector<double> model = rank_values(r);  // only rank 0's copy is saved
    const std::string mine = fmt::format("rank {} of {}", r, n);
    dtrain::Checkpoint c({.directory = dir.path()});
    c.save({.step = 7, .epoch = 1}, {{"model", model}}, {{"mine", mine}, {"sizes", rank_values(r)}});
  }
  dtrain::Checkpoint c({.directory = dir.path()});
  const auto restored = c.restore();
  REQUIRE(on_all_ranks(restored.has_value()));
  CHECK(restored->step() == 7);
  CHECK(restored->world_size() == n);
  CHECK(restored->file() == dir / file_name(7));  // rank 0's path, on every rank
  std::vector<double> model{-1};
  restored->load("model", model);
  CHECK(model == rank_values(0));
  CHECK(restored->get<std::string>("mine") == fmt::format("rank {} of {}", r, n));
  CHECK(restored->get<std::vector<double>>("sizes") == rank_values(r));
}

TEST_CASE("checkpoint ranks: per-rank item names must agree across ranks") {
  dtrain::init();
  if (world_size() < 2) return;
  SharedTempDir dir;
  dtrain::Checkpoint c({.directory = dir.path()});
  const int x = world_rank();
  const char* name = world_rank() == 1 ? "other" : "rng";
  CHECK_THROWS_WITH_AS(c.save({.step = 1}, {{"model", x}}, {{name, x}}),
                       doctest::Contains("rank 1 passed per-rank items (other), rank 0 passed (rng)"),
                       dtrain::InvalidArgumentError);
}

TEST_CASE("checkpoint ranks: an empty folder restores nothing on every rank") {
  dtrain::init();
  SharedTempDir dir;
  dtrain::Checkpoint c({.directory = dir / "not-yet-there"});
  CHECK(on_all_ranks(!c.restore().has_value()));
}

TEST_CASE("checkpoint ranks: another world size resumes shared state and re-shards the sampler") {
  dtrain::init();
  const int n = world_size();
  SharedTempDir dir;
  const int saved_world = n + 1;
  // What a job of n+1 ranks saved after every rank took 4 samples of epoch 2.
  dtrain::DistributedSampler saver(50, saved_world, 0, true, 3);
  saver.set_epoch(2);
  HandWritten h;
  h.step = 11;
  h.epoch = 2;
  h.world_size = saved_world;
  h.shared = {{"model", dtrain::serialize_object(std::vector<float>{4, 5})},
              {"sampler", dtrain::serialize_object(saver.state(4))}};
  if (world_rank() == 0) write_file(dir / file_name(11), encode(h));

  dtrain::test::LogCapture log(dtrain::LogLevel::warning);
  dtrain::Checkpoint c({.directory = dir.path()});
  const auto restored = c.restore();
  REQUIRE(on_all_ranks(restored.has_value()));
  CHECK(restored->world_size() == saved_world);
  CHECK(restored->get<std::vector<float>>("model") == std::vector<float>{4, 5});
  dtrain::DistributedSampler sampler(50, n, world_rank(), true, 3);
  sampler.load_state(restored->get<dtrain::SamplerState>("sampler"));
  sampler.set_epoch(2);
  CHECK(sampler.remaining() == (50 - 4 * saved_world + n - 1) / n);
  if (world_rank() == 0)
    CHECK(log.count({fmt::format("written by {} ranks, this job has {}", saved_world, n).c_str(),
                     "re-shard"}) == 1);
}

TEST_CASE("checkpoint ranks: another world size is refused with per-rank state, or when asked") {
  dtrain::init();
  const int n = world_size();
  SharedTempDir dir;
  HandWritten h;
  h.step = 3;
  h.world_size = n + 1;
  h.shared = {{"model", dtrain::serialize_object(1.0)}};
  if (world_rank() == 0) write_file(dir / file_name(3), encode(h));
  {
    dtrain::Checkpoint c({.directory = dir.path(), .on_world_size_change = dtrain::WorldSizeChange::refuse});
    const std::string expected = fmt::format("written by {} ranks, this job has {}, and "
                                             "CheckpointOptions::on_world_size_change is refuse", n + 1, n);
    CHECK_THROWS_WITH_AS(c.restore(), doctest::Contains(expected.c_str()), dtrain::CheckpointError);
  }
  h.step = 4;
  h.per_rank = {{"rng", std::vector<std::vector<char>>(static_cast<std::size_t>(n + 1),
                                                     dtrain::serialize_object(std::uint64_t{9}))}};
  if (world_rank() == 0) write_file(dir / file_name(4), encode(h));
  dtrain::Checkpoint c({.directory = dir.path()});
  const std::string expected = fmt::format(
      "written by {} ranks and holds per-rank state ('rng') for each of them, but this job has {} "
      "ranks. Restart with {} ranks", n + 1, n, n + 1);
  CHECK_THROWS_WITH_AS(c.restore(), doctest::Contains(expected.c_str()), dtrain::CheckpointError);
  // The same world size resumes it.
  h.world_size = n;
  h.step = 5;
  h.per_rank[0].second.resize(static_cast<std::size_t>(n));
  if (world_rank() == 0) write_file(dir / file_name(5), encode(h));
  const auto restored = c.restore();
  REQUIRE(on_all_ranks(restored.has_value()));
  CHECK(restored->get<std::uint64_t>("rng") == 9);
}

TEST_CASE("checkpoint ranks: saving every step while training keeps exactly the states of the kept steps") {
  dtrain::init();
  const int r = world_rank(), n = world_size();
  SharedTempDir dir;
  std::vector<float> weights(std::size_t{1} << 20, 0.0f);  // 4 MiB
  std::vector<float> grad(weights.size());
  dtrain::Checkpoint c({.directory = dir.path(), .keep_last = 3});
  const int steps = 20;
  for (int step = 1; step <= steps; ++step) {
    std::fill(grad.begin(), grad.end(), static_cast<float>(step + r));
    dtrain::allreduce(grad);  // average: step + (n-1)/2
    for (std::size_t i = 0; i < weights.size(); ++i) weights[i] += grad[i];
    c.save({.step = step}, {{"weights", weights}}, {{"rank", r}});
  }
  c.wait();
  // After step s every weight is sum_{k<=s} (k + (n-1)/2), exact in float at these sizes.
  auto expected = [&](int s) { return static_cast<float>(s * (s + 1) / 2.0 + s * (n - 1) / 2.0); };
  if (r == 0) {
    std::vector<std::int64_t> kept;
    for (const auto& f : dtrain::detail::list_checkpoint_files(dir.path())) {
      kept.push_back(f.step);
      const auto bytes = read_file(f.path);
      dtrain::detail::CheckpointRecord record;
      REQUIRE(dtrain::detail::parse_checkpoint(bytes, record).empty());
      const auto [offset, size] = record.shared.at(0).second;
      const auto saved = dtrain::deserialize_object<std::vector<float>>(bytes.data() + offset, size);
      CHECK(std::all_of(saved.begin(), saved.end(),
                        [&](float v) { return v == expected(static_cast<int>(f.step)); }));
    }
    CHECK(kept == std::vector<std::int64_t>{steps - 2, steps - 1, steps});
  }
  dtrain::Checkpoint again({.directory = dir.path()});
  const auto restored = again.restore();
  REQUIRE(on_all_ranks(restored.has_value()));
  CHECK(restored->step() == steps);
  CHECK(restored->get<int>("rank") == r);
  const auto w = restored->get<std::vector<float>>("weights");
  CHECK(w == weights);
}
