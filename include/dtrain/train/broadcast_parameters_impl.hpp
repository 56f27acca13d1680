#pragma once
#include <cstddef>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dtrain/core/error.hpp"
#include "dtrain/runtime/session.hpp"
#include "dtrain/train/broadcast_parameters.hpp"
#include "dtrain/train/objects.hpp"

namespace dtrain::detail {

// What each rank contributes to check_same_parameters.
struct ParameterList {
  std::string error;  // a problem the rank found in its own list
  std::vector<ParamDescriptor> parameters;

  template <class Self>
  static auto tie_fields(Self& l) {
    return std::tie(l.error, l.parameters);
  }
};

inline std::string describe_param(const ParamDescriptor& d) {
  return fmt::format("'{}' {} [{}]", d.name, d.dtype, fmt::join(d.shape, ", "));
}

DTRAIN_API void check_same_parameters(const std::vector<ParamDescriptor>& mine, int root_rank,
                                      std::string_view what, std::string local_error) {
  const int world = size();
  if (local_error.empty() && (root_rank < 0 || root_rank >= world))
    local_error =
        fmt::format("root_rank {} is not a rank of this world of size {}", root_rank, world);
  const auto all = allgather_object(ParameterList{std::move(local_error), mine},
                                    fmt::format("{}.check", what));
  for (std::size_t r = 0; r < all.size(); ++r)
    if (!all[r].error.empty())
      throw InvalidArgumentError(fmt::format("dtrain: {}: on rank {}: {}", what, r, all[r].error));
  const auto& ref = all[static_cast<std::size_t>(root_rank)].parameters;
  auto show = [](const std::vector<ParamDescriptor>& list, std::size_t i) {
    return i < list.size() ? describe_param(list[i]) : std::string("no parameter");
  };
  for (std::size_t r = 0; r < all.size(); ++r) {
    const auto& other = all[r].parameters;
    std::size_t i = 0;
    while (i < ref.size() && i < other.size() && other[i] == ref[i]) ++i;
    if (i == ref.size() && i == other.size()) continue;
    const std::string count =
        other.size() == ref.size()
            ? std::string()
            : fmt::format(" (rank {} has {} parameters, root rank {} has {}: build the same model "
                          "on every rank before broadcasting)",
                          r, other.size(), root_rank, ref.size());
    throw MismatchError(fmt::format(
        "dtrain: {}: parameter #{} differs: rank {} has {}, root rank {} has {}{}", what, i, r,
        show(other, i), root_rank, show(ref, i), count));
  }
}

}  // namespace dtrain::detail
