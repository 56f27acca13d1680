#pragma once
// The directory listing and the file assignment of data/file_sharder.hpp. The directory overload
// sorts the names because directory iteration order differs between hosts and file systems.
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
#include "dtrain/data/file_sharder.hpp"
#include "dtrain/data/partition.hpp"

namespace dtrain {

namespace detail {

// Iterative with one backtrack point, so it is linear-ish and cannot blow up on patterns like
// "*a*a*a*b".
DTRAIN_API bool glob_match(std::string_view pattern, std::string_view name) {
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

DTRAIN_API std::vector<std::string> shard_files(const std::vector<std::string>& files,
                                                Partition partition, FileShardOptions options) {
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

DTRAIN_API std::vector<std::string> list_files(const std::string& dir_name,
                                               std::string_view pattern) {
  const std::filesystem::path dir(dir_name);
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

DTRAIN_API std::vector<std::string> shard_files(const std::string& dir, std::string_view pattern,
                                                Partition partition, FileShardOptions options) {
  const std::vector<std::string> files = list_files(dir, pattern);
  if (files.empty()) {
    throw InvalidArgumentError(fmt::format(
        "dtrain: shard_files: no regular file in '{}' matches '{}'; check the directory and the "
        "pattern",
        dir, pattern));
  }
  return shard_files(files, partition, options);
}

}  // namespace dtrain
