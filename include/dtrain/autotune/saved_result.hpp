#pragma once
// A tuning result saved for the next run of the same job (DTRAIN_AUTOTUNE_CACHE=path), so the
// search is paid once. Rank 0 reads and writes it; the engine broadcasts what rank 0 decided.
//
// Note [Saved result key]
// A result is reused only by a job that would tune the same thing: the same world size, the same
// number of ranks on each host, the same tensors (names, dtypes and element counts, hashed), and
// the same search space (which knobs are tuned, their ranges, the fixed knobs' values: a cycle
// time tuned for a 64 MiB threshold says little about a 1 GiB one). Host names are not part of
// the key: schedulers hand out different nodes of one cluster from run to run, and the result
// stays right for them. Moving a job to another cluster with the same layout is the one change
// the key cannot see; point DTRAIN_AUTOTUNE_CACHE at a file per cluster.
//
// Note [Saved result file]
// Plain text, one `key value` per line, in a fixed order, ending with a checksum line: CRC-32C
// over every byte before it, the checksum checkpoints use (core/crc32c.hpp). Anything unexpected (missing or unknown keys, a bad
// number, a checksum mismatch, a file over 64 KiB) makes the file corrupt; a different format
// version or key makes it stale. Either way the job warns, tunes afresh and replaces the file
// when it is done; no content of the file can crash or hang the job. The file is written as
// checkpoints are (Note [Atomic checkpoint files] in core/atomic_file.hpp), so a reader, or a run
// after a power loss, never sees half of it.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include "dtrain/autotune/knobs.hpp"
#include "dtrain/autotune/search_space.hpp"
#include "dtrain/core/atomic_file.hpp"
#include "dtrain/core/crc32c.hpp"
#include "dtrain/core/fnv1a.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/logging.hpp"
#include "dtrain/tensor/dtype.hpp"

namespace dtrain::autotune {

// 3: the pieces-in-flight knob; 2: CRC-32C checksum; 1: FNV-1a.
inline constexpr int saved_result_format = 3;
inline constexpr std::size_t saved_result_max_bytes = 64 * 1024;

using dtrain::detail::fnv1a;

struct TensorSignature {
  std::string name;
  DataType dtype = DataType::float32;
  std::int64_t elements = 0;
};

// Independent of the order the tensors are listed in.
inline std::uint64_t tensor_set_hash(std::vector<TensorSignature> tensors) {
  std::sort(tensors.begin(), tensors.end(), [](const TensorSignature& a, const TensorSignature& b) {
    if (a.name != b.name) return a.name < b.name;
    if (a.dtype != b.dtype) return a.dtype < b.dtype;
    return a.elements < b.elements;
  });
  std::uint64_t h = fnv1a("tensor-set");
  for (const auto& t : tensors) {
    h = fnv1a(fmt::format("{}\n{}\n{}\n", t.name, t.dtype, t.elements), h);
  }
  return h;
}

struct JobIdentity {
  int world_size = 1;
  std::vector<int> ranks_per_host;  // in any order; compared sorted
  std::uint64_t tensor_set = 0;     // tensor_set_hash()
};

struct SavedResult {
  Knobs knobs;
  double score_bytes_per_second = 0.0;
};

enum class SavedResultStatus { loaded, missing, unreadable, corrupt, stale };

constexpr std::string_view to_string(SavedResultStatus s) noexcept {
  switch (s) {
    case SavedResultStatus::loaded: return "loaded";
    case SavedResultStatus::missing: return "missing";
    case SavedResultStatus::unreadable: return "unreadable";
    case SavedResultStatus::corrupt: return "corrupt";
    case SavedResultStatus::stale: return "stale";
  }
  return "unknown";
}

struct SavedResultLoad {
  SavedResultStatus status = SavedResultStatus::missing;
  std::optional<SavedResult> result;  // set only when loaded
  std::string reason;                 // what was wrong, for the warning
};

namespace detail {

inline std::string hosts_text(std::vector<int> ranks_per_host) {
  std::sort(ranks_per_host.begin(), ranks_per_host.end());
  std::string s;
  for (int n : ranks_per_host) s += (s.empty() ? "" : ",") + std::to_string(n);
  return s.empty() ? "none" : s;
}

template <class T>
std::optional<T> parse_number(std::string_view text) {
  T value{};
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || ptr != end || text.empty()) return std::nullopt;
  return value;
}

// Exactly `digits` lower-case hex digits, as written: 'A' and 'a' must not both read as 10, or a
// changed byte in the checksum line would go unnoticed.
inline std::optional<std::uint64_t> parse_hex(std::string_view text, std::size_t digits) {
  if (text.size() != digits) return std::nullopt;
  for (char c : text) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return std::nullopt;
  }
  std::uint64_t value = 0;
  const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value, 16);
  if (ec != std::errc() || ptr != text.data() + text.size()) return std::nullopt;
  return value;
}

inline std::optional<bool> parse_bit(std::string_view text) {
  if (text == "0") return false;
  if (text == "1") return true;
  return std::nullopt;
}

// The file's keys in order: the job's, one per knob (Note [Tunable knobs] names them), the score.
inline constexpr std::string_view saved_result_job_keys[] = {"format", "world_size",
                                                             "ranks_per_host", "tensor_set",
                                                             "search_space"};
inline std::vector<std::string_view> saved_result_keys() {
  std::vector<std::string_view> keys(std::begin(saved_result_job_keys),
                                     std::end(saved_result_job_keys));
  for (Knob knob : all_knobs) keys.push_back(to_string(knob));
  keys.push_back("score_bytes_per_second");
  return keys;
}

// Reads one knob's value as knob_value_text() writes it; false when it is not one.
inline bool parse_knob_value(std::string_view text, Knob knob, Knobs& out) {
  bool ok = false;
  with_tunable(knob, [&](std::string_view, auto member, auto) {
    using Value = std::remove_cvref_t<decltype(out.*member)>;
    if constexpr (std::is_same_v<Value, bool>) {
      if (auto bit = parse_bit(text)) out.*member = *bit, ok = true;
    } else if (auto number = parse_number<Value>(text)) {
      if constexpr (std::is_floating_point_v<Value>) ok = std::isfinite(*number);
      else ok = true;
      out.*member = *number;
    }
  });
  return ok;
}

}  // namespace detail

inline std::string saved_result_text(const JobIdentity& job, const SearchSpace& space,
                                     const SavedResult& result) {
  std::string body =
      "# dtrain autotune result (docs/autotune.md); delete this file to tune again\n";
  body += fmt::format("format {}\n", saved_result_format);
  body += fmt::format("world_size {}\n", job.world_size);
  body += fmt::format("ranks_per_host {}\n", detail::hosts_text(job.ranks_per_host));
  body += fmt::format("tensor_set {:016x}\n", job.tensor_set);
  body += fmt::format("search_space {}\n", space.description());
  for (Knob knob : all_knobs) {
    body += fmt::format("{} {}\n", to_string(knob), knob_value_text(result.knobs, knob));
  }
  body += fmt::format("score_bytes_per_second {}\n", result.score_bytes_per_second);
  body += fmt::format("checksum {:08x}\n", dtrain::detail::crc32c(body.data(), body.size()));
  return body;
}

// Checks `text` against the file format and the current job. Never throws for any content.
inline SavedResultLoad parse_saved_result(std::string_view text, const JobIdentity& job,
                                          const SearchSpace& space) {
  auto corrupt = [](std::string reason) {
    return SavedResultLoad{SavedResultStatus::corrupt, std::nullopt, std::move(reason)};
  };
  if (text.size() > saved_result_max_bytes) {
    return corrupt(fmt::format("it is {} bytes, more than a saved result can be", text.size()));
  }
  // The checksum line is the last line and covers everything before it.
  if (text.empty() || text.back() != '\n') return corrupt("it does not end with a checksum line");
  const std::size_t last = text.rfind('\n', text.size() - 2);
  const std::size_t checksum_at = last == std::string_view::npos ? 0 : last + 1;
  const std::string_view checksum_line = text.substr(checksum_at, text.size() - 1 - checksum_at);
  const std::string_view body = text.substr(0, checksum_at);
  if (checksum_line.substr(0, 9) != "checksum ") {
    return corrupt("it does not end with a checksum line");
  }
  const auto checksum = detail::parse_hex(checksum_line.substr(9), 8);
  if (!checksum || *checksum != dtrain::detail::crc32c(body.data(), body.size())) {
    return corrupt("its checksum does not match its contents (truncated or edited)");
  }

  // Lines in the order they are written; '#' lines are comments.
  std::vector<std::pair<std::string_view, std::string_view>> fields;
  std::size_t pos = 0;
  while (pos < body.size()) {
    const std::size_t end = body.find('\n', pos);
    const std::string_view line = body.substr(pos, end - pos);
    pos = end + 1;
    if (line.empty() || line.front() == '#') continue;
    const std::size_t space_at = line.find(' ');
    if (space_at == std::string_view::npos) {
      return corrupt(fmt::format("line '{}' is not 'key value'", line));
    }
    fields.emplace_back(line.substr(0, space_at), line.substr(space_at + 1));
  }
  const std::vector<std::string_view> keys = detail::saved_result_keys();
  if (fields.empty() || fields.front().first != "format") return corrupt("it has no format line");
  const auto format = detail::parse_number<int>(fields.front().second);
  if (!format) return corrupt(fmt::format("format '{}' is not a number", fields.front().second));
  if (*format != saved_result_format) {
    return SavedResultLoad{SavedResultStatus::stale, std::nullopt,
                           fmt::format("it has format {}, this version of dtrain reads format {}",
                                       *format, saved_result_format)};
  }
  if (fields.size() != keys.size()) {
    return corrupt(fmt::format("it has {} fields, expected {}", fields.size(), keys.size()));
  }
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (fields[i].first != keys[i]) {
      return corrupt(fmt::format("field {} is '{}', expected '{}'", i + 1, fields[i].first,
                                 keys[i]));
    }
  }
  auto value = [&](std::size_t i) { return fields[i].second; };

  const auto world_size = detail::parse_number<int>(value(1));
  const auto tensor_set = detail::parse_hex(value(3), 16);
  Knobs knobs;
  bool knobs_ok = true;
  std::size_t at = std::size(detail::saved_result_job_keys);
  for (Knob knob : all_knobs) {
    knobs_ok = detail::parse_knob_value(value(at++), knob, knobs) && knobs_ok;
  }
  const auto score = detail::parse_number<double>(value(at));
  if (!world_size || !tensor_set || !knobs_ok || !score || !std::isfinite(*score)) {
    return corrupt("a value is not a number of the expected kind");
  }

  std::vector<std::string> differences;
  if (*world_size != job.world_size) {
    differences.push_back(fmt::format("world size {} (now {})", *world_size, job.world_size));
  }
  const std::string hosts_now = detail::hosts_text(job.ranks_per_host);
  if (value(2) != hosts_now) {
    differences.push_back(fmt::format("ranks per host {} (now {})", value(2), hosts_now));
  }
  if (*tensor_set != job.tensor_set) {
    differences.push_back(fmt::format("tensor set {:016x} (now {:016x}: other tensor names, "
                                      "dtypes or sizes)",
                                      *tensor_set, job.tensor_set));
  }
  const std::string space_now = space.description();
  if (value(4) != space_now) {
    differences.push_back(fmt::format("search space '{}' (now '{}')", value(4), space_now));
  }
  if (!differences.empty()) {
    std::string reason = "it was tuned for ";
    for (std::size_t i = 0; i < differences.size(); ++i) {
      reason += (i == 0 ? "" : ", ") + differences[i];
    }
    return SavedResultLoad{SavedResultStatus::stale, std::nullopt, std::move(reason)};
  }

  if (!space.contains(knobs)) {
    return corrupt(fmt::format("its configuration ({}) lies outside the search space",
                               describe(knobs)));
  }
  return SavedResultLoad{SavedResultStatus::loaded, SavedResult{knobs, *score}, {}};
}

inline SavedResultLoad load_saved_result(const std::string& path, const JobIdentity& job,
                                         const SearchSpace& space) {
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) {
    const int err = errno;
    return SavedResultLoad{err == ENOENT ? SavedResultStatus::missing
                                         : SavedResultStatus::unreadable,
                           std::nullopt, std::strerror(err)};
  }
  std::string text;
  char buffer[4096];
  bool too_big = false;
  for (;;) {
    const std::size_t n = std::fread(buffer, 1, sizeof buffer, file);
    text.append(buffer, n);
    if (text.size() > saved_result_max_bytes) {
      too_big = true;
      break;
    }
    if (n < sizeof buffer) break;
  }
  const bool failed = std::ferror(file) != 0;
  const int err = errno;
  std::fclose(file);
  if (failed) {
    return SavedResultLoad{SavedResultStatus::unreadable, std::nullopt, std::strerror(err)};
  }
  if (too_big) {
    return SavedResultLoad{SavedResultStatus::corrupt, std::nullopt,
                           fmt::format("it is larger than {} bytes", saved_result_max_bytes)};
  }
  return parse_saved_result(text, job, space);
}

// The saved result to apply instead of tuning, or nullopt (then tune). Logs what happened: a
// missing file is the first run (info); an unreadable, corrupt or stale one is a warning.
inline std::optional<SavedResult> reuse_saved_result(const std::string& path,
                                                     const JobIdentity& job,
                                                     const SearchSpace& space) {
  SavedResultLoad load = load_saved_result(path, job, space);
  switch (load.status) {
    case SavedResultStatus::loaded:
      dtrain::detail::log(LogLevel::info, "autotune: reusing the saved result in '{}': {}", path,
                  describe(load.result->knobs));
      return load.result;
    case SavedResultStatus::missing:
      dtrain::detail::log(LogLevel::info,
                  "autotune: no saved result at '{}' (DTRAIN_AUTOTUNE_CACHE) yet; tuning, then "
                  "saving the result there",
                  path);
      return std::nullopt;
    case SavedResultStatus::unreadable:
      dtrain::detail::log(LogLevel::warning,
                  "autotune: cannot read the saved result '{}' (DTRAIN_AUTOTUNE_CACHE): {}; "
                  "tuning from scratch",
                  path, load.reason);
      return std::nullopt;
    case SavedResultStatus::corrupt:
    case SavedResultStatus::stale:
      dtrain::detail::log(LogLevel::warning,
                  "autotune: ignoring the saved result '{}' (DTRAIN_AUTOTUNE_CACHE): {}; tuning "
                  "from scratch and replacing it when done",
                  path, load.reason);
      return std::nullopt;
  }
  return std::nullopt;
}

// Writes atomically (Note [Atomic checkpoint files]). A failure is a warning and returns false:
// losing the saved result costs the next run a tuning, nothing more.
inline bool save_result(const std::string& path, const JobIdentity& job, const SearchSpace& space,
                        const SavedResult& result) {
  const std::string text = saved_result_text(job, space, result);
  try {
    dtrain::detail::AtomicFileWriter file(path);
    file.write(text.data(), text.size());
    file.commit();
    return true;
  } catch (const Error& e) {
    dtrain::detail::log(LogLevel::warning,
                        "autotune: cannot save the result to '{}' (DTRAIN_AUTOTUNE_CACHE): {}; "
                        "the next run will tune again",
                        path, e.what());
    return false;
  }
}

}  // namespace dtrain::autotune
