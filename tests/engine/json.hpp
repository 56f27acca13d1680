#pragma once
// A strict JSON reader (RFC 8259) for checking the timeline: anything a conforming parser such as
// Perfetto's would reject (trailing commas, NaN, unescaped control characters, a missing closing
// bracket) throws with the offset of the problem.
#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dtrain::test {

struct Json {
  enum class Kind { null, boolean, number, string, array, object };
  Kind kind = Kind::null;
  bool boolean = false;
  double number = 0;
  std::string string;
  std::vector<Json> array;
  std::vector<std::pair<std::string, Json>> object;

  const Json* find(std::string_view key) const {
    for (const auto& [k, v] : object)
      if (k == key) return &v;
    return nullptr;
  }
  std::string str(std::string_view key) const {
    const Json* v = find(key);
    return v && v->kind == Kind::string ? v->string : std::string();
  }
  double num(std::string_view key, double fallback = -1) const {
    const Json* v = find(key);
    return v && v->kind == Kind::number ? v->number : fallback;
  }
};

class JsonReader {
 public:
  static Json parse(std::string_view text) {
    JsonReader r(text);
    r.skip_ws();
    Json v = r.value(0);
    r.skip_ws();
    if (r.pos_ != text.size()) r.fail("text after the top-level value");
    return v;
  }

 private:
  explicit JsonReader(std::string_view t) : t_(t) {}

  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error("invalid JSON at byte " + std::to_string(pos_) + ": " + what);
  }
  bool at_end() const { return pos_ >= t_.size(); }
  char peek() const { return at_end() ? '\0' : t_[pos_]; }
  void expect(char c) {
    if (peek() != c) fail(std::string("expected '") + c + "'");
    ++pos_;
  }
  void skip_ws() {
    while (!at_end() && (t_[pos_] == ' ' || t_[pos_] == '\n' || t_[pos_] == '\r' || t_[pos_] == '\t'))
      ++pos_;
  }
  void literal(std::string_view word) {
    if (t_.substr(pos_, word.size()) != word) fail("unexpected token");
    pos_ += word.size();
  }

  Json value(int depth) {
    if (depth > 64) fail("nesting too deep");
    Json v;
    switch (peek()) {
      case '{': v.kind = Json::Kind::object; object(v, depth); break;
      case '[': v.kind = Json::Kind::array; array(v, depth); break;
      case '"': v.kind = Json::Kind::string; v.string = string(); break;
      case 't': literal("true"); v.kind = Json::Kind::boolean; v.boolean = true; break;
      case 'f': literal("false"); v.kind = Json::Kind::boolean; break;
      case 'n': literal("null"); break;
      default: v.kind = Json::Kind::number; v.number = number(); break;
    }
    return v;
  }

  void object(Json& v, int depth) {
    expect('{');
    skip_ws();
    if (peek() == '}') {
      ++pos_;
      return;
    }
    while (true) {
      skip_ws();
      if (peek() != '"') fail("expected a string key");
      std::string key = string();
      skip_ws();
      expect(':');
      skip_ws();
      v.object.emplace_back(std::move(key), value(depth + 1));
      skip_ws();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      expect('}');
      return;
    }
  }

  void array(Json& v, int depth) {
    expect('[');
    skip_ws();
    if (peek() == ']') {
      ++pos_;
      return;
    }
    while (true) {
      skip_ws();
      v.array.push_back(value(depth + 1));
      skip_ws();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      expect(']');
      return;
    }
  }

  std::string string() {
    expect('"');
    std::string out;
    while (true) {
      if (at_end()) fail("unterminated string");
      const char c = t_[pos_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("unescaped control character in a string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (at_end()) fail("unterminated escape");
      const char e = t_[pos_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          unsigned code = 0;
          for (int i = 0; i < 4; ++i) {
            if (at_end() || !std::isxdigit(static_cast<unsigned char>(t_[pos_]))) fail("bad \\u escape");
            code = code * 16 + static_cast<unsigned>(std::stoi(std::string(1, t_[pos_++]), nullptr, 16));
          }
          if (code < 0x80) {
            out += static_cast<char>(code);
          } else if (code < 0x800) {
            out += static_cast<char>(0xC0 | (code >> 6));
            out += static_cast<char>(0x80 | (code & 0x3F));
          } else {
            out += static_cast<char>(0xE0 | (code >> 12));
            out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
            out += static_cast<char>(0x80 | (code & 0x3F));
          }
          break;
        }
        default: fail("bad escape");
      }
    }
  }

  double number() {
    const std::size_t start = pos_;
    auto digits = [&] {
      const std::size_t from = pos_;
      while (!at_end() && std::isdigit(static_cast<unsigned char>(t_[pos_]))) ++pos_;
      if (pos_ == from) fail("expected a digit");
    };
    if (peek() == '-') ++pos_;
    if (peek() == '0') {
      ++pos_;
    } else {
      digits();
    }
    if (peek() == '.') {
      ++pos_;
      digits();
    }
    if (peek() == 'e' || peek() == 'E') {
      ++pos_;
      if (peek() == '+' || peek() == '-') ++pos_;
      digits();
    }
    return std::strtod(std::string(t_.substr(start, pos_ - start)).c_str(), nullptr);
  }

  std::string_view t_;
  std::size_t pos_ = 0;
};

}  // namespace dtrain::test
