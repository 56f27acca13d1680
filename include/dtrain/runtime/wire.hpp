#pragma once
// A tiny binary encoding for the engine's control messages. Both ends run the same binary layout
// on the same architecture family (MPI jobs are homogeneous), so values are copied as bytes.
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "dtrain/core/error.hpp"

namespace dtrain::detail {

class WireWriter {
 public:
  explicit WireWriter(std::vector<char>& out) : out_(out) {}
  template <class T>
    requires std::is_trivially_copyable_v<T>
  void put(const T& v) {
    const auto* p = reinterpret_cast<const char*>(&v);
    out_.insert(out_.end(), p, p + sizeof(T));
  }
  void put(const std::string& s) {
    put(static_cast<std::uint32_t>(s.size()));
    out_.insert(out_.end(), s.begin(), s.end());
  }
  template <class T>
  void put(const std::vector<T>& v) {
    put(static_cast<std::uint32_t>(v.size()));
    for (const auto& x : v) put(x);
  }

 private:
  std::vector<char>& out_;
};

class WireReader {
 public:
  WireReader(const char* data, std::size_t size) : p_(data), end_(data + size) {}
  template <class T>
    requires std::is_trivially_copyable_v<T>
  void get(T& v) {
    need(sizeof(T));
    std::memcpy(&v, p_, sizeof(T));
    p_ += sizeof(T);
  }
  void get(std::string& s) {
    std::uint32_t n = 0;
    get(n);
    need(n);
    s.assign(p_, n);
    p_ += n;
  }
  template <class T>
  void get(std::vector<T>& v) {
    std::uint32_t n = 0;
    get(n);
    v.resize(n);
    for (auto& x : v) get(x);
  }
  bool done() const noexcept { return p_ == end_; }

 private:
  void need(std::size_t n) const {
    if (static_cast<std::size_t>(end_ - p_) < n)
      throw Error("dtrain: internal error: truncated control message (ranks running different "
                  "dtrain versions?)");
  }
  const char* p_;
  const char* end_;
};

}  // namespace dtrain::detail
