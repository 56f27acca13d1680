#pragma once
// broadcast_object / allgather_object: any serializable value (see Note [Object serialization]).
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dtrain/core/build_mode.hpp"
#include "dtrain/runtime/collectives.hpp"
#include "dtrain/runtime/session.hpp"
#include "dtrain/core/serialize.hpp"

namespace dtrain {
namespace detail {

// The base name of an object op's collectives ("<base>.size(s)", "<base>.data"), given or
// generated; a set this rank may not use fails the op on every rank before anything is sent.
DTRAIN_API std::string broadcast_object_name(std::string_view given);
DTRAIN_API std::string allgather_object_name(std::string_view given);

}  // namespace detail

// Returns root's value on every rank (root's own argument is returned unchanged).
template <class T>
T broadcast_object(const T& value, int root_rank = 0, std::string_view name = {}) {
  std::vector<char> bytes;
  if (rank() == root_rank) bytes = serialize_object(value);
  const std::string base = detail::broadcast_object_name(name);
  std::vector<std::int64_t> size{static_cast<std::int64_t>(bytes.size())};
  broadcast(size, root_rank, base + ".size");
  bytes.resize(static_cast<std::size_t>(size[0]));
  std::span<std::uint8_t> view(reinterpret_cast<std::uint8_t*>(bytes.data()), bytes.size());
  broadcast(view, root_rank, base + ".data");
  if (rank() == root_rank) return value;
  return deserialize_object<T>(bytes.data(), bytes.size());
}

// Every rank's value, in rank order.
template <class T>
std::vector<T> allgather_object(const T& value, std::string_view name = {}) {
  const std::vector<char> bytes = serialize_object(value);
  const std::string base = detail::allgather_object_name(name);
  std::vector<std::int64_t> mine{static_cast<std::int64_t>(bytes.size())};
  const auto sizes = allgather(mine, base + ".sizes");
  std::span<const std::uint8_t> view(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size());
  const auto all = allgather(view, base + ".data");
  std::vector<T> out;
  out.reserve(sizes.size());
  std::size_t offset = 0;
  for (auto s : sizes) {
    out.push_back(deserialize_object<T>(reinterpret_cast<const char*>(all.data()) + offset,
                                        static_cast<std::size_t>(s)));
    offset += static_cast<std::size_t>(s);
  }
  return out;
}

}  // namespace dtrain

#ifdef DTRAIN_HEADER_ONLY
#include "dtrain/train/objects_impl.hpp"
#endif
