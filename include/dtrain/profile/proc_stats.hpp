#pragma once
// Process and system counters read from Linux's /proc: CPU time, memory, threads, context
// switches, network and disk bytes. Each file has a pure parser (tested on fixed text) and a
// reader; a file that is missing or unreadable (another OS, a restricted container) yields
// nothing and the metric is left out of the profile.
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace dtrain::detail {

// /proc/self/stat: CPU time in clock ticks, thread count, and when the process started.
struct ProcessStat {
  std::uint64_t user_ticks = 0;
  std::uint64_t system_ticks = 0;
  std::int64_t threads = 0;
  std::optional<std::uint64_t> start_ticks;  // since boot
};

// /proc/stat: the machine's CPU time in ticks, and runnable tasks right now.
struct SystemCpu {
  std::uint64_t busy_ticks = 0;
  std::uint64_t total_ticks = 0;
  std::int64_t procs_running = 0;
};

// /proc/self/status: resident memory and context switches.
struct ProcessStatus {
  std::uint64_t rss_bytes = 0;
  std::uint64_t voluntary_switches = 0;
  std::uint64_t involuntary_switches = 0;
};

struct ByteCounters {
  std::uint64_t read = 0;   // received, for network
  std::uint64_t write = 0;  // sent, for network
};

inline std::optional<std::string> read_small_file(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "r");
  if (!f) return std::nullopt;
  std::string text;
  char buf[4096];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) text.append(buf, n);
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) return std::nullopt;
  return text;
}

// Field numbers as in proc(5), counted from 1. The command name (field 2) is in parentheses and
// may itself contain spaces and parentheses, so fields are counted from the last ')'.
inline std::optional<ProcessStat> parse_process_stat(std::string_view text) {
  const auto close = text.rfind(')');
  if (close == std::string_view::npos) return std::nullopt;
  std::istringstream in{std::string(text.substr(close + 1))};
  std::vector<std::string> fields;  // fields[0] is field 3
  for (std::string f; in >> f;) fields.push_back(f);
  if (fields.size() < 18) return std::nullopt;
  try {
    ProcessStat s;
    s.user_ticks = std::stoull(fields[14 - 3]);
    s.system_ticks = std::stoull(fields[15 - 3]);
    s.threads = std::stoll(fields[20 - 3]);
    if (fields.size() >= 22 - 2) s.start_ticks = std::stoull(fields[22 - 3]);
    return s;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

inline std::optional<SystemCpu> parse_system_stat(std::string_view text) {
  std::istringstream in{std::string(text)};
  std::optional<SystemCpu> out;
  std::int64_t running = -1;
  for (std::string line; std::getline(in, line);) {
    std::istringstream words(line);
    std::string key;
    words >> key;
    if (key == "cpu") {
      // user nice system idle iowait irq softirq steal (guest time is already inside user/nice)
      std::uint64_t v[8] = {};
      int n = 0;
      while (n < 8 && words >> v[n]) ++n;
      if (n < 4) return std::nullopt;
      SystemCpu c;
      c.busy_ticks = v[0] + v[1] + v[2] + v[5] + v[6] + v[7];
      c.total_ticks = c.busy_ticks + v[3] + v[4];
      out = c;
    } else if (key == "procs_running") {
      words >> running;
    }
  }
  if (out) out->procs_running = running;
  return out;
}

// Calls `f(key, value)` for each "key: number" line of a /proc file (/proc/self/status,
// /proc/self/io), the key with its colon; other lines are skipped.
template <class F>
void for_each_proc_number(std::string_view text, F&& f) {
  std::istringstream in{std::string(text)};
  for (std::string line; std::getline(in, line);) {
    std::istringstream words(line);
    std::string key;
    std::uint64_t value = 0;
    if (words >> key >> value) f(std::string_view(key), value);
  }
}

inline std::optional<ProcessStatus> parse_process_status(std::string_view text) {
  ProcessStatus s;
  int found = 0;
  for_each_proc_number(text, [&](std::string_view key, std::uint64_t value) {
    if (key == "VmRSS:") s.rss_bytes = value * 1024, ++found;  // reported in kB
    else if (key == "voluntary_ctxt_switches:") s.voluntary_switches = value, ++found;
    else if (key == "nonvoluntary_ctxt_switches:") s.involuntary_switches = value, ++found;
  });
  if (found == 0) return std::nullopt;
  return s;
}

// /proc/net/dev: bytes received and sent over every interface but loopback (ranks on one host
// talk through shared memory, not loopback; other hosts are reached through real interfaces).
inline std::optional<ByteCounters> parse_net_dev(std::string_view text) {
  std::istringstream in{std::string(text)};
  ByteCounters total;
  bool any = false;
  for (std::string line; std::getline(in, line);) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;  // the two header lines
    std::string name = line.substr(0, colon);
    name.erase(0, name.find_first_not_of(' '));
    std::istringstream numbers(line.substr(colon + 1));
    std::uint64_t v[9] = {};
    int n = 0;
    while (n < 9 && numbers >> v[n]) ++n;
    if (n < 9) continue;
    any = true;
    if (name == "lo") continue;
    total.read += v[0];
    total.write += v[8];
  }
  if (!any) return std::nullopt;
  return total;
}

// /proc/self/io: bytes this process caused to be read from or written to storage.
inline std::optional<ByteCounters> parse_process_io(std::string_view text) {
  ByteCounters c;
  int found = 0;
  for_each_proc_number(text, [&](std::string_view key, std::uint64_t value) {
    if (key == "read_bytes:") c.read = value, ++found;
    else if (key == "write_bytes:") c.write = value, ++found;
  });
  if (found < 2) return std::nullopt;
  return c;
}

// /proc/diskstats: bytes read and written on the devices `counted` accepts (whole physical disks:
// partitions, loop and device-mapper devices would count the same bytes twice). Sectors are
// 512 bytes in this file whatever the device's sector size.
inline std::optional<ByteCounters> parse_diskstats(
    std::string_view text, const std::function<bool(const std::string&)>& counted) {
  std::istringstream in{std::string(text)};
  ByteCounters c;
  bool any = false;
  for (std::string line; std::getline(in, line);) {
    std::istringstream words(line);
    std::uint64_t major = 0, minor = 0;
    std::string name;
    std::uint64_t v[7] = {};
    if (!(words >> major >> minor >> name)) continue;
    int n = 0;
    while (n < 7 && words >> v[n]) ++n;
    if (n < 7) continue;
    any = true;
    if (!counted(name)) continue;
    c.read += v[2] * 512;   // sectors read
    c.write += v[6] * 512;  // sectors written
  }
  if (!any) return std::nullopt;
  return c;
}

inline bool is_physical_disk(const std::string& name) {
  std::string sys = name;
  for (char& ch : sys)
    if (ch == '/') ch = '!';
  return access(("/sys/block/" + sys + "/device").c_str(), F_OK) == 0;
}

// One reading of everything above.
struct ProcSnapshot {
  std::optional<ProcessStat> process;
  std::optional<SystemCpu> system;
  std::optional<ProcessStatus> status;
  std::optional<ByteCounters> network;
  std::optional<ByteCounters> process_io;
  std::optional<ByteCounters> disk;
};

inline ProcSnapshot read_proc_snapshot() {
  ProcSnapshot s;
  if (auto t = read_small_file("/proc/self/stat")) s.process = parse_process_stat(*t);
  if (auto t = read_small_file("/proc/stat")) s.system = parse_system_stat(*t);
  if (auto t = read_small_file("/proc/self/status")) s.status = parse_process_status(*t);
  if (auto t = read_small_file("/proc/net/dev")) s.network = parse_net_dev(*t);
  if (auto t = read_small_file("/proc/self/io")) s.process_io = parse_process_io(*t);
  if (auto t = read_small_file("/proc/diskstats")) s.disk = parse_diskstats(*t, is_physical_disk);
  return s;
}

inline long clock_ticks_per_second() {
  const long t = sysconf(_SC_CLK_TCK);
  return t > 0 ? t : 100;
}

// /proc/uptime: seconds since boot, its first number.
inline std::optional<double> parse_uptime(std::string_view text) {
  std::istringstream in{std::string(text)};
  double seconds = 0;
  if (!(in >> seconds) || seconds < 0) return std::nullopt;
  return seconds;
}

// How long this process has run, to the clock tick: the time since boot minus the process's
// start time since boot.
inline std::optional<double> process_uptime_seconds() {
  const auto stat = read_small_file("/proc/self/stat");
  const auto uptime = read_small_file("/proc/uptime");
  if (!stat || !uptime) return std::nullopt;
  const auto process = parse_process_stat(*stat);
  const auto since_boot = parse_uptime(*uptime);
  if (!process || !process->start_ticks || !since_boot) return std::nullopt;
  const double started =
      static_cast<double>(*process->start_ticks) / static_cast<double>(clock_ticks_per_second());
  return std::max(0.0, *since_boot - started);
}

}  // namespace dtrain::detail
