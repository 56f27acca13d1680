#pragma once
// The sampler thread: every interval it reads the process and system counters (/proc), the GPU
// (NVML) and the engine's counters, turns the differences since the previous reading into rates
// and increases, and queues a sample record. It runs only while the profiler records.
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <thread>

#include "dtrain/profile/nvml.hpp"
#include "dtrain/profile/proc_stats.hpp"
#include "dtrain/profile/record_writer.hpp"
#include "dtrain/profile/records.hpp"
#include "dtrain/runtime/engine_stats.hpp"
#include "dtrain/runtime/session.hpp"

namespace dtrain::detail {

// The engine's counters now, or nothing when dtrain is not running.
inline std::optional<EngineStats> engine_snapshot() {
  if (!dtrain::is_initialized()) return std::nullopt;
  try {
    return dtrain::engine_stats();
  } catch (const NotInitializedError&) {  // shut down since the check
    return std::nullopt;
  }
}

// The engine's activity over a sampling period. Counters start at zero when the engine starts,
// so a period in which it started counts from zero.
inline std::optional<EngineStats> engine_increase(const std::optional<EngineStats>& before,
                                                  const std::optional<EngineStats>& after) {
  if (!after) return std::nullopt;
  return engine_stats_delta(*after, before.value_or(EngineStats{}));
}

// The sample for the period between two readings `seconds` apart. Counters that went backwards
// (a network interface reset) give no rate rather than a huge one.
inline SampleRecord make_sample(const ProcSnapshot& before, const ProcSnapshot& after,
                                double seconds, long ticks_per_second) {
  SampleRecord s;
  if (!(seconds > 0)) return s;
  auto rate = [&](std::uint64_t a, std::uint64_t b) -> std::optional<double> {
    if (b < a) return std::nullopt;
    return static_cast<double>(b - a) / seconds;
  };
  if (before.process && after.process) {
    const auto a = before.process->user_ticks + before.process->system_ticks;
    const auto b = after.process->user_ticks + after.process->system_ticks;
    if (auto ticks = rate(a, b)) s.process_cpu_pct = *ticks / static_cast<double>(ticks_per_second) * 100;
  }
  if (after.process) s.threads = after.process->threads;
  if (before.system && after.system) {
    const auto busy = after.system->busy_ticks - before.system->busy_ticks;
    const auto total = after.system->total_ticks - before.system->total_ticks;
    if (after.system->total_ticks > before.system->total_ticks &&
        after.system->busy_ticks >= before.system->busy_ticks)
      s.system_cpu_pct = 100.0 * static_cast<double>(busy) / static_cast<double>(total);
  }
  if (after.system && after.system->procs_running >= 0)
    s.procs_running = after.system->procs_running;
  if (after.status) s.rss_bytes = after.status->rss_bytes;
  if (before.status && after.status)
    s.involuntary_switches_per_s =
        rate(before.status->involuntary_switches, after.status->involuntary_switches);
  if (before.network && after.network) {
    s.net_rx_bytes_per_s = rate(before.network->read, after.network->read);
    s.net_tx_bytes_per_s = rate(before.network->write, after.network->write);
  }
  if (before.disk && after.disk) {
    s.disk_read_bytes_per_s = rate(before.disk->read, after.disk->read);
    s.disk_write_bytes_per_s = rate(before.disk->write, after.disk->write);
  }
  if (before.process_io && after.process_io) {
    s.process_read_bytes_per_s = rate(before.process_io->read, after.process_io->read);
    s.process_write_bytes_per_s = rate(before.process_io->write, after.process_io->write);
  }
  return s;
}

class SystemSampler {
 public:
  using Clock = std::chrono::steady_clock;

  // `origin` is the run's time zero; `nvml` may be unavailable.
  SystemSampler(RecordWriter& writer, const Nvml& nvml, std::chrono::milliseconds interval,
          Clock::time_point origin)
      : writer_(&writer), nvml_(&nvml), interval_(interval), origin_(origin) {}
  SystemSampler(const SystemSampler&) = delete;
  SystemSampler& operator=(const SystemSampler&) = delete;
  ~SystemSampler() { stop(); }

  void start() {
    std::lock_guard lock(mutex_);
    if (thread_.joinable()) return;
    stopping_ = false;
    // The first reading is taken here, so a sampler stopped any time later has a period to
    // report however late its thread got to run.
    thread_ = std::thread([this, first = read_proc_snapshot(), engine = engine_snapshot(),
                           at = Clock::now()] { run(first, engine, at); });
  }

  // Ends the thread after one last sample covering the time since the previous one. Under half an
  // interval, that sample holds only the engine's counters: CPU time is counted in 10 ms ticks,
  // too coarse for a short period.
  void stop() noexcept {
    {
      std::lock_guard lock(mutex_);
      if (!thread_.joinable()) return;
      stopping_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }

 private:
  void run(ProcSnapshot before, std::optional<EngineStats> engine_before,
           Clock::time_point before_time) {
    const long ticks = clock_ticks_per_second();
    std::unique_lock lock(mutex_);
    for (;;) {
      const bool last = cv_.wait_for(lock, interval_, [&] { return stopping_; });
      lock.unlock();
      const ProcSnapshot after = read_proc_snapshot();
      const std::optional<EngineStats> engine_after = engine_snapshot();
      const Clock::time_point now = Clock::now();
      const double seconds = std::chrono::duration<double>(now - before_time).count();
      if (last && now - before_time < interval_ / 2) {
        // Too short for CPU figures, but the engine's counters since the last sample are exact
        // and would be lost: a tail sample carries them alone.
        if (engine_after) {
          SampleRecord tail;
          tail.t = std::chrono::duration<double>(now - origin_).count();
          tail.engine = engine_increase(engine_before, engine_after);
          writer_->push(std::move(tail));
        }
        return;
      }
      SampleRecord s = make_sample(before, after, seconds, ticks);
      s.t = std::chrono::duration<double>(now - origin_).count();
      s.gpu = nvml_->read();
      s.engine = engine_increase(engine_before, engine_after);
      writer_->push(std::move(s));
      before = after;
      engine_before = engine_after;
      before_time = now;
      lock.lock();
      if (last) return;
    }
  }

  RecordWriter* writer_;
  const Nvml* nvml_;
  std::chrono::milliseconds interval_;
  Clock::time_point origin_;
  std::thread thread_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool stopping_ = false;
};

}  // namespace dtrain::detail
