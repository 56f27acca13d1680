#pragma once
// Where one member of a group of ranks (the world, or a process set) sits among the group's
// hosts: the one description of the host layout, kept by the topology and by every pair of host
// communicators (comm/hierarchical.hpp).
#include <algorithm>
#include <cstddef>
#include <span>
#include <vector>

namespace dtrain::detail {

struct HostLayout {
  std::vector<int> local_sizes;  // members per host, hosts in order of their first member
  int host = 0;                  // this member's host, an index into local_sizes
  int local_rank = 0, local_size = 1;
  int cross_rank = 0, cross_size = 1;
  bool homogeneous = true;  // every host has the same number of members

  int hosts() const noexcept { return local_sizes.empty() ? 1 : static_cast<int>(local_sizes.size()); }
  // The smallest number of members on any host: Note [Hierarchical parts] in comm/hierarchical.hpp.
  int parts() const noexcept {
    return local_sizes.empty() ? 1 : *std::min_element(local_sizes.begin(), local_sizes.end());
  }
};

// The layout of member `me` of a group whose member i runs on host `host_of[i]` (any id per
// host). Cross rank: position among the members with the same local rank, in host order.
inline HostLayout host_layout(std::span<const int> host_of, std::size_t me) {
  HostLayout l;
  std::vector<int> hosts;  // ids, in order of their first member
  for (std::size_t i = 0; i < host_of.size(); ++i) {
    auto it = std::find(hosts.begin(), hosts.end(), host_of[i]);
    const int h = static_cast<int>(it - hosts.begin());
    if (it == hosts.end()) {
      hosts.push_back(host_of[i]);
      l.local_sizes.push_back(0);
    }
    if (i == me) {
      l.host = h;
      l.local_rank = l.local_sizes[static_cast<std::size_t>(h)];
    }
    ++l.local_sizes[static_cast<std::size_t>(h)];
  }
  l.local_size = l.local_sizes[static_cast<std::size_t>(l.host)];
  l.homogeneous = std::all_of(l.local_sizes.begin(), l.local_sizes.end(),
                              [&](int n) { return n == l.local_sizes.front(); });
  l.cross_rank = 0;
  l.cross_size = 0;
  for (std::size_t h = 0; h < l.local_sizes.size(); ++h) {
    if (l.local_sizes[h] > l.local_rank) {
      if (static_cast<int>(h) < l.host) ++l.cross_rank;
      ++l.cross_size;
    }
  }
  return l;
}

}  // namespace dtrain::detail
