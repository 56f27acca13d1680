// DTRAIN_AUTOTUNE in a real job: the engine tunes while training-like steps run, every result stays
// exact while the configuration changes under it, the log and the saved result are written, a
// saved result is reused by the next run, a stale one is replaced, and knobs the user set stay.
#include <doctest/doctest.h>
#include <mpi.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "dtrain/dtrain.hpp"

namespace {

struct Row {
  std::string kind;
  std::vector<std::string> fields;
};

std::vector<Row> read_log(const std::string& path) {
  std::ifstream in(path);
  std::vector<Row> rows;
  std::string line;
  std::getline(in, line);  // header
  while (std::getline(in, line)) {
    Row r;
    std::stringstream ss(line);
    std::string field;
    while (std::getline(ss, field, ',')) r.fields.push_back(field);
    if (!r.fields.empty()) r.kind = r.fields[0];
    rows.push_back(r);
  }
  return rows;
}

int count(const std::vector<Row>& rows, const std::string& kind) {
  int n = 0;
  for (const auto& r : rows) n += r.kind == kind;
  return n;
}

int world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

std::string file_name(const std::string& what) {
  return "autotune_engine_" + what + "_np" + std::to_string(world_size()) + ".txt";
}

dtrain::Config tuning_config(const std::string& log_path, const std::string& cache_path = {}) {
  dtrain::Config c = dtrain::Config::from_env();
  c.autotune = true;
  c.autotune_log = log_path;
  c.autotune_cache = cache_path;
  c.autotune_warmup_samples = 1;
  c.autotune_steps_per_sample = 2;
  c.autotune_bayes_opt_max_samples = 3;
  return c;
}

// `steps` steps of the same tensors, each reduced with Sum and checked against the closed form.
// Returns the number of wrong elements seen on this rank.
long run_steps(int steps, const std::string& prefix) {
  const std::vector<std::size_t> sizes = {1000, 30000, 7, 120000, 4096, 65536};
  const int n = dtrain::size();
  long wrong = 0;
  for (int step = 0; step < steps; ++step) {
    std::vector<std::vector<float>> tensors;
    for (std::size_t t = 0; t < sizes.size(); ++t)
      tensors.emplace_back(sizes[t], static_cast<float>(dtrain::rank() + 1 + step + t));
    std::vector<dtrain::Handle> handles;
    for (std::size_t t = 0; t < sizes.size(); ++t)
      handles.push_back(dtrain::allreduce_async(
          tensors[t], {.op = dtrain::ReduceOp::Sum, .name = prefix + std::to_string(t)}));
    for (auto& h : handles) h.wait();
    for (std::size_t t = 0; t < sizes.size(); ++t) {
      // sum over ranks r of (r + 1 + step + t)
      const float expected = static_cast<float>(n * (n + 1) / 2 + n * (step + static_cast<int>(t)));
      for (float v : tensors[t]) wrong += v != expected;
    }
  }
  return wrong;
}

bool is_rank0() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank == 0;
}

}  // namespace

TEST_CASE("the engine tunes while steps run; every result stays exact") {
  dtrain::shutdown();
  const std::string log_path = file_name("log");
  const std::string cache_path = file_name("cache");
  std::filesystem::remove(log_path);
  std::filesystem::remove(cache_path);
  MPI_Barrier(MPI_COMM_WORLD);
  dtrain::init(tuning_config(log_path, cache_path));
  CHECK(run_steps(90, "grad.") == 0);
  dtrain::shutdown();
  if (is_rank0()) {
    const auto rows = read_log(log_path);
    CHECK(count(rows, "warmup") == 1);
    CHECK(count(rows, "sample") == 15);  // 3 configurations x 5 samples
    CHECK(count(rows, "median") == 3);
    CHECK(count(rows, "choice") == 1);
    // The configurations measured differ: the tuner really switched the engine's settings.
    std::set<std::string> configurations;
    for (const auto& r : rows)
      if (r.kind == "median" && r.fields.size() > 9)
        configurations.insert(r.fields[3] + "," + r.fields[4] + "," + r.fields[5] + "," +
                              r.fields[6] + "," + r.fields[7] + "," + r.fields[8]);
    CHECK(configurations.size() == 3);
    CHECK(std::filesystem::exists(cache_path));
  }
}

TEST_CASE("a saved result is reused by the next run of the same job") {
  dtrain::shutdown();
  const std::string log_path = file_name("reuse_log");
  const std::string cache_path = file_name("cache");  // written by the test above
  std::filesystem::remove(log_path);
  MPI_Barrier(MPI_COMM_WORLD);
  dtrain::init(tuning_config(log_path, cache_path));
  CHECK(run_steps(10, "grad.") == 0);
  dtrain::shutdown();
  if (is_rank0()) {
    const auto rows = read_log(log_path);
    CHECK(count(rows, "reused") == 1);
    CHECK(count(rows, "sample") == 0);
  }
}

TEST_CASE("a saved result for other tensors is stale: a warning and a fresh tune") {
  dtrain::shutdown();
  const std::string log_path = file_name("stale_log");
  const std::string cache_path = file_name("cache");
  std::filesystem::remove(log_path);
  MPI_Barrier(MPI_COMM_WORLD);
  std::vector<std::string> messages;
  if (is_rank0())
    dtrain::detail::set_log_sink([&](std::string_view line) { messages.emplace_back(line); });
  dtrain::init(tuning_config(log_path, cache_path));
  CHECK(run_steps(12, "other.") == 0);  // other names: another tensor set
  dtrain::shutdown();
  dtrain::detail::set_log_sink({});
  if (is_rank0()) {
    bool warned = false;
    for (const auto& m : messages)
      warned |= m.find("ignoring the saved result") != std::string::npos &&
                m.find(cache_path) != std::string::npos;
    CHECK(warned);
    const auto rows = read_log(log_path);
    CHECK(count(rows, "reused") == 0);
    CHECK(count(rows, "warmup") + count(rows, "sample") > 0);
  }
}

TEST_CASE("knobs the user set stay fixed while the others are tuned") {
  dtrain::shutdown();
  const std::string log_path = file_name("fixed_log");
  std::filesystem::remove(log_path);
  MPI_Barrier(MPI_COMM_WORLD);
  dtrain::Config c = tuning_config(log_path);
  c.fusion_threshold_bytes = 8 << 20;
  dtrain::init(c);
  CHECK(run_steps(90, "grad.") == 0);
  dtrain::shutdown();
  if (is_rank0()) {
    const auto rows = read_log(log_path);
    CHECK(count(rows, "choice") == 1);
    for (const auto& r : rows) {
      REQUIRE(r.fields.size() > 3);
      CHECK(r.fields[3] == std::to_string(8 << 20));
    }
  }
}

TEST_CASE("pieces in flight are tuned alone; reductions cut into many pieces stay exact") {
  dtrain::shutdown();
  const std::string log_path = file_name("pieces_log");
  std::filesystem::remove(log_path);
  MPI_Barrier(MPI_COMM_WORLD);
  dtrain::Config c = tuning_config(log_path);
  // Every other knob set away from its default, so fixed (Note [Knobs the user set]).
  c.fusion_threshold_bytes = 8 << 20;
  c.cycle_time_ms = 2.0;
  c.cache_capacity = 64;
  c.fusion_pipeline = false;
  c.mpi_chunk_bytes = 64 << 10;  // the largest tensor goes in 8 pieces, the fused batch in 13
  c.autotune_bayes_opt_max_samples = 4;
  dtrain::init(c);
  CHECK(run_steps(110, "grad.") == 0);
  dtrain::shutdown();
  if (is_rank0()) {
    const auto rows = read_log(log_path);
    CHECK(count(rows, "choice") == 1);
    std::set<std::string> pieces;
    for (const auto& r : rows) {
      REQUIRE(r.fields.size() > 9);
      CHECK(r.fields[3] == std::to_string(8 << 20));
      CHECK(r.fields[7] == "0");
      if (r.kind == "median") pieces.insert(r.fields[8]);
    }
    CHECK(pieces.size() > 1);  // the tuner moved the knob
    for (const auto& p : pieces) {
      CAPTURE(p);
      CHECK((p.size() == 1 && p[0] >= '1' && p[0] <= '8'));
    }
  }
}
