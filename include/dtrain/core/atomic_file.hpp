#pragma once
// A file that appears whole or not at all, even if the process is killed or the machine loses
// power while it is written.
//
// Note [Atomic checkpoint files]
// The bytes go to a temporary file in the same folder (".<name>.tmp-<pid>"), which is flushed to
// the device with fsync, then renamed over the final name, and the folder itself is fsynced so the
// new directory entry survives a power loss. rename(2) within one file system replaces the entry
// atomically: a reader (or the next run) sees the previous file or the complete new one, never a
// mix. Without the first fsync, a crash after the rename can leave the new name pointing at a file
// whose blocks were never written (ext4 and XFS reorder data and metadata); without the second,
// the rename itself can be lost. A process killed before commit() leaves only its temporary file,
// which no reader takes for a checkpoint and the next restore removes.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include "dtrain/core/error.hpp"

namespace dtrain::detail {

inline std::string errno_text(int error) { return fmt::format("{} (errno {})", std::strerror(error), error); }

// Flushes a folder's entries (new, renamed or removed files) to the device.
inline void fsync_directory(std::filesystem::path directory) {
  if (directory.empty()) directory = ".";
  const int fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    throw Error(fmt::format("dtrain: cannot open folder {} to flush it: {}", directory.string(),
                            errno_text(errno)));
  // Some file systems cannot fsync a folder (EINVAL); they have nothing to flush either.
  const int rc = ::fsync(fd);
  const int error = errno;
  ::close(fd);
  if (rc != 0 && error != EINVAL)
    throw Error(fmt::format("dtrain: cannot flush folder {}: {}", directory.string(),
                            errno_text(error)));
}

inline std::string temporary_name_for(std::string_view final_name) {
  return fmt::format(".{}.tmp-{}", final_name, static_cast<long>(::getpid()));
}

inline bool is_temporary_name(std::string_view name, std::string_view final_prefix) {
  return name.size() > final_prefix.size() + 1 && name[0] == '.' &&
         name.substr(1, final_prefix.size()) == final_prefix &&
         name.find(".tmp-") != std::string_view::npos;
}

class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(std::filesystem::path final_path)
      : final_(std::move(final_path)),
        temporary_(final_.parent_path() / temporary_name_for(final_.filename().string())) {
    fd_ = ::open(temporary_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0)
      throw Error(fmt::format("dtrain: cannot create {}: {}", temporary_.string(),
                              errno_text(errno)));
  }
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  // Without commit() the temporary file is removed and the final name is untouched.
  ~AtomicFileWriter() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(temporary_.c_str());
  }

  void write(const void* data, std::size_t n) {
    const auto* p = static_cast<const char*>(data);
    while (n > 0) {
      const ssize_t written = ::write(fd_, p, n);
      if (written < 0) {
        if (errno == EINTR) continue;
        throw Error(fmt::format("dtrain: cannot write {}: {}", temporary_.string(),
                                errno_text(errno)));
      }
      p += written;
      n -= static_cast<std::size_t>(written);
    }
  }

  // fsync, rename over the final name, fsync the folder (Note [Atomic checkpoint files]).
  void commit() {
    if (::fsync(fd_) != 0)
      throw Error(fmt::format("dtrain: cannot flush {}: {}", temporary_.string(), errno_text(errno)));
    const int rc = ::close(fd_);
    fd_ = -1;
    if (rc != 0)
      throw Error(fmt::format("dtrain: cannot close {}: {}", temporary_.string(), errno_text(errno)));
    if (::rename(temporary_.c_str(), final_.c_str()) != 0)
      throw Error(fmt::format("dtrain: cannot rename {} to {}: {}", temporary_.string(),
                              final_.string(), errno_text(errno)));
    committed_ = true;
    fsync_directory(final_.parent_path());
  }

  const std::filesystem::path& temporary_path() const noexcept { return temporary_; }

 private:
  std::filesystem::path final_;
  std::filesystem::path temporary_;
  int fd_ = -1;
  bool committed_ = false;
};

}  // namespace dtrain::detail
