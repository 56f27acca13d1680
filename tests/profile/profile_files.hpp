#pragma once
// Reading profiles in the profiler's tests: a folder every rank agrees on, and a rank's records.
#include <doctest/doctest.h>
#include <mpi.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>
#include <vector>

#include "support/world.hpp"

namespace profile_test {

using nlohmann::json;

// A fresh folder every rank agrees on.
inline std::filesystem::path fresh_dir(const std::string& tag) {
  long pid = static_cast<long>(::getpid());
  MPI_Bcast(&pid, 1, MPI_LONG, 0, MPI_COMM_WORLD);
  const auto dir = std::filesystem::temp_directory_path() /
                   ("dtrain_profiler_" + tag + "_" + std::to_string(pid));
  if (dtrain_test_support::world_rank() == 0) std::filesystem::remove_all(dir);
  MPI_Barrier(MPI_COMM_WORLD);
  return dir;
}

inline void remove_dir(const std::filesystem::path& dir) {
  MPI_Barrier(MPI_COMM_WORLD);
  if (dtrain_test_support::world_rank() == 0) std::filesystem::remove_all(dir);
}

// A rank's file of the one run profiled into `dir`, in the run's own folder (Note [Profile
// layout]): <dir>/<run-id>/ or <dir>/<job-id>/attempt-<n>/.
inline std::filesystem::path rank_file(const std::filesystem::path& dir, int rank) {
  const std::string name = "rank-" + std::to_string(rank) + ".jsonl";
  std::vector<std::filesystem::path> found;
  std::error_code ec;
  for (std::filesystem::recursive_directory_iterator it(dir, ec), end; !ec && it != end;
       it.increment(ec))
    if (it->path().filename() == name) found.push_back(it->path());
  REQUIRE_MESSAGE(found.size() == 1, "expected one " << name << " under " << dir << ", found "
                                                     << found.size());
  return found.front();
}

inline std::vector<json> read_records(const std::filesystem::path& file) {
  std::ifstream in(file);
  REQUIRE_MESSAGE(in, "missing " << file);
  std::vector<json> out;
  for (std::string line; std::getline(in, line);)
    if (line.find_first_not_of(' ') != std::string::npos) out.push_back(json::parse(line));
  return out;
}

inline std::vector<const json*> of_type(const std::vector<json>& records, const std::string& type) {
  std::vector<const json*> out;
  for (const json& r : records)
    if (r.at("type") == type) out.push_back(&r);
  return out;
}

inline void busy_for(std::chrono::microseconds d) {
  const auto end = std::chrono::steady_clock::now() + d;
  volatile double x = 0;
  while (std::chrono::steady_clock::now() < end) x = x + 1;
}

}  // namespace profile_test
