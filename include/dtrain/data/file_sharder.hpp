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
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "dtrain/core/build_mode.hpp"
#include "dtrain/data/partition.hpp"

namespace dtrain {

namespace detail {
// Glob match of a whole file name: '*' matches any run of characters, '?' exactly one; every
// other character matches itself.
DTRAIN_API bool glob_match(std::string_view pattern, std::string_view name);
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
DTRAIN_API std::vector<std::string> shard_files(const std::vector<std::string>& files,
                                                Partition partition, FileShardOptions options = {});

// Regular files directly inside dir whose name matches pattern ("*.tfrecord", "train-??.tar",
// "*" for all), sorted by name, as paths that start with dir. A std::filesystem::path converts.
DTRAIN_API std::vector<std::string> list_files(const std::string& dir,
                                               std::string_view pattern = "*");

// The files in dir matching pattern, sorted by name, then sharded as above.
DTRAIN_API std::vector<std::string> shard_files(const std::string& dir, std::string_view pattern,
                                                Partition partition,
                                                FileShardOptions options = {});

}  // namespace dtrain

#ifdef DTRAIN_HEADER_ONLY
#include "dtrain/data/file_sharder_impl.hpp"
#endif
