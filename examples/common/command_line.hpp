#pragma once
// The command line of the example trainers: `--flag value`, `--flag=value` and switches without a
// value, each value checked by the setter of its flag, every error naming the flag. Free of
// libtorch and dtrain, so parsing is cheap to test.

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

namespace examples {

// A flag the trainer does not accept, or a value it cannot use. The trainer prints the message and
// the usage text and exits with status 2.
class UsageError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

template <class T>
T parse_number(const std::string& flag, const std::string& text) {
  T value{};
  const auto* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || ptr != end || text.empty()) {
    throw UsageError("--" + flag + ": '" + text + "' is not a valid " +
                     (std::is_floating_point_v<T> ? "number" : "integer"));
  }
  if constexpr (std::is_floating_point_v<T>) {
    if (!std::isfinite(value)) throw UsageError("--" + flag + ": '" + text + "' is not finite");
  }
  return value;
}

inline void require(bool ok, const std::string& flag, const std::string& what,
                    const std::string& text) {
  if (!ok) throw UsageError("--" + flag + " must be " + what + ", got " + text);
}

// Reads the value of one flag into the options.
using Setter = std::function<void(const std::string& flag, const std::string& value)>;

inline Setter integer(std::int64_t& field, std::int64_t minimum) {
  return [&field, minimum](const std::string& flag, const std::string& value) {
    field = parse_number<std::int64_t>(flag, value);
    require(field >= minimum, flag, ">= " + std::to_string(minimum), value);
  };
}

// A number in [minimum, below); `accepted` says so in the error.
inline Setter real(double& field, double minimum, double below, std::string accepted) {
  return [&field, minimum, below, accepted](const std::string& flag, const std::string& value) {
    field = parse_number<double>(flag, value);
    require(field >= minimum && field < below, flag, accepted, value);
  };
}

inline Setter positive(double& field) {
  return [&field](const std::string& flag, const std::string& value) {
    field = parse_number<double>(flag, value);
    require(field > 0, flag, "positive", value);
  };
}

inline Setter text(std::string& field) {
  return [&field](const std::string& flag, const std::string& value) {
    require(!value.empty(), flag, "non-empty", "''");
    field = value;
  };
}

inline Setter one_of(std::string& field, std::vector<std::string> accepted) {
  return [&field, accepted](const std::string& flag, const std::string& value) {
    std::string list;
    for (const auto& a : accepted) list += (list.empty() ? "" : ", ") + a;
    require(std::find(accepted.begin(), accepted.end(), value) != accepted.end(), flag,
            "one of " + list, value);
    field = value;
  };
}

// Applies `args` (without the program name): a flag in `switches` sets its bool, one in
// `with_value` hands its value to the setter. Returns the flags given.
inline std::set<std::string> parse_flags(const std::vector<std::string>& args,
                                         const std::map<std::string, Setter>& with_value,
                                         const std::map<std::string, bool*>& switches) {
  std::set<std::string> given;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg.rfind("--", 0) != 0 || arg.size() == 2) {
      throw UsageError("unexpected argument '" + arg + "'; options start with --");
    }
    std::string flag = arg.substr(2);
    std::string value;
    bool has_value = false;
    if (const auto eq = flag.find('='); eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag.resize(eq);
      has_value = true;
    }
    if (const auto it = switches.find(flag); it != switches.end()) {
      if (has_value) throw UsageError("--" + flag + " takes no value");
      *it->second = true;
    } else if (const auto setter = with_value.find(flag); setter != with_value.end()) {
      if (!has_value) {
        if (i + 1 >= args.size()) throw UsageError("--" + flag + " needs a value");
        value = args[++i];
      }
      setter->second(flag, value);
    } else {
      throw UsageError("unknown option '--" + flag + "'");
    }
    given.insert(flag);
  }
  return given;
}

// argv without the program name.
inline std::vector<std::string> arguments(int argc, const char* const* argv) {
  return std::vector<std::string>(argv + (argc > 0 ? 1 : 0), argv + argc);
}

}  // namespace examples
