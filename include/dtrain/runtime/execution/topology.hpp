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

#include "dtrain/comm/communicator.hpp"
#include "dtrain/comm/gather_text.hpp"
#include "dtrain/comm/hierarchical.hpp"
#include "dtrain/comm/host_layout.hpp"
#include "dtrain/comm/mpi_error.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/host_name.hpp"

namespace dtrain::detail {

struct Topology {
  int rank = 0, size = 1;
  // Shared-memory nodes the ranks run on, whatever DTRAIN_HOST_ID says: where the bytes between
  // "hosts" really cross a network (DTRAIN_CPU_OPERATIONS=auto).
  int machines = 1;
  HostLayout layout;                   // this rank among the world's hosts
  std::vector<int> host_of_rank;       // world rank -> host index
  std::vector<std::string> host_names; // world rank -> its host's name (for messages)
  Communicator local_comm;             // ranks on this host
  Communicator cross_comm;             // ranks with this local rank, one per host

  HierarchyComms hierarchy() const {
    return HierarchyComms{local_comm.get(), cross_comm.get(), layout};
  }
  // Note [Owned communicators] in comm/communicator.hpp.
  void abandon_comms() noexcept {
    local_comm.abandon();
    cross_comm.abandon();
  }
};

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

  // DTRAIN_HOST_ID replaces each rank's host name: set on some ranks only, the hosts would be
  // counted in two incompatible ways.
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
  // shared-memory split (two containers can share a host name without sharing memory). The split
  // runs either way: it also counts the machines.
  int shm_leader = t.rank;
  {
    MPI_Comm split = MPI_COMM_NULL;
    mpi_check(MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, t.rank, MPI_INFO_NULL, &split),
              "MPI_Comm_split_type");
    const Communicator shm(split);
    int leader = t.rank;
    mpi_check(MPI_Bcast(&leader, 1, MPI_INT, 0, shm.get()), "MPI_Bcast");
    shm_leader = leader;
  }
  const int leads = shm_leader == t.rank ? 1 : 0;
  mpi_check(MPI_Allreduce(&leads, &t.machines, 1, MPI_INT, MPI_SUM, world), "MPI_Allreduce");
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
  t.layout = host_layout(t.host_of_rank, static_cast<std::size_t>(t.rank));
  t.local_comm = Communicator::split(world, t.host_of_rank[t.rank], t.layout.local_rank);
  t.cross_comm = Communicator::split(world, t.layout.local_rank, t.layout.cross_rank);
  return t;
}

// Duplicates of the topology's host communicators with their layout, for a backend to own.
inline HostHierarchy duplicate_hierarchy(const Topology& t) {
  return HostHierarchy{Communicator::duplicate(t.local_comm.get()),
                       Communicator::duplicate(t.cross_comm.get()), t.layout};
}

// The host communicators of a process set, split from its communicator `set_comm`: the members on
// this rank's host, and the members with this rank's local rank across hosts (Note [Hierarchical
// parts] in comm/hierarchical.hpp, within the set). `members`: the set's world ranks, ascending;
// `host_of_rank`: every world rank's host. Collective over `set_comm`.
inline HostHierarchy split_hierarchy(MPI_Comm set_comm, std::span<const std::int32_t> members,
                                     std::span<const int> host_of_rank, int world_rank) {
  std::vector<int> host_of;
  std::size_t me = 0;
  for (std::size_t i = 0; i < members.size(); ++i) {
    host_of.push_back(host_of_rank[static_cast<std::size_t>(members[i])]);
    if (members[i] == world_rank) me = i;
  }
  HostHierarchy h;
  h.layout = host_layout(host_of, me);
  h.local = Communicator::split(set_comm, h.layout.host, h.layout.local_rank);
  h.cross = Communicator::split(set_comm, h.layout.local_rank, h.layout.cross_rank);
  return h;
}

}  // namespace dtrain::detail
