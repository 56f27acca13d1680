#pragma once
// Chrome-trace timeline (loads in Perfetto and chrome://tracing). Rank 0 writes it: it sees every
// rank's readiness. The engine only appends events to a queue; a writer thread formats and writes
// them, so the hot path never touches the file. The file is a JSON array that is closed properly
// at stop/shutdown; once `max_bytes` is reached recording stops with a final marker event, so long
// jobs cannot fill a disk.
#include <atomic>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>

#include <fmt/format.h>

#include <cerrno>
#include <cstring>

#include "dtrain/core/error.hpp"
#include "dtrain/core/json_writer.hpp"
#include "dtrain/core/logging.hpp"

namespace dtrain::detail {

class Timeline {
 public:
  using Clock = std::chrono::steady_clock;

  Timeline() = default;
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;
  ~Timeline() { stop(); }

  void start(const std::string& path, std::int64_t max_bytes, bool mark_cycles) {
    stop();
    std::FILE* f = std::fopen(path.c_str(), "w");
    if (!f)
      throw InvalidArgumentError(fmt::format("dtrain: cannot open timeline file '{}' for writing "
                                             "(DTRAIN_TIMELINE)", path));
    // A file that opens but cannot be written (a full disk, /dev/full) fails here, not silently.
    if (std::fputs("[\n", f) < 0 || std::fflush(f) != 0) {
      const int err = errno;
      std::fclose(f);
      throw InvalidArgumentError(fmt::format("dtrain: cannot write the timeline file '{}' "
                                             "(DTRAIN_TIMELINE): {}", path, std::strerror(err)));
    }
    std::lock_guard lock(mutex_);
    file_ = f;
    path_ = path;
    max_bytes_ = max_bytes;
    mark_cycles_ = mark_cycles;
    written_ = 0;
    truncated_ = false;
    first_event_ = true;
    rows_.clear();
    stopping_ = false;
    active_ = true;
    written_ = 2;
    writer_ = std::thread([this] { writer_loop(); });
  }

  void stop() {
    {
      std::lock_guard lock(mutex_);
      if (!active_) return;
      stopping_ = true;
    }
    cv_.notify_all();
    writer_.join();
    std::lock_guard lock(mutex_);
    write_raw("\n]\n");
    const bool failed = std::ferror(file_) != 0;
    if (std::fclose(file_) != 0 || failed)
      log(LogLevel::error, "dtrain: writing the timeline file '{}' failed; it is incomplete", path_);
    file_ = nullptr;
    active_ = false;
  }

  bool active() const noexcept { return active_; }
  bool mark_cycles() const noexcept { return mark_cycles_; }

  // A complete phase ("X" event) on the row of tensor `name`.
  void span(const std::string& name, std::string_view phase, Clock::time_point begin,
            Clock::time_point end) {
    push(Event{name, std::string(phase), begin, end, 'X', -1});
  }
  // A per-rank readiness tick during negotiation.
  void rank_ready(const std::string& name, int rank, Clock::time_point when) {
    push(Event{name, "READY_RANK_" + std::to_string(rank), when, when, 'i', rank});
  }
  void cycle_mark(Clock::time_point when) {
    if (mark_cycles_) push(Event{"", "CYCLE_START", when, when, 'C', -1});
  }

 private:
  struct Event {
    std::string name;
    std::string phase;
    Clock::time_point begin, end;
    char type;
    int rank;
  };

  void push(Event e) {
    {
      std::lock_guard lock(mutex_);
      if (!active_ || truncated_) return;
      queue_.push_back(std::move(e));
    }
    cv_.notify_one();
  }

  double micros(Clock::time_point t) const {
    return std::chrono::duration<double, std::micro>(t - origin_).count();
  }

  void write_raw(std::string_view s) {
    std::fwrite(s.data(), 1, s.size(), file_);
    written_ += static_cast<std::int64_t>(s.size());
  }

  void write_event(const std::string& json) {
    if (!first_event_) write_raw(",\n");
    first_event_ = false;
    write_raw(json);
  }

  void format(const Event& e) {
    int tid = 0;
    if (!e.name.empty()) {
      auto [it, inserted] = rows_.try_emplace(e.name, static_cast<int>(rows_.size()) + 1);
      tid = it->second;
      if (inserted) {
        JsonObject args;
        args.field("name", e.name);
        JsonObject row;
        row.field("name", "thread_name").field("ph", "M").field("pid", 0).field("tid", tid);
        write_event(row.field("args", args).closed());
      }
    }
    JsonObject event;
    event.field("name", e.phase);
    if (e.type == 'X') {
      event.field("ph", "X").field("pid", 0).field("tid", tid).fixed("ts", micros(e.begin), 3);
      event.fixed("dur", micros(e.end) - micros(e.begin), 3);
    } else if (e.type == 'i') {
      event.field("ph", "i").field("s", "t").field("pid", 0).field("tid", tid);
      JsonObject args;
      args.field("rank", e.rank);
      event.fixed("ts", micros(e.begin), 3).field("args", args);
    } else {
      event.field("ph", "i").field("s", "g").field("pid", 0).field("tid", 0);
      event.fixed("ts", micros(e.begin), 3);
    }
    write_event(event.closed());
  }

  void writer_loop() {
    std::deque<Event> batch;
    std::unique_lock lock(mutex_);
    while (true) {
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      batch.swap(queue_);
      const bool stopping = stopping_;
      lock.unlock();  // format and write without blocking the engine's push()
      for (const Event& e : batch) {
        if (truncated_) break;
        format(e);
        if (max_bytes_ > 0 && written_ >= max_bytes_) {
          truncated_ = true;
          write_event(fmt::format(R"({{"name":"TIMELINE_TRUNCATED","ph":"i","s":"g","pid":0,"tid":0,"ts":{:.3f},"args":{{"max_bytes":{}}}}})",
                                  micros(Clock::now()), max_bytes_));
        }
      }
      batch.clear();
      if (!truncated_ && (std::fflush(file_) != 0 || std::ferror(file_))) {
        // Stop recording rather than fill the log with one error per event.
        log(LogLevel::error, "dtrain: writing the timeline file '{}' failed ({}); recording stops",
            path_, std::strerror(errno));
        truncated_ = true;
      }
      lock.lock();
      if (stopping && queue_.empty()) break;
    }
    std::fflush(file_);
  }

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Event> queue_;
  std::thread writer_;
  std::FILE* file_ = nullptr;
  std::string path_;
  std::unordered_map<std::string, int> rows_;
  Clock::time_point origin_ = Clock::now();
  std::int64_t max_bytes_ = 0;
  std::int64_t written_ = 0;
  bool mark_cycles_ = false;
  std::atomic<bool> truncated_{false};
  bool first_event_ = true;
  bool stopping_ = false;
  std::atomic<bool> active_{false};
};

// The timeline's name for negotiating an op of `kind`: NEGOTIATE_ALLREDUCE, ...
inline std::string negotiation_phase(std::string_view kind) {
  std::string out = "NEGOTIATE_";
  for (char c : kind) out += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

}  // namespace dtrain::detail
