#pragma once
// One host's folder of elastic commits: where it is, that no other host writes into it, and the
// newest valid commit it holds (Note [Local commits] in train/elastic.hpp).
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include <fmt/format.h>

#include "dtrain/core/atomic_file.hpp"
#include "dtrain/core/logging.hpp"
#include "dtrain/train/checkpoint_format.hpp"
#include "dtrain/train/checkpoint_record.hpp"
#include "dtrain/train/checkpoint_writer.hpp"

namespace dtrain::detail {

inline constexpr std::string_view host_placeholder = "{host}";
inline constexpr std::string_view host_marker_prefix = ".dtrain-host-";

// A host name as one path component: characters other than letters, digits, '.', '-' and '_'
// become '_' (a DTRAIN_HOST_ID may hold anything).
inline std::string host_path_component(std::string_view host) {
  std::string out(host);
  for (char& c : out) {
    const bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                       c == '.' || c == '-' || c == '_';
    if (!plain) c = '_';
  }
  if (out.empty() || out == "." || out == "..") out = "_" + out;
  return out;
}

// `directory` with every "{host}" replaced by this host's name.
inline std::filesystem::path resolve_commit_directory(const std::filesystem::path& directory,
                                                      std::string_view host) {
  std::string text = directory.string();
  const std::string name = host_path_component(host);
  for (auto at = text.find(host_placeholder); at != std::string::npos;
       at = text.find(host_placeholder, at + name.size()))
    text.replace(at, host_placeholder.size(), name);
  return text;
}

// Creates the folder and marks it as `host`'s. Returns what is wrong, or an empty string: a folder
// that another host marked is shared, and two hosts writing into one folder would delete each
// other's writes in progress (Note [Local commits]).
inline std::string claim_commit_directory(const std::filesystem::path& directory,
                                          std::string_view host) {
  std::error_code ec;
  std::filesystem::create_directories(directory, ec);
  if (ec)
    return fmt::format("cannot create the commit folder {}: {}", directory.string(), ec.message());
  // Marked before it is listed: of two hosts that claim a folder at once, the one that lists it
  // later sees the other's mark.
  const std::string own = std::string(host_marker_prefix) + host_path_component(host);
  if (!std::filesystem::exists(directory / own, ec)) {
    try {
      AtomicFileWriter marker(directory / own);
      marker.write(host.data(), host.size());
      marker.commit();
    } catch (const Error& e) {
      return fmt::format("cannot write into the commit folder {}: {}", directory.string(),
                         e.what());
    }
  }
  std::vector<std::string> others;
  for (std::filesystem::directory_iterator it(directory, ec), end; !ec && it != end;
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.starts_with(host_marker_prefix) && name != own)
      others.push_back(name.substr(host_marker_prefix.size()));
  }
  if (ec)
    return fmt::format("cannot list the commit folder {}: {}", directory.string(), ec.message());
  if (!others.empty()) {
    std::sort(others.begin(), others.end());
    return fmt::format(
        "the commit folder {} belongs to host {} as well as to this host ({}): elastic commits "
        "go to a folder of each host's own (a local disk, or /dev/shm). Put {{host}} in "
        "Options::directory where the folder is on a shared filesystem, or remove {} if that "
        "host's commits are no longer wanted",
        directory.string(), fmt::join(others, ", "), host,
        (directory / (std::string(host_marker_prefix) + others.front())).string());
  }
  remove_stale_temporaries(directory);
  return {};
}

// The newest commit in `directory` that is a valid checkpoint, read into `bytes` and indexed into
// `record`; nothing when there is none. Damaged files are set aside with a warning.
inline std::optional<std::int64_t> newest_valid_commit(const std::filesystem::path& directory,
                                                       std::vector<char>& bytes,
                                                       CheckpointRecord& record) {
  std::vector<SkippedCheckpointEntry> skipped;
  const auto files = list_checkpoint_files(directory, &skipped);
  for (const auto& entry : skipped)
    log(LogLevel::warning, "dtrain: skipping {}: it is named like a checkpoint but is {}",
        entry.path.string(), entry.what);
  for (auto it = files.rbegin(); it != files.rend(); ++it) {
    std::string why = read_file_bytes(it->path, bytes);
    if (why.empty()) why = parse_checkpoint(bytes, record);
    if (why.empty() && record.step != it->step)
      why = fmt::format("it holds step {} but is named for step {}", record.step, it->step);
    if (why.empty() && !record.per_rank.empty())
      why = "it holds per-rank items, which elastic commits never do";
    if (why.empty()) return it->step;
    set_aside_checkpoint(it->path, why);
  }
  bytes.clear();
  return std::nullopt;
}

}  // namespace dtrain::detail
