#pragma once
// What the example trainers add to CLI11 for their command lines: the help's layout, number
// validators whose errors say what a flag accepts, enum flags that take their names only, and the
// exit status of a command line that was refused.

#include <CLI/CLI.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <iostream>
#include <memory>
#include <string>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

namespace examples {

// CLI11's help with each option's default at the end of its description, "(default: 3)", rather
// than glued to what it accepts ("INT:>= 1=3"), and with the options it needs.
class HelpFormatter : public CLI::Formatter {
 public:
  HelpFormatter() { column_width(34); }

  std::string make_option_opts(const CLI::Option* option) const override {
    return option->get_type_size() != 0 ? " " + option->get_type_name() : "";
  }

  std::string make_option_desc(const CLI::Option* option) const override {
    std::string text = option->get_description();
    if (option->get_type_size() != 0 && !option->get_default_str().empty())
      text += " (default: " + option->get_default_str() + ")";
    for (const CLI::Option* needed : option->get_needs()) text += "; needs " + needed->get_name();
    return text;
  }
};

// What every trainer's command line starts with: its description, the help's layout, and every
// option's default (the value of its field before parsing) captured for the help.
inline void describe_program(CLI::App& app, const std::string& description) {
  app.description(description);
  app.formatter(std::make_shared<HelpFormatter>());
  // A flag given twice takes its last value, so that a script can override flags it was handed.
  app.option_defaults()->always_capture_default()->multi_option_policy(
      CLI::MultiOptionPolicy::TakeLast);
}

// A number of type T that `accept`s, `accepted` saying which (">= 1", "in [0, 1)"); shown in the
// help after the type, and in the error: "--epochs: must be an integer >= 1, got '0'". CLI11's own
// Range and PositiveNumber write an open bound as the type's largest value, call "two" out of
// range, let "nan" through, and their unsigned conversion turns "-1" into 2^64 - 1.
template <class T, class Accept>
CLI::Validator number(const std::string& accepted, Accept accept) {
  const std::string kind = std::is_integral_v<T> ? "an integer " : "a number ";
  return CLI::Validator(
      [kind, accepted, accept](std::string& text) -> std::string {
        T value{};
        const char* end = text.data() + text.size();
        const auto [stop, error] = std::from_chars(text.data(), end, value);
        bool ok = error == std::errc() && stop == end && !text.empty();
        if constexpr (std::is_floating_point_v<T>) ok = ok && std::isfinite(value);
        if (ok && accept(value)) return {};
        return "must be " + kind + accepted + ", got '" + text + "'";
      },
      accepted);
}

// An integer of type T from `minimum` up.
template <class T>
CLI::Validator at_least(T minimum) {
  static_assert(std::is_integral_v<T>);
  return number<T>(">= " + std::to_string(minimum), [minimum](T v) { return v >= minimum; });
}

inline CLI::Validator positive() {
  return number<double>("> 0", [](double v) { return v > 0; });
}

inline CLI::Validator non_negative() {
  return number<double>(">= 0", [](double v) { return v >= 0; });
}

// [0, 1): a momentum, say.
inline CLI::Validator fraction() {
  return number<double>("in [0, 1)", [](double v) { return v >= 0 && v < 1; });
}

// An enum flag: `--flag NAME` for the names in `names`, stored as the value each stands for
// (CLI11's CheckedTransformer maps them). Only the names pass, and a wrong one is told them:
// "--norm: layer not in {batch,group}". The help shows the current value's name as the default.
template <class Enum>
CLI::Option* add_enum_option(CLI::App& app, const std::string& flag, Enum& value,
                             const std::vector<std::pair<std::string, Enum>>& names,
                             const std::string& help) {
  std::vector<std::string> accepted;
  std::string default_name;
  for (const auto& [name, each] : names) {
    accepted.push_back(name);
    if (each == value) default_name = name;
  }
  // transform() puts a validator in front of the others: the name check runs first, then the
  // mapping, which would otherwise also accept the values' numbers.
  return app.add_option(flag, value, help)
      ->transform(CLI::CheckedTransformer(names).description(""))
      ->transform(CLI::IsMember(accepted))
      ->default_str(default_name);
}

// Parses `args` (the flags, without the program's name) into what `app` declares, as the tests of
// the trainers' command lines do; throws CLI::ParseError.
inline void parse_arguments(CLI::App& app, std::vector<std::string> args) {
  std::reverse(args.begin(), args.end());  // CLI11 takes them last first
  app.parse(args);
}

// How main() ends after a command line that CLI11 (or a check of the trainer's own, throwing
// CLI::ValidationError) refused: --help prints the help and exits with 0, anything else prints
// the message and exits with 2. Every rank parses the same flags and gets here; only those with
// `print` (rank 0) print.
inline int refused_command_line(const CLI::App& app, const CLI::ParseError& error, bool print) {
  if (error.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) {
    if (print) std::cout << app.help();
    return 0;
  }
  if (print) {
    std::cerr << app.get_name() << ": " << error.what() << "\n"
              << "Run with --help for the flags and what they accept.\n";
  }
  return 2;
}

}  // namespace examples
