#pragma once
// One host's folder of elastic commits: where it is, that no other host writes into it, which job
// wrote each commit, and the newest valid commit of this job it holds (Note [Local commits] and
// Note [Whose commits] in train/elastic.hpp).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
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
// The first shared item of every commit: the job that wrote it, a string (Note [Whose commits]).
inline constexpr std::string_view commit_job_item = "dtrain.job";
// Enough of a file to hold its header, payload head and job item.
inline constexpr std::size_t commit_peek_bytes = std::size_t{64} << 10;

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

// The job a commit file records, from its first bytes alone: "" when it records none (an unnamed
// job's, or a commit from before commits named their job); nothing when those bytes are not the
// beginning of a commit (a damaged file, which the full read reports).
inline std::optional<std::string> peek_commit_job(const std::filesystem::path& file) {
  const int fd = ::open(file.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  std::vector<char> head(commit_peek_bytes);
  std::size_t got = 0;
  struct stat st {};
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
    while (got < head.size()) {
      const ::ssize_t n = ::read(fd, head.data() + got, head.size() - got);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      got += static_cast<std::size_t>(n);
    }
  }
  ::close(fd);
  if (got < checkpoint_header_bytes || std::memcmp(head.data(), checkpoint_magic, 8) != 0)
    return std::nullopt;
  std::uint64_t payload_bytes = 0;
  std::memcpy(&payload_bytes, head.data() + 16, 8);
  const std::size_t available = std::min<std::uint64_t>(got - checkpoint_header_bytes,
                                                        payload_bytes);
  ObjectReader in(head.data() + checkpoint_header_bytes, available);
  try {
    PayloadHead payload_head;
    std::uint64_t items = 0;
    in.read(payload_head);
    in.read(items);
    if (items == 0) return std::string();
    std::string name, job;
    std::uint64_t size = 0;
    in.read(name);
    if (name != commit_job_item) return std::string();
    in.read(size);
    in.read(job);
    return job;
  } catch (const InvalidArgumentError&) {
    return std::nullopt;
  }
}

// The job recorded in an indexed commit: "" when it records none. With `take`, the item leaves
// the record, so that the program sees only its own items.
inline std::string commit_job(std::span<const char> file, CheckpointRecord& record,
                              bool take = false) {
  auto& shared = record.shared;
  const auto it = std::find_if(shared.begin(), shared.end(),
                               [](const auto& item) { return item.first == commit_job_item; });
  if (it == shared.end()) return {};
  std::string job;
  try {
    ObjectReader in(file.data() + it->second.offset, it->second.size);
    in.read(job);
  } catch (const InvalidArgumentError&) {
    job.clear();
  }
  if (take) shared.erase(it);
  return job;
}

// The commits of another job that a folder holds: how many, and the newest one's step.
struct OtherJobCommits {
  std::string job;
  std::int64_t count = 0;
  std::int64_t newest_step = 0;
};

// The commit files of `directory` that `job` wrote, oldest first, or every one when `job` is
// null; the others, counted by job, go to `others` when given. A file whose job cannot be read is
// counted as `job`'s, so that reading it in full sets it aside when it is damaged.
inline std::vector<CheckpointFile> job_commit_files(const std::filesystem::path& directory,
                                                    const std::string* job,
                                                    std::vector<OtherJobCommits>* others = nullptr,
                                                    std::vector<SkippedCheckpointEntry>* skipped =
                                                        nullptr) {
  auto files = list_checkpoint_files(directory, skipped);
  if (job == nullptr) return files;
  std::map<std::string, OtherJobCommits> by_job;
  std::erase_if(files, [&](const CheckpointFile& f) {
    const auto recorded = peek_commit_job(f.path);
    if (!recorded || *recorded == *job) return false;
    OtherJobCommits& other = by_job[*recorded];
    other.job = *recorded;
    ++other.count;
    other.newest_step = std::max(other.newest_step, f.step);
    return true;
  });
  if (others != nullptr)
    for (auto& [name, other] : by_job) others->push_back(std::move(other));
  return files;
}

// Deletes every commit of `job` (every commit when null) but the newest keep_last (0: keeps all).
inline void prune_job_commits(const std::filesystem::path& directory, int keep_last,
                              const std::string* job) {
  if (keep_last <= 0) return;
  const auto files = job_commit_files(directory, job);
  for (std::size_t i = 0; i + static_cast<std::size_t>(keep_last) < files.size(); ++i) {
    std::error_code ec;
    std::filesystem::remove(files[i].path, ec);
    if (ec)
      log(LogLevel::warning, "dtrain: cannot delete old commit {}: {}", files[i].path.string(),
          ec.message());
  }
}

// The newest commit of `job` (of any job when null) in `directory` that is a valid checkpoint,
// read into `bytes` and indexed into `record`; nothing when there is none.
// Damaged files are set aside with a warning; other jobs' commits are counted into `others`.
inline std::optional<std::int64_t> newest_valid_commit(
    const std::filesystem::path& directory, std::vector<char>& bytes, CheckpointRecord& record,
    const std::string* job = nullptr, std::vector<OtherJobCommits>* others = nullptr) {
  std::vector<SkippedCheckpointEntry> skipped;
  const auto files = job_commit_files(directory, job, others, &skipped);
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
    if (why.empty() && job != nullptr && commit_job(bytes, record) != *job)
      continue;  // its first bytes could not be read, but it is valid: another job's
    if (why.empty()) return it->step;
    set_aside_checkpoint(it->path, why);
  }
  bytes.clear();
  return std::nullopt;
}

}  // namespace dtrain::detail
