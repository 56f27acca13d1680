#pragma once
// Helpers for the checkpoint tests: a scratch folder shared by the ranks of a test, a checkpoint
// file written by hand from the layout in Note [Checkpoint file format] (so the format is checked
// independently of the writer), and ways to damage a file.
#include <mpi.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "dtrain/core/crc32c.hpp"
#include "support/world.hpp"

namespace checkpoint_test {

using dtrain_test_support::world_rank;
using dtrain_test_support::world_size;

// A fresh folder under the system temp folder, named by rank 0 and removed by it at the end.
class SharedTempDir {
 public:
  SharedTempDir() {
    char name[512] = {};
    if (world_rank() == 0) {
      std::random_device entropy;
      const auto base = std::filesystem::temp_directory_path();
      for (;;) {
        path_ = base / fmt::format("dtrain-checkpoint-test-{}-{}", ::getpid(), entropy());
        if (std::filesystem::create_directory(path_)) break;
      }
      std::strncpy(name, path_.c_str(), sizeof name - 1);
    }
    MPI_Bcast(name, sizeof name, MPI_CHAR, 0, MPI_COMM_WORLD);
    path_ = name;
  }
  SharedTempDir(const SharedTempDir&) = delete;
  SharedTempDir& operator=(const SharedTempDir&) = delete;
  ~SharedTempDir() {
    MPI_Barrier(MPI_COMM_WORLD);
    std::error_code ignored;
    if (world_rank() == 0) std::filesystem::remove_all(path_, ignored);
  }
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

inline std::string file_name(std::int64_t step) {
  return fmt::format("checkpoint-{:012}.dtrain", step);
}

// ---- a checkpoint file by hand -----------------------------------------------------------------

class Bytes {
 public:
  template <class T>
  Bytes& number(T v) {
    const auto* p = reinterpret_cast<const char*>(&v);
    data.insert(data.end(), p, p + sizeof v);
    return *this;
  }
  Bytes& text(const std::string& s) {
    number<std::uint64_t>(s.size());
    data.insert(data.end(), s.begin(), s.end());
    return *this;
  }
  Bytes& raw(const std::vector<char>& b) {
    data.insert(data.end(), b.begin(), b.end());
    return *this;
  }
  std::vector<char> data;
};

struct HandWritten {
  std::int64_t step = 0;
  std::int64_t epoch = 0;
  std::int64_t world_size = 1;
  std::vector<std::pair<std::string, std::vector<char>>> shared;
  std::vector<std::pair<std::string, std::vector<std::vector<char>>>> per_rank;
};

inline std::vector<char> encode(const HandWritten& h) {
  Bytes payload;
  payload.number(h.step).number(h.epoch).number(h.world_size).text("written by hand");
  payload.number<std::uint64_t>(h.shared.size());
  for (const auto& [name, bytes] : h.shared)
    payload.text(name).number<std::uint64_t>(bytes.size()).raw(bytes);
  payload.number<std::uint64_t>(h.per_rank.size());
  for (const auto& [name, ranks] : h.per_rank) {
    payload.text(name);
    for (const auto& bytes : ranks) payload.number<std::uint64_t>(bytes.size()).raw(bytes);
  }
  Bytes file;
  file.raw({'D', 'T', 'R', 'A', 'I', 'N', 'C', 'K'});
  file.number<std::uint32_t>(1).number<std::uint32_t>(0x01020304u);
  file.number<std::uint64_t>(payload.data.size()).number<std::uint64_t>(0);
  file.raw(payload.data);
  const std::uint32_t crc = dtrain::detail::crc32c(file.data.data(), file.data.size());
  file.number(crc).number<std::uint32_t>(0).raw({'D', 'T', 'R', 'A', 'I', 'N', 'O', 'K'});
  return file.data;
}

inline void write_file(const std::filesystem::path& path, const std::vector<char>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

inline std::vector<char> read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// ---- damage ---------------------------------------------------------------------------------

inline void truncate_to(const std::filesystem::path& path, std::uintmax_t bytes) {
  std::filesystem::resize_file(path, bytes);
}

inline void flip_byte(const std::filesystem::path& path, std::size_t at) {
  auto bytes = read_file(path);
  bytes.at(at) = static_cast<char>(bytes.at(at) ^ 0x10);
  write_file(path, bytes);
}

}  // namespace checkpoint_test
