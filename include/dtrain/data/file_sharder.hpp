#pragma once
// Assigns whole files (record shards, tar archives) to data-parallel ranks for datasets that are
// read file by file rather than indexed sample by sample.
//
// Every part gets the same number of files (Note [Equal steps on every rank] in
// distributed_sampler.hpp): the list is padded by wrapping around, so with 10 files and 4 parts
// two files are read twice per epoch. Equal file counts give equal step counts only when files
// hold equal numbers of samples; otherwise bound the steps per epoch explicitly.
// Assignment is the DistributedSampler's over file positions, so it is deterministic and
// identical on every rank given the same list, seed and epoch. The directory overload sorts the
// names because directory iteration order differs between hosts and file systems.
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include <fmt/format.h>

#include "dtrain/core/error.hpp"
#include "dtrain/data/distributed_sampler.hpp"
#include "dtrain/data/partition.hpp"

namespace dtrain {

namespace detail {

// Glob match of a whole file name: '*' matches any run of characters, '?' exactly one; every
// other character matches itself. Iterative with one backtrack point, so it is linear-ish and
// cannot blow up on patterns like "*a*a*a*b".
inline bool glob_match(std::string_view pattern, std::string_view name) {
  std::size_t p = 0;
  std::size_t n = 0;
  std::size_t star = std::string_view::npos;
  std::size_t star_n = 0;
  while (n < name.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == name[n])) {
      ++p;
      ++n;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      star_n = n;
    } else if (star != std::string_view::npos) {
      p = star + 1;
      n = ++star_n;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

}  // namespace detail

struct FileShardOptions {
  bool shuffle = true;      // a new assignment every epoch, drawn from (seed, epoch)
  std::uint64_t seed = 0;   // the same on every rank
  std::int64_t epoch = 0;   // >= 0
};

// This rank's files for the epoch: ceil(files / partition.parts) of them, the same count in every
// part. Pass the same list (same order) on every rank:
//   auto mine = shard_files(files, {.parts = dtrain::size(), .part = dtrain::rank()},
//                           {.seed = 7, .epoch = epoch});
inline std::vector<std::string> shard_files(const std::vector<std::string>& files,
                                            Partition partition, FileShardOptions options = {}) {
  if (files.empty()) {
    throw InvalidArgumentError(
        "dtrain: shard_files: files is empty; there is nothing to give each of the parts. Check "
        "the dataset path and file pattern");
  }
  detail::check_partition("shard_files", partition);
  if (options.epoch < 0) {
    throw InvalidArgumentError(
        fmt::format("dtrain: shard_files: options.epoch must be >= 0, got {}", options.epoch));
  }
  DistributedSampler sampler(static_cast<std::int64_t>(files.size()), partition,
                             {.shuffle = options.shuffle, .seed = options.seed});
  sampler.set_epoch(options.epoch);
  std::vector<std::string> mine;
  for (const std::int64_t i : sampler.indices()) {
    mine.push_back(files[static_cast<std::size_t>(i)]);
  }
  return mine;
}

// Regular files directly inside dir whose name matches pattern ("*.tfrecord", "train-??.tar",
// "*" for all), sorted by name, as paths that start with dir.
inline std::vector<std::string> list_files(const std::filesystem::path& dir,
                                           std::string_view pattern = "*") {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    throw InvalidArgumentError(fmt::format("dtrain: list_files: '{}' is not a readable directory{}",
                                           dir.string(), ec ? ": " + ec.message() : ""));
  }
  std::vector<std::string> names;
  std::filesystem::directory_iterator it(dir, ec);
  const std::filesystem::directory_iterator end;
  for (; !ec && it != end; it.increment(ec)) {
    std::error_code type_ec;
    if (!it->is_regular_file(type_ec)) continue;
    const std::string name = it->path().filename().string();
    if (detail::glob_match(pattern, name)) names.push_back(name);
  }
  if (ec) {
    throw InvalidArgumentError(
        fmt::format("dtrain: list_files: cannot list '{}': {}", dir.string(), ec.message()));
  }
  std::sort(names.begin(), names.end());
  std::vector<std::string> paths;
  paths.reserve(names.size());
  for (const auto& name : names) paths.push_back((dir / name).string());
  return paths;
}

// The files in dir matching pattern, sorted by name, then sharded as above.
inline std::vector<std::string> shard_files(const std::filesystem::path& dir,
                                            std::string_view pattern, Partition partition,
                                            FileShardOptions options = {}) {
  const std::vector<std::string> files = list_files(dir, pattern);
  if (files.empty()) {
    throw InvalidArgumentError(fmt::format(
        "dtrain: shard_files: no regular file in '{}' matches '{}'; check the directory and the pattern",
        dir.string(), pattern));
  }
  return shard_files(files, partition, options);
}

}  // namespace dtrain
