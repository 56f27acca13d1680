#pragma once
// Process sets: subsets of the world's ranks that run collectives of their own, as Horovod's do
// (hvd.add_process_set). Every collective takes one in its options (`.process_set`); the default
// is the world. Only a set's members may use it, and they negotiate, fuse, cache, join and report
// stalls among themselves; two sets, disjoint or not, run side by side without deadlock (Note
// [Process sets] in runtime/negotiation/coordinator.hpp). Declared here and defined with the engine
// (runtime/detail/process_set_impl.hpp; Note [Build modes] in core/build_mode.hpp).
#include <cstdint>
#include <memory>
#include <vector>

#include "dtrain/core/build_mode.hpp"

namespace dtrain {

class ProcessSet;

namespace detail {
struct ProcessSetAccess;

// The set an op is about to run on, as the submitting rank sees it (for the local checks).
struct SetOfOp {
  std::int32_t id = 0;
  std::shared_ptr<const std::vector<int>> ranks;  // world ranks, ascending
};
}  // namespace detail

class ProcessSet {
 public:
  // The world: every rank (Horovod's global_process_set), every collective's default.
  ProcessSet() = default;

  // 0 for the world; sets are numbered 1, 2, ... in the order they were created.
  std::int32_t id() const noexcept { return id_; }
  bool is_world() const noexcept { return id_ == 0; }
  // The members' world ranks (dtrain::rank() numbers), ascending.
  DTRAIN_API std::vector<int> ranks() const;
  DTRAIN_API int size() const;
  // This process's rank within the set (its place in ranks()), or -1 where it is not a member.
  DTRAIN_API int rank() const;
  bool included() const { return rank() >= 0; }

  friend bool operator==(const ProcessSet& a, const ProcessSet& b) noexcept {
    if (a.id_ != b.id_) return false;
    if (!a.ranks_ || !b.ranks_) return a.ranks_ == b.ranks_;
    return *a.ranks_ == *b.ranks_;
  }

 private:
  friend struct detail::ProcessSetAccess;
  std::int32_t id_ = 0;
  std::shared_ptr<const std::vector<int>> ranks_;  // null for the world
};

// The world, under Horovod's name.
inline const ProcessSet global_process_set{};

// Creates the process set of the world ranks `ranks` (in any order) and returns it on every rank,
// members or not. Collective over the world, like hvd.add_process_set: every rank calls it with
// the same ranks, from the thread that called init(), at any time after init(). An empty list, a
// rank outside the world or a repeated rank throws InvalidArgumentError on every rank; ranks that
// pass different lists get MismatchError naming each rank's list; a list equal to an existing
// set's (the world's included) throws InvalidArgumentError naming that set. A set lives until
// shutdown().
DTRAIN_API ProcessSet add_process_set(std::vector<int> ranks);

}  // namespace dtrain

#ifdef DTRAIN_HEADER_ONLY
#include "dtrain/runtime/detail/process_set_impl.hpp"
#endif
