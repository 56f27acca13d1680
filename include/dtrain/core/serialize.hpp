#pragma once
// dtrain's one serializer: broadcast_object / allgather_object, checkpoints, and the engine's own
// control messages.
//
// Note [Object serialization]
// Supported out of the box: trivially copyable types (copied as bytes: every rank runs the same
// binary on the same architecture), std::string, std::vector, std::map, std::unordered_map,
// std::pair, std::tuple and std::optional of supported types. Any other type opts in with two
// functions found by argument-dependent lookup:
//   void dtrain_serialize(dtrain::ObjectWriter&, const T&);
//   void dtrain_deserialize(dtrain::ObjectReader&, T&);
// that call write()/read() on the members; or, for a plain struct, with one static member
//   template <class Self> static auto tie_fields(Self& s) { return std::tie(s.a, s.b); }
// that names its fields once, for writing and reading alike.
#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "dtrain/core/error.hpp"

namespace dtrain {

class ObjectWriter;
class ObjectReader;

namespace detail {
template <class T>
concept HasUserSerialize = requires(ObjectWriter& w, ObjectReader& r, const T& c, T& m) {
  dtrain_serialize(w, c);
  dtrain_deserialize(r, m);
};
template <class T> struct is_vector : std::false_type {};
template <class T, class A> struct is_vector<std::vector<T, A>> : std::true_type {};
template <class T> struct is_map : std::false_type {};
template <class K, class V, class C, class A> struct is_map<std::map<K, V, C, A>> : std::true_type {};
template <class K, class V, class H, class E, class A>
struct is_map<std::unordered_map<K, V, H, E, A>> : std::true_type {};
template <class T> struct is_pair : std::false_type {};
template <class A, class B> struct is_pair<std::pair<A, B>> : std::true_type {};
template <class T> struct is_optional : std::false_type {};
template <class T> struct is_optional<std::optional<T>> : std::true_type {};
template <class T> struct is_tuple : std::false_type {};
template <class... Ts> struct is_tuple<std::tuple<Ts...>> : std::true_type {};
template <class T>
concept HasTiedFields = requires(T& m, const T& c) {
  T::tie_fields(m);
  T::tie_fields(c);
};
}  // namespace detail

template <class T>
concept Serializable =
    detail::HasUserSerialize<T> || std::is_trivially_copyable_v<T> ||
    std::is_same_v<T, std::string> || detail::is_vector<T>::value || detail::is_map<T>::value ||
    detail::is_pair<T>::value || detail::is_optional<T>::value || detail::is_tuple<T>::value ||
    detail::HasTiedFields<T>;

class ObjectWriter {
 public:
  template <class T>
  void write(const T& v) {
    if constexpr (detail::HasUserSerialize<T>) {
      dtrain_serialize(*this, v);
    } else if constexpr (detail::HasTiedFields<T>) {
      write(T::tie_fields(v));
    } else if constexpr (detail::is_tuple<T>::value) {
      std::apply([this](const auto&... x) { (write(x), ...); }, v);
    } else if constexpr (std::is_same_v<T, std::string>) {
      write(static_cast<std::uint64_t>(v.size()));
      bytes_.insert(bytes_.end(), v.begin(), v.end());
    } else if constexpr (detail::is_vector<T>::value) {
      write(static_cast<std::uint64_t>(v.size()));
      if constexpr (std::is_trivially_copyable_v<typename T::value_type> &&
                    !std::is_same_v<typename T::value_type, bool>) {
        const auto* p = reinterpret_cast<const char*>(v.data());
        bytes_.insert(bytes_.end(), p, p + v.size() * sizeof(typename T::value_type));
      } else {
        for (const auto& x : v) write(static_cast<const typename T::value_type&>(x));
      }
    } else if constexpr (detail::is_map<T>::value) {
      write(static_cast<std::uint64_t>(v.size()));
      for (const auto& [k, x] : v) {
        write(k);
        write(x);
      }
    } else if constexpr (detail::is_pair<T>::value) {
      write(v.first);
      write(v.second);
    } else if constexpr (detail::is_optional<T>::value) {
      write(static_cast<std::uint8_t>(v.has_value()));
      if (v) write(*v);
    } else if constexpr (std::is_trivially_copyable_v<T>) {
      const auto* p = reinterpret_cast<const char*>(&v);
      bytes_.insert(bytes_.end(), p, p + sizeof(T));
    } else {
      static_assert(Serializable<T>,
                    "dtrain: this type cannot be serialized for broadcast_object/allgather_object: "
                    "define dtrain_serialize(dtrain::ObjectWriter&, const T&) and "
                    "dtrain_deserialize(dtrain::ObjectReader&, T&) next to it "
                    "(see Note [Object serialization] in <dtrain/core/serialize.hpp>)");
    }
  }
  std::vector<char>& bytes() noexcept { return bytes_; }

 private:
  std::vector<char> bytes_;
};

class ObjectReader {
 public:
  ObjectReader(const char* data, std::size_t size) : begin_(data), p_(data), end_(data + size) {}
  template <class T>
  void read(T& v) {
    if constexpr (detail::HasUserSerialize<T>) {
      dtrain_deserialize(*this, v);
    } else if constexpr (detail::HasTiedFields<T>) {
      read(T::tie_fields(v));
    } else if constexpr (detail::is_tuple<T>::value) {
      std::apply([this](auto&... x) { (read(x), ...); }, v);
    } else if constexpr (std::is_same_v<T, std::string>) {
      const auto n = count();
      need(n);
      v.assign(p_, n);
      p_ += n;
    } else if constexpr (detail::is_vector<T>::value) {
      using E = typename T::value_type;
      const auto n = count();
      if constexpr (std::is_trivially_copyable_v<E> && !std::is_same_v<E, bool>) {
        need(n, sizeof(E));
        v.resize(n);
        std::memcpy(v.data(), p_, n * sizeof(E));
        p_ += n * sizeof(E);
      } else {
        v.clear();
        for (std::uint64_t i = 0; i < n; ++i) {
          E x{};
          read(x);
          v.push_back(std::move(x));
        }
      }
    } else if constexpr (detail::is_map<T>::value) {
      const auto n = count();
      v.clear();
      for (std::uint64_t i = 0; i < n; ++i) {
        typename T::key_type k{};
        typename T::mapped_type x{};
        read(k);
        read(x);
        v.emplace(std::move(k), std::move(x));
      }
    } else if constexpr (detail::is_pair<T>::value) {
      read(v.first);
      read(v.second);
    } else if constexpr (detail::is_optional<T>::value) {
      std::uint8_t has = 0;
      read(has);
      if (has) {
        typename T::value_type x{};
        read(x);
        v = std::move(x);
      } else {
        v.reset();
      }
    } else {
      static_assert(Serializable<T>, "dtrain: this type cannot be deserialized (see ObjectWriter)");
      need(sizeof(T));
      std::memcpy(&v, p_, sizeof(T));
      p_ += sizeof(T);
    }
  }
  template <class... Ts>
  void read(std::tuple<Ts&...>&& fields) {
    std::apply([this](auto&... x) { (read(x), ...); }, fields);
  }
  bool done() const noexcept { return p_ == end_; }
  // Bytes read so far.
  std::size_t offset() const noexcept { return static_cast<std::size_t>(p_ - begin_); }
  // Passes over `n` bytes (a block read later in place); throws like a read past the end.
  void skip(std::uint64_t n) {
    need(n);
    p_ += n;
  }

 private:
  std::uint64_t count() {
    std::uint64_t n = 0;
    read(n);
    return n;
  }
  // `count` items of `size` bytes remain; checked without multiplying, so a corrupt count
  // cannot wrap around.
  void need(std::uint64_t count, std::size_t size = 1) const {
    if (count > static_cast<std::uint64_t>(end_ - p_) / size)
      throw InvalidArgumentError("dtrain: object deserialization ran past the end of the data: "
                                 "the ranks disagree on the object's type, or a custom "
                                 "dtrain_serialize/dtrain_deserialize pair is inconsistent");
  }
  const char* begin_;
  const char* p_;
  const char* end_;
};

template <class T>
std::vector<char> serialize_object(const T& v) {
  ObjectWriter w;
  w.write(v);
  return std::move(w.bytes());
}

template <class T>
T deserialize_object(const char* data, std::size_t size) {
  ObjectReader r(data, size);
  T v{};
  r.read(v);
  if (!r.done())
    throw InvalidArgumentError("dtrain: object deserialization left unread bytes: the ranks "
                               "disagree on the object's type");
  return v;
}

}  // namespace dtrain
