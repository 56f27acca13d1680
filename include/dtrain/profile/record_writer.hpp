#pragma once
// Writes profile records to a JSON Lines file from a thread of its own, so the training thread
// only appends to a queue.
//
// Note [Complete lines only]
// A profile must stay readable after a crash. No stdio buffer, which could flush half a line when
// the process dies: the writer thread formats whole lines and hands them to write(2) itself. That
// alone is not enough: when a process is killed during a write(2) that spans several pages of
// the file, Linux stops between pages (it checks for a fatal signal before copying each one), and
// the file ends mid-line. So no write crosses a page boundary of the file: lines are written in
// runs that end where a page ends, and a line that would straddle the boundary goes to the next
// page, the rest of the current one filled with spaces and a newline (a blank line, which readers
// skip). Only a single line longer than a page could still be cut; the reader drops such a cut
// last line and says so. If a write fails (disk full), the file is truncated back to the end of
// the last whole run and writing stops with one warning.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include <fmt/format.h>

#include "dtrain/core/error.hpp"
#include "dtrain/core/logging.hpp"
#include "dtrain/profile/records.hpp"

namespace dtrain::detail {

class RecordWriter {
 public:
  // Creates or truncates `path`; `exclusive`: creates it, and a file already there is an error
  // (Note [Profile layout]). Throws InvalidArgumentError naming the file and the reason.
  explicit RecordWriter(std::string path, bool exclusive = false) : path_(std::move(path)) {
    fd_ = ::open(path_.c_str(),
                 O_WRONLY | O_CREAT | (exclusive ? O_EXCL : O_TRUNC) | O_CLOEXEC, 0644);
    if (fd_ < 0 && errno == EEXIST)
      throw InvalidArgumentError(fmt::format(
          "dtrain: the profile file '{}' exists already: another run wrote it (two jobs with the "
          "same DTRAINRUN_JOB_ID and DTRAINRUN_ATTEMPT?), and it is not overwritten; profile into "
          "another folder (DTRAIN_PROFILE or ProfilerOptions::dir) or move that run away",
          path_));
    if (fd_ < 0)
      throw InvalidArgumentError(fmt::format(
          "dtrain: cannot write the profile file '{}': {}; set DTRAIN_PROFILE (or "
          "ProfilerOptions::dir) to a folder this process can write",
          path_, std::strerror(errno)));
    thread_ = std::thread([this] { run(); });
  }
  RecordWriter(const RecordWriter&) = delete;
  RecordWriter& operator=(const RecordWriter&) = delete;
  ~RecordWriter() { close(); }

  const std::string& path() const noexcept { return path_; }

  // Cheap: the record is moved into the queue. The thread is woken only when a batch is full;
  // otherwise it writes every flush period.
  void push(ProfileRecord record) {
    bool wake = false;
    {
      std::lock_guard lock(mutex_);
      if (closing_) return;
      queue_.push_back(std::move(record));
      wake = queue_.size() >= batch_records;
    }
    if (wake) cv_.notify_one();
  }

  // Writes everything queued, then closes the file. Idempotent; never throws.
  void close() noexcept {
    {
      std::lock_guard lock(mutex_);
      if (closing_) return;
      closing_ = true;
    }
    cv_.notify_one();
    if (thread_.joinable()) thread_.join();
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

  // Blocks until every record pushed so far is in the file (for tests and stop()).
  void flush() {
    std::unique_lock lock(mutex_);
    const std::uint64_t target = pushed_total_locked();
    flush_requested_ = true;
    cv_.notify_one();
    done_cv_.wait(lock, [&] { return written_records_ >= target || closing_ || failed_; });
  }

  static constexpr std::size_t batch_records = 256;
  static constexpr std::size_t page_bytes = 4096;  // the page cache's unit on every Linux target
  static constexpr std::chrono::milliseconds flush_period{250};

 private:
  std::uint64_t pushed_total_locked() const { return written_records_ + in_flight_ + queue_.size(); }

  void run() {
    std::unique_lock lock(mutex_);
    for (;;) {
      cv_.wait_for(lock, flush_period, [&] {
        return closing_ || flush_requested_ || queue_.size() >= batch_records;
      });
      flush_requested_ = false;
      std::deque<ProfileRecord> batch;
      batch.swap(queue_);
      in_flight_ = batch.size();
      const bool last = closing_;
      lock.unlock();
      const bool ok = write_lines(batch);
      lock.lock();
      if (!ok) failed_ = true;
      written_records_ += in_flight_;
      in_flight_ = 0;
      done_cv_.notify_all();
      if (last && queue_.empty()) return;
    }
  }

  // Writer thread only: the records as lines, no write crossing a page boundary of the file
  // (Note [Complete lines only]). Returns false once writing has failed.
  bool write_lines(const std::deque<ProfileRecord>& records) {
    std::string run;  // whole lines that end on or before the end of the current page
    auto flush = [&] {
      const bool ok = run.empty() || write_whole(run);
      run.clear();
      return ok;
    };
    for (const ProfileRecord& r : records) {
      const std::string line = to_json_line(r);
      const std::size_t room = page_bytes - (committed_ + run.size()) % page_bytes;
      if (line.size() > room) {
        if (!flush()) return false;
        if (line.size() > page_bytes) {  // cannot fit any page: written on its own
          if (!write_whole(line)) return false;
          continue;
        }
        if (!write_whole(std::string(room - 1, ' ') + '\n')) return false;
      }
      run += line;
      if ((committed_ + run.size()) % page_bytes == 0 && !flush()) return false;
    }
    return flush();
  }

  // Writer thread only. Returns false once writing has failed.
  bool write_whole(const std::string& text) {
    if (gave_up_) return false;
    std::size_t done = 0;
    while (done < text.size()) {
      const ssize_t n = ::write(fd_, text.data() + done, text.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        const int err = n < 0 ? errno : ENOSPC;
        if (::ftruncate(fd_, static_cast<off_t>(committed_))) {}  // best effort
        gave_up_ = true;
        log(LogLevel::warning,
            "writing the profile file '{}' failed ({}); profiling stops here and the "
            "file keeps {} bytes of whole records",
            path_, std::strerror(err), committed_);
        return false;
      }
      done += static_cast<std::size_t>(n);
    }
    committed_ += text.size();
    return true;
  }

  std::string path_;
  int fd_ = -1;
  std::thread thread_;
  std::mutex mutex_;
  std::condition_variable cv_, done_cv_;
  std::deque<ProfileRecord> queue_;
  std::size_t in_flight_ = 0;
  std::uint64_t written_records_ = 0;
  bool closing_ = false;
  bool flush_requested_ = false;
  bool failed_ = false;          // writing failed (guarded by mutex_)
  bool gave_up_ = false;         // the same, for the writer thread's own use
  std::uint64_t committed_ = 0;  // bytes of whole runs of lines in the file (writer thread)
};

}  // namespace dtrain::detail
