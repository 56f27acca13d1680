#pragma once
// The one JSON writer, for profile records and timeline events: a one-line object builder with
// strings escaped per RFC 8259, numbers in their shortest round-trip form (or with a fixed number
// of decimals where the size of a long file matters), non-finite numbers written as null (JSON
// has no NaN).
#include <cmath>
#include <cstdint>
#include <iterator>
#include <string>
#include <string_view>
#include <type_traits>

#include <fmt/format.h>

namespace dtrain::detail {

class JsonObject {
 public:
  JsonObject() { text_ = "{"; }

  JsonObject& field(std::string_view key, std::string_view value) {
    write_key(key);
    write_string(value);
    return *this;
  }
  JsonObject& field(std::string_view key, const char* value) {
    return field(key, std::string_view(value));
  }
  JsonObject& field(std::string_view key, const std::string& value) {
    return field(key, std::string_view(value));
  }
  JsonObject& field(std::string_view key, bool value) {
    write_key(key);
    text_ += value ? "true" : "false";
    return *this;
  }
  JsonObject& field(std::string_view key, double value) {
    write_key(key);
    if (std::isfinite(value)) fmt::format_to(std::back_inserter(text_), "{}", value);
    else text_ += "null";
    return *this;
  }
  template <class Int>
    requires(std::is_integral_v<Int> && !std::is_same_v<Int, bool>)
  JsonObject& field(std::string_view key, Int value) {
    write_key(key);
    fmt::format_to(std::back_inserter(text_), "{}", value);
    return *this;
  }
  // `value` with `decimals` digits after the point: timeline timestamps, where the shortest
  // round-trip form of a computed double would often take twice the bytes.
  JsonObject& fixed(std::string_view key, double value, int decimals) {
    write_key(key);
    if (std::isfinite(value)) fmt::format_to(std::back_inserter(text_), "{:.{}f}", value, decimals);
    else text_ += "null";
    return *this;
  }
  // A nested object, e.g. the phases of a step.
  JsonObject& field(std::string_view key, const JsonObject& object) {
    write_key(key);
    text_ += object.closed();
    return *this;
  }

  // An array of strings, e.g. the names of the engine counters.
  template <class Range>
  JsonObject& string_array(std::string_view key, const Range& values) {
    write_key(key);
    text_ += '[';
    bool first = true;
    for (const auto& v : values) {
      if (!first) text_ += ',';
      first = false;
      write_string(v);
    }
    text_ += ']';
    return *this;
  }

  // The finished object, without a newline.
  std::string closed() const { return text_ + "}"; }

  static void escape_into(std::string& out, std::string_view s) {
    for (char c : s) {
      const auto u = static_cast<unsigned char>(c);
      switch (c) {
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        case '\n': out += "\\n"; break;
        case '\r': out += "\\r"; break;
        case '\t': out += "\\t"; break;
        default:
          if (u < 0x20) fmt::format_to(std::back_inserter(out), "\\u{:04x}", static_cast<int>(u));
          else out += c;
      }
    }
  }

 private:
  void write_key(std::string_view key) {
    if (text_.size() > 1) text_ += ',';
    write_string(key);
    text_ += ':';
  }
  void write_string(std::string_view s) {
    text_ += '"';
    escape_into(text_, s);
    text_ += '"';
  }

  std::string text_;
};

}  // namespace dtrain::detail
