#pragma once
// Ranks, hosts and the communicators derived from them. "Local" = processes on the same host,
// "cross" = processes with the same local rank on different hosts. The host is the shared-memory
// node, or the DTRAIN_HOST_ID string when set, which lets tests emulate several hosts on one
// machine.
#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dtrain/comm/gather_text.hpp"
#include "dtrain/comm/hierarchical.hpp"
#include "dtrain/comm/mpi_error.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/host_name.hpp"

namespace dtrain::detail {

struct Topology {
  int rank = 0, size = 1;
  int local_rank = 0, local_size = 1;
  int cross_rank = 0, cross_size = 1;
  bool homogeneous = true;
  std::vector<int> local_sizes;        // per host, in host order
  std::vector<int> host_of_rank;       // world rank -> host index
  std::vector<std::string> host_names; // world rank -> its host's name (for messages)
  MPI_Comm local_comm = MPI_COMM_NULL;
  MPI_Comm cross_comm = MPI_COMM_NULL;

  void free_comms() noexcept {
    if (local_comm != MPI_COMM_NULL) MPI_Comm_free(&local_comm);
    if (cross_comm != MPI_COMM_NULL) MPI_Comm_free(&cross_comm);
  }
};

// Where one member of a group of ranks (the world, or a process set) sits among the group's hosts.
struct HostLayout {
  std::vector<int> local_sizes;  // members per host, hosts in order of their first member
  int host = 0;                  // this member's host, an index into local_sizes
  int local_rank = 0, local_size = 1;
  int cross_rank = 0, cross_size = 1;
  bool homogeneous = true;
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

// A host id without the "#<leader rank>" that tells apart containers sharing a host name.
inline std::string display_host(const std::string& id) {
  const auto hash = id.rfind('#');
  if (hash == std::string::npos || hash + 1 == id.size()) return id;
  for (std::size_t i = hash + 1; i < id.size(); ++i)
    if (id[i] < '0' || id[i] > '9') return id;
  return id.substr(0, hash);
}

// Collective over `world`. Hosts are numbered in order of their lowest world rank.
inline Topology make_topology(MPI_Comm world, const std::string& host_id_override) {
  Topology t;
  MPI_Comm_rank(world, &t.rank);
  MPI_Comm_size(world, &t.size);

  // DTRAIN_HOST_ID replaces the shared-memory split below, itself collective: set on some ranks
  // only, the ranks would make different MPI calls (a hang, or "Message truncated").
  const int overridden = host_id_override.empty() ? 0 : 1;
  std::vector<int> overrides(static_cast<std::size_t>(t.size));
  mpi_check(MPI_Allgather(&overridden, 1, MPI_INT, overrides.data(), 1, MPI_INT, world),
            "MPI_Allgather");
  if (std::adjacent_find(overrides.begin(), overrides.end(), std::not_equal_to<>()) !=
      overrides.end()) {
    std::vector<int> set, unset;
    for (int r = 0; r < t.size; ++r)
      (overrides[static_cast<std::size_t>(r)] ? set : unset).push_back(r);
    throw InvalidArgumentError(fmt::format(
        "dtrain::init(): DTRAIN_HOST_ID is set on ranks [{}] but not on ranks [{}]. It names "
        "each rank's host in place of the host's own name, so it must be set on every rank or "
        "on none (dtrainrun forwards DTRAIN_* variables to every rank; in a Config, set host_id "
        "on every rank).",
        fmt::join(set, ", "), fmt::join(unset, ", ")));
  }
  // Identify each rank's host: the override string, else the host name refined by the
  // shared-memory split (two containers can share a host name without sharing memory).
  int shm_leader = t.rank;
  if (host_id_override.empty()) {
    MPI_Comm shm;
    mpi_check(MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, t.rank, MPI_INFO_NULL, &shm),
              "MPI_Comm_split_type");
    int leader = t.rank;
    mpi_check(MPI_Bcast(&leader, 1, MPI_INT, 0, shm), "MPI_Bcast");
    shm_leader = leader;
    MPI_Comm_free(&shm);
  }
  std::string id = host_id_override.empty() ? host_name() + "#" + std::to_string(shm_leader)
                                            : host_id_override;
  const std::vector<std::string> ids = allgather_text(id, world);
  std::vector<std::string> hosts;  // in order of first appearance = lowest world rank
  t.host_of_rank.resize(t.size);
  for (int r = 0; r < t.size; ++r) {
    const std::string& h = ids[static_cast<std::size_t>(r)];
    t.host_names.push_back(display_host(h));
    auto it = std::find(hosts.begin(), hosts.end(), h);
    t.host_of_rank[r] = static_cast<int>(it - hosts.begin());
    if (it == hosts.end()) hosts.push_back(h);
  }
  const HostLayout l = host_layout(t.host_of_rank, static_cast<std::size_t>(t.rank));
  t.local_sizes = l.local_sizes;
  t.local_rank = l.local_rank;
  t.local_size = l.local_size;
  t.cross_rank = l.cross_rank;
  t.cross_size = l.cross_size;
  t.homogeneous = l.homogeneous;
  mpi_check(MPI_Comm_split(world, t.host_of_rank[t.rank], t.local_rank, &t.local_comm),
            "MPI_Comm_split");
  mpi_check(MPI_Comm_split(world, t.local_rank, t.cross_rank, &t.cross_comm), "MPI_Comm_split");
  MPI_Comm_set_errhandler(t.local_comm, MPI_ERRORS_RETURN);
  MPI_Comm_set_errhandler(t.cross_comm, MPI_ERRORS_RETURN);
  return t;
}

// Duplicates of the topology's host communicators with their layout, for a backend to own.
inline HierarchyComms duplicate_hierarchy(const Topology& t) {
  HierarchyComms h;
  mpi_check(MPI_Comm_dup(t.local_comm, &h.local), "MPI_Comm_dup");
  mpi_check(MPI_Comm_dup(t.cross_comm, &h.cross), "MPI_Comm_dup");
  MPI_Comm_set_errhandler(h.local, MPI_ERRORS_RETURN);
  MPI_Comm_set_errhandler(h.cross, MPI_ERRORS_RETURN);
  h.local_rank = t.local_rank;
  h.local_size = t.local_size;
  h.cross_rank = t.cross_rank;
  h.cross_size = t.cross_size;
  h.hosts = static_cast<int>(t.local_sizes.size());
  h.parts = t.local_sizes.empty() ? 1 : *std::min_element(t.local_sizes.begin(), t.local_sizes.end());
  h.homogeneous = t.homogeneous;
  return h;
}

// The host communicators of a process set, split from its communicator `set_comm`: the members on
// this rank's host, and the members with this rank's local rank across hosts (Note [Hierarchical
// parts] in comm/hierarchical.hpp, within the set). `members`: the set's world ranks, ascending;
// `host_of_rank`: every world rank's host. Collective over `set_comm`.
inline HierarchyComms split_hierarchy(MPI_Comm set_comm, std::span<const std::int32_t> members,
                                      std::span<const int> host_of_rank, int world_rank) {
  std::vector<int> host_of;
  std::size_t me = 0;
  for (std::size_t i = 0; i < members.size(); ++i) {
    host_of.push_back(host_of_rank[static_cast<std::size_t>(members[i])]);
    if (members[i] == world_rank) me = i;
  }
  const HostLayout l = host_layout(host_of, me);
  HierarchyComms h;
  mpi_check(MPI_Comm_split(set_comm, l.host, l.local_rank, &h.local), "MPI_Comm_split");
  mpi_check(MPI_Comm_split(set_comm, l.local_rank, l.cross_rank, &h.cross), "MPI_Comm_split");
  MPI_Comm_set_errhandler(h.local, MPI_ERRORS_RETURN);
  MPI_Comm_set_errhandler(h.cross, MPI_ERRORS_RETURN);
  h.local_rank = l.local_rank;
  h.local_size = l.local_size;
  h.cross_rank = l.cross_rank;
  h.cross_size = l.cross_size;
  h.hosts = static_cast<int>(l.local_sizes.size());
  h.parts = *std::min_element(l.local_sizes.begin(), l.local_sizes.end());
  h.homogeneous = l.homogeneous;
  return h;
}

}  // namespace dtrain::detail
