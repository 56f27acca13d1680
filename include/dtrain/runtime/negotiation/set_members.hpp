#pragma once
// The ranks of one process set as the coordinator sees them: world ranks, ascending, with their
// positions in the set (the set ranks its communicator numbers them by). The coordinator keeps
// every per-rank table by world rank, so its messages name ranks as the user knows them, and asks
// this class which of them a set waits for.
#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace dtrain::detail {

class SetMembers {
 public:
  // Every rank of a world of `size` ranks: process set 0.
  static SetMembers world(int size) {
    std::vector<std::int32_t> all(static_cast<std::size_t>(std::max(size, 0)));
    for (int r = 0; r < size; ++r) all[static_cast<std::size_t>(r)] = r;
    return SetMembers(0, size, std::move(all));
  }

  // Process set `id` of the world ranks `ranks` (ascending, distinct, each below `world_size`).
  SetMembers(std::int32_t id, int world_size, std::vector<std::int32_t> ranks)
      : id_(id), ranks_(std::move(ranks)), index_(static_cast<std::size_t>(world_size), -1) {
    for (std::size_t i = 0; i < ranks_.size(); ++i)
      index_[static_cast<std::size_t>(ranks_[i])] = static_cast<int>(i);
    if (id_ != 0)
      label_ = fmt::format(" on process set {} (ranks [{}])", id_, fmt::join(ranks_, ", "));
  }

  std::int32_t id() const noexcept { return id_; }
  int world_size() const noexcept { return static_cast<int>(index_.size()); }
  int count() const noexcept { return static_cast<int>(ranks_.size()); }
  const std::vector<std::int32_t>& ranks() const noexcept { return ranks_; }
  bool contains(int rank) const noexcept {
    return rank >= 0 && rank < world_size() && index_[static_cast<std::size_t>(rank)] >= 0;
  }
  // The set rank of world rank `rank`, or -1 for a rank outside the set.
  int index_of(int rank) const noexcept {
    return rank >= 0 && rank < world_size() ? index_[static_cast<std::size_t>(rank)] : -1;
  }
  // What messages append to an op's name: "" for the world, " on process set 1 (ranks [0, 2])"
  // otherwise.
  const std::string& label() const noexcept { return label_; }

 private:
  std::int32_t id_;
  std::vector<std::int32_t> ranks_;
  std::vector<int> index_;  // by world rank: its set rank, or -1
  std::string label_;
};

}  // namespace dtrain::detail
