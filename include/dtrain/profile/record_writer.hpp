#pragma once
// Writes profile records to a JSON Lines file from a thread of its own, so the training thread
// only appends to a queue.
//
// Note [Complete lines only]
// A profile must stay readable after a crash. The writer formats a batch of records into one
// buffer of whole lines and hands it to write(2) directly (no stdio buffer that could flush half
// a line when the process dies). If a write fails part-way (disk full), the file is truncated
// back to the end of the last whole batch and writing stops with one warning: the file then ends
// on a line boundary, and the reader reports the profile as cut short.
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
  // Creates or truncates `path`. Throws InvalidArgumentError naming the file and the reason.
  explicit RecordWriter(std::string path) : path_(std::move(path)) {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
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
      std::string text;
      for (const ProfileRecord& r : batch) text += to_json_line(r);
      const bool ok = write_whole(text);
      lock.lock();
      if (!ok) failed_ = true;
      written_records_ += in_flight_;
      in_flight_ = 0;
      done_cv_.notify_all();
      if (last && queue_.empty()) return;
    }
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
  std::uint64_t committed_ = 0;  // bytes of whole batches in the file (writer thread)
};

}  // namespace dtrain::detail
