#pragma once
// Definitions of runtime/process_set.hpp (Note [Build modes] in core/build_mode.hpp).
#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dtrain/core/error.hpp"
#include "dtrain/runtime/engine/engine.hpp"
#include "dtrain/runtime/engine/runtime_state.hpp"
#include "dtrain/runtime/execution/entry.hpp"
#include "dtrain/runtime/handle.hpp"
#include "dtrain/runtime/process_set.hpp"

namespace dtrain {
namespace detail {

struct ProcessSetAccess {
  static ProcessSet make(std::int32_t id, std::shared_ptr<const std::vector<int>> ranks) {
    ProcessSet s;
    s.id_ = id;
    s.ranks_ = std::move(ranks);
    return s;
  }
  static const std::shared_ptr<const std::vector<int>>& ranks(const ProcessSet& s) noexcept {
    return s.ranks_;
  }
};

// The local checks of add_process_set `name` of the world ranks `sorted` (ascending), as given
// (`given`), in a world of `size` ranks.
inline void check_set_ranks(const std::string& name, const std::vector<int>& given,
                            const std::vector<int>& sorted, int size) {
  const std::string op = fmt::format("dtrain: add_process_set '{}' of ranks [{}]", name,
                                     fmt::join(given, ", "));
  if (sorted.empty())
    throw InvalidArgumentError(op + ": a process set needs at least one rank");
  if (sorted.front() < 0 || sorted.back() >= size)
    throw InvalidArgumentError(fmt::format(
        "{}: rank {} is outside the world of {} ranks (0..{})", op,
        sorted.front() < 0 ? sorted.front() : sorted.back(), size, size - 1));
  if (auto d = std::adjacent_find(sorted.begin(), sorted.end()); d != sorted.end())
    throw InvalidArgumentError(fmt::format("{}: rank {} appears more than once", op, *d));
}

}  // namespace detail

DTRAIN_API std::vector<int> ProcessSet::ranks() const {
  if (ranks_) return *ranks_;
  std::vector<int> all(
      static_cast<std::size_t>(detail::runtime("ProcessSet::ranks")->topology.size));
  for (std::size_t r = 0; r < all.size(); ++r) all[r] = static_cast<int>(r);
  return all;
}

DTRAIN_API int ProcessSet::size() const {
  if (ranks_) return static_cast<int>(ranks_->size());
  return detail::runtime("ProcessSet::size")->topology.size;
}

DTRAIN_API int ProcessSet::rank() const {
  const int world_rank = detail::runtime("ProcessSet::rank")->topology.rank;
  if (!ranks_) return world_rank;
  auto it = std::lower_bound(ranks_->begin(), ranks_->end(), world_rank);
  return it != ranks_->end() && *it == world_rank ? static_cast<int>(it - ranks_->begin()) : -1;
}

DTRAIN_API ProcessSet add_process_set(std::vector<int> ranks) {
  auto rt = detail::runtime("add_process_set");
  detail::Engine& engine = *rt->engine;
  const std::string name = engine.generate_name(detail::OpKind::process_set, 0);
  std::vector<int> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  try {
    detail::check_set_ranks(name, ranks, sorted, engine.size());
  } catch (const InvalidArgumentError& e) {
    // The peers' add_process_set fails at once instead of waiting (Note [Failed ops]).
    engine.reject(name, detail::OpKind::process_set, e.what(), {}, 0);
    throw;
  }
  detail::Request q;
  q.name = name;
  q.kind = detail::OpKind::process_set;
  q.dtype = DataType::uint8;
  q.shape = {0};
  q.set_ranks.assign(sorted.begin(), sorted.end());
  auto e = std::make_shared<detail::Entry>();
  e->request = std::move(q);
  e->state = detail::make_op_state();
  auto id = std::make_shared<std::optional<std::int32_t>>();
  e->set_created = [id](std::int32_t created) { *id = created; };
  ResultHandle<std::int32_t> h(e->state, id);
  engine.submit(std::move(e));
  const std::int32_t created = h.get();
  return detail::ProcessSetAccess::make(
      created, std::make_shared<const std::vector<int>>(std::move(sorted)));
}

}  // namespace dtrain
