#pragma once
// The writing half of checkpoint files, shared by Checkpoint (rank 0 writes) and elastic::State
// (one rank per host writes): the payload of shared items, the checksummed atomic write, and the
// folder's housekeeping (Note [Checkpoint file format], Note [Atomic checkpoint files]).
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "dtrain/core/atomic_file.hpp"
#include "dtrain/core/crc32c.hpp"
#include "dtrain/core/logging.hpp"
#include "dtrain/core/serialize.hpp"
#include "dtrain/core/version.hpp"
#include "dtrain/train/checkpoint.hpp"
#include "dtrain/train/checkpoint_format.hpp"

namespace dtrain::detail {

inline constexpr std::size_t checkpoint_write_chunk_bytes = std::size_t{4} << 20;

// Removes temporary files that writers killed mid-write left behind (not this process's own).
inline void remove_stale_temporaries(const std::filesystem::path& directory) {
  const std::string own = fmt::format(".tmp-{}", static_cast<long>(::getpid()));
  std::error_code ec;
  for (std::filesystem::directory_iterator it(directory, ec), end; !ec && it != end;
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!is_temporary_name(name, checkpoint_prefix) || name.ends_with(own)) continue;
    std::error_code removed;
    std::filesystem::remove(it->path(), removed);
    log(LogLevel::debug, "dtrain: removed {}, left by a checkpoint write that did not finish",
        it->path().string());
  }
}

// Deletes every checkpoint but the newest keep_last (0: keeps all).
inline void prune_checkpoints(const std::filesystem::path& directory, int keep_last) {
  if (keep_last <= 0) return;
  const auto files = list_checkpoint_files(directory);
  const std::size_t keep = static_cast<std::size_t>(keep_last);
  for (std::size_t i = 0; i + keep < files.size(); ++i) {
    std::error_code ec;
    std::filesystem::remove(files[i].path, ec);
    if (ec)
      log(LogLevel::warning, "dtrain: cannot delete old checkpoint {}: {}", files[i].path.string(),
          ec.message());
  }
}

// The background half of a save: checksum, atomic write, pruning. Returns the buffer for reuse.
inline std::vector<char> write_checkpoint_file(std::filesystem::path directory, std::int64_t step,
                                               int keep_last, std::vector<char> payload) {
  AtomicFileWriter file(directory / checkpoint_file_name(step));
  const auto header = checkpoint_header(payload.size());
  std::uint32_t crc = crc32c(header.data(), header.size());
  file.write(header.data(), header.size());
  for (std::size_t at = 0; at < payload.size(); at += checkpoint_write_chunk_bytes) {
    const std::size_t n = std::min(checkpoint_write_chunk_bytes, payload.size() - at);
    crc = crc32c_extend(crc, payload.data() + at, n);
    file.write(payload.data() + at, n);
  }
  const auto trailer = checkpoint_trailer(crc);
  file.write(trailer.data(), trailer.size());
  file.commit();
  prune_checkpoints(directory, keep_last);
  payload.clear();
  return payload;
}

// Appends name, a size placeholder and the item's bytes, then patches the size: one copy of the
// value, straight into the payload.
inline void write_item(ObjectWriter& w, std::string_view name, const CheckpointItem& item) {
  w.write(std::string(name));
  const std::size_t size_at = w.bytes().size();
  w.write(std::uint64_t{0});
  item.write(w);
  const std::uint64_t size = w.bytes().size() - size_at - sizeof(std::uint64_t);
  std::memcpy(w.bytes().data() + size_at, &size, sizeof size);
}

// The payload's head and its shared items, into `w` (whose buffer the caller may have reused);
// the per-rank items, or their count 0, follow.
inline void write_payload_head(ObjectWriter& w, const TrainingProgress& progress, int world,
                               std::span<const CheckpointItem> shared) {
  w.write(PayloadHead{progress.step, progress.epoch, static_cast<std::int64_t>(world),
                      fmt::format("dtrain {}", version())});
  w.write(static_cast<std::uint64_t>(shared.size()));
  for (const auto& item : shared) write_item(w, item.name(), item);
}

// Renames a damaged checkpoint to "<name>.invalid", so that it is never picked, or pruned, again.
inline void set_aside_checkpoint(const std::filesystem::path& path, const std::string& why) {
  const std::filesystem::path aside = path.string() + ".invalid";
  std::error_code ec;
  std::filesystem::rename(path, aside, ec);
  log(LogLevel::warning, "dtrain: skipping checkpoint {}: {}; {}", path.string(), why,
      ec ? fmt::format("could not rename it aside: {}", ec.message())
         : fmt::format("renamed it to {}", aside.string()));
}

// Checks the names and the progress of a save: non-negative step and epoch, unique non-empty names.
inline void check_save_arguments(std::string_view caller, const TrainingProgress& progress,
                                 std::span<const CheckpointItem> shared,
                                 std::span<const CheckpointItem> per_rank) {
  if (progress.step < 0 || progress.epoch < 0)
    throw InvalidArgumentError(fmt::format("dtrain: {}: step {} and epoch {} must be >= 0",
                                           caller, progress.step, progress.epoch));
  std::vector<std::string_view> names;
  for (const auto& item : shared) names.push_back(item.name());
  for (const auto& item : per_rank) names.push_back(item.name());
  std::sort(names.begin(), names.end());
  if (!names.empty() && names.front().empty())
    throw InvalidArgumentError(fmt::format("dtrain: {}: an item has an empty name", caller));
  if (auto dup = std::adjacent_find(names.begin(), names.end()); dup != names.end())
    throw InvalidArgumentError(fmt::format(
        "dtrain: {}: item name '{}' appears twice: names must be unique", caller, *dup));
}

}  // namespace dtrain::detail
