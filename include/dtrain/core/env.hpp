#pragma once
// Reading settings from environment variables: where they come from (the process, or a map in
// tests), the DTRAIN_/HOROVOD_ alias rule, and strict parsers for their values.
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

namespace dtrain::detail {

// Where settings are read from. Config parsing takes one of these so tests can hand it variables
// without touching the process environment that other code reads concurrently.
class EnvSource {
 public:
  virtual ~EnvSource() = default;
  virtual std::optional<std::string> get(const std::string& name) const = 0;
  // Every variable name, so misspelled settings can be found.
  virtual std::vector<std::string> names() const = 0;
};

class ProcessEnv final : public EnvSource {
 public:
  std::optional<std::string> get(const std::string& name) const override {
    const char* value = std::getenv(name.c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  }

  std::vector<std::string> names() const override {
    std::vector<std::string> out;
    for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
      const std::string_view text(*entry);
      out.emplace_back(text.substr(0, text.find('=')));
    }
    return out;
  }
};

class MapEnv final : public EnvSource {
 public:
  MapEnv() = default;
  MapEnv(std::initializer_list<std::pair<const std::string, std::string>> vars) : vars_(vars) {}

  void set(std::string name, std::string value) { vars_[std::move(name)] = std::move(value); }

  std::optional<std::string> get(const std::string& name) const override {
    const auto it = vars_.find(name);
    if (it == vars_.end()) return std::nullopt;
    return it->second;
  }

  std::vector<std::string> names() const override {
    std::vector<std::string> out;
    for (const auto& [name, value] : vars_) out.push_back(name);
    return out;
  }

 private:
  std::map<std::string, std::string> vars_;
};

inline constexpr std::string_view env_prefix = "DTRAIN_";
inline constexpr std::string_view env_alias_prefix = "HOROVOD_";

// A value together with the variable it was read from, so errors name what the user actually set.
struct EnvSetting {
  std::string name;
  std::string value;
};

// Both spellings of one setting. DTRAIN_<suffix> wins over HOROVOD_<suffix>.
struct EnvLookup {
  std::optional<EnvSetting> chosen;
  std::optional<EnvSetting> ignored_alias;  // HOROVOD_ value set to something different
};

inline EnvLookup lookup_env(const EnvSource& env, std::string_view suffix) {
  std::string primary_name = std::string(env_prefix) + std::string(suffix);
  std::string alias_name = std::string(env_alias_prefix) + std::string(suffix);
  std::optional<std::string> primary = env.get(primary_name);
  std::optional<std::string> alias = env.get(alias_name);
  EnvLookup out;
  if (primary) {
    if (alias && *alias != *primary) out.ignored_alias = EnvSetting{alias_name, *alias};
    out.chosen = EnvSetting{std::move(primary_name), std::move(*primary)};
  } else if (alias) {
    out.chosen = EnvSetting{std::move(alias_name), std::move(*alias)};
  }
  return out;
}

inline char ascii_lower(char c) noexcept {
  return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
}

inline bool iequals(std::string_view a, std::string_view b) noexcept {
  return a.size() == b.size() &&
         std::equal(a.begin(), a.end(), b.begin(),
                    [](char x, char y) { return ascii_lower(x) == ascii_lower(y); });
}

inline constexpr std::string_view bool_choices = "1, 0, true, false, yes, no, on, off (any case)";

inline std::optional<bool> parse_bool_text(std::string_view text) noexcept {
  for (std::string_view yes : {"1", "true", "yes", "on"}) {
    if (iequals(text, yes)) return true;
  }
  for (std::string_view no : {"0", "false", "no", "off"}) {
    if (iequals(text, no)) return false;
  }
  return std::nullopt;
}

enum class ParseStatus { ok, not_a_number, out_of_range };

struct ParsedInt {
  ParseStatus status = ParseStatus::not_a_number;
  std::int64_t value = 0;
};

// Plain decimal with an optional binary suffix K, M or G (either case): "64M" is 64 * 2^20.
// No sign other than a leading '-', no whitespace, no other suffix: anything else is an error
// rather than a silently truncated number.
inline ParsedInt parse_int_text(std::string_view text) noexcept {
  ParsedInt out;
  const bool negative = !text.empty() && text.front() == '-';
  if (negative) text.remove_prefix(1);
  std::uint64_t multiplier = 1;
  if (!text.empty()) {
    switch (ascii_lower(text.back())) {
      case 'k': multiplier = std::uint64_t{1} << 10; break;
      case 'm': multiplier = std::uint64_t{1} << 20; break;
      case 'g': multiplier = std::uint64_t{1} << 30; break;
      default: break;
    }
    if (multiplier != 1) text.remove_suffix(1);
  }
  if (text.empty() || !std::all_of(text.begin(), text.end(),
                                   [](char c) { return c >= '0' && c <= '9'; })) {
    return out;
  }
  std::uint64_t magnitude = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), magnitude);
  out.status = ParseStatus::out_of_range;
  if (ec != std::errc() || end != text.data() + text.size()) return out;
  const std::uint64_t limit =
      static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) + (negative ? 1 : 0);
  if (magnitude > limit / multiplier) return out;
  magnitude *= multiplier;
  out.status = ParseStatus::ok;
  out.value = negative ? static_cast<std::int64_t>(0 - magnitude)
                       : static_cast<std::int64_t>(magnitude);
  return out;
}

// A count a launcher writes into a rank's environment (a world's generation, an attempt, a
// restart count): decimal digits only, no sign, suffix or space, at most 18 of them. dtrainrun
// writes these, so anything else is a mistake to report, not a setting to interpret.
inline std::optional<std::int64_t> parse_count_text(std::string_view text) noexcept {
  if (text.empty() || text.size() > 18 ||
      !std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return std::nullopt;
  std::int64_t value = 0;
  std::from_chars(text.data(), text.data() + text.size(), value);
  return value;
}

// The count `name` holds in `env`, into `value` (left alone when unset). Returns what is wrong,
// naming the variable and its value, or an empty string.
inline std::string read_env_count(const EnvSource& env, const std::string& name,
                                  std::int64_t& value) {
  const auto text = env.get(name);
  if (!text) return {};
  if (const auto count = parse_count_text(*text)) {
    value = *count;
    return {};
  }
  return name + "='" + *text + "' is not a non-negative decimal number";
}

struct ParsedFloat {
  ParseStatus status = ParseStatus::not_a_number;
  double value = 0;
};

// A finite decimal such as 1, 0.5, 2e-3. "inf", "nan", hex floats and trailing text are not
// accepted; from_chars is used because it ignores the C locale's decimal separator.
inline ParsedFloat parse_float_text(std::string_view text) noexcept {
  ParsedFloat out;
  if (text.empty()) return out;
  const bool digits_only = std::all_of(text.begin(), text.end(), [](char c) {
    return (c >= '0' && c <= '9') || c == '.' || c == '-' || c == 'e' || c == 'E' || c == '+';
  });
  if (!digits_only) return out;  // rejects inf, nan, hex before from_chars sees them
  double value = 0;
  const auto [end, ec] =
      std::from_chars(text.data(), text.data() + text.size(), value, std::chars_format::general);
  if (end != text.data() + text.size()) return out;
  if (ec == std::errc::result_out_of_range || !std::isfinite(value)) {
    out.status = ParseStatus::out_of_range;
    return out;
  }
  if (ec != std::errc()) return out;
  out.status = ParseStatus::ok;
  out.value = value == 0 ? 0.0 : value;  // "-0" is plain zero
  return out;
}

// Edit distance counting an insertion, deletion, substitution or swap of neighbours as one
// (optimal string alignment), ignoring case: the usual shapes of a typo.
inline std::size_t typo_distance(std::string_view a, std::string_view b) {
  const std::size_t n = a.size();
  const std::size_t m = b.size();
  std::vector<std::size_t> prev2(m + 1), prev(m + 1), cur(m + 1);
  for (std::size_t j = 0; j <= m; ++j) prev[j] = j;
  for (std::size_t i = 1; i <= n; ++i) {
    cur[0] = i;
    for (std::size_t j = 1; j <= m; ++j) {
      const bool same = ascii_lower(a[i - 1]) == ascii_lower(b[j - 1]);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (same ? 0 : 1)});
      if (i > 1 && j > 1 && ascii_lower(a[i - 1]) == ascii_lower(b[j - 2]) &&
          ascii_lower(a[i - 2]) == ascii_lower(b[j - 1])) {
        cur[j] = std::min(cur[j], prev2[j - 2] + 1);
      }
    }
    std::swap(prev2, prev);
    std::swap(prev, cur);
  }
  return prev[m];
}

// The candidate closest to `name`, when it is close enough to be a slip of the keyboard rather
// than an unrelated name; `prefix` (DTRAIN_ or HOROVOD_) does not count towards the tolerance.
inline std::optional<std::string> typo_of(const std::string& name, std::string_view prefix,
                                          const std::vector<std::string>& candidates) {
  const std::string* best = nullptr;
  std::size_t best_distance = std::numeric_limits<std::size_t>::max();
  for (const std::string& candidate : candidates) {
    const std::size_t d = typo_distance(name, candidate);
    if (d < best_distance) {
      best_distance = d;
      best = &candidate;
    }
  }
  const std::size_t own = name.size() > prefix.size() ? name.size() - prefix.size() : 0;
  const std::size_t tolerance = std::max<std::size_t>(2, own / 3);
  if (best == nullptr || best_distance > tolerance) return std::nullopt;
  return *best;
}

}  // namespace dtrain::detail
