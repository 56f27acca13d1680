#pragma once
// Ranks, hosts and the communicators derived from them. "Local" = processes on the same host,
// "cross" = processes with the same local rank on different hosts. The host is the shared-memory
// node, or the DTRAIN_HOST_ID string when set, which lets tests emulate several hosts on one
// machine.
#include <mpi.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include <unistd.h>

#include "dtrain/comm/hierarchical.hpp"
#include "dtrain/comm/mpi_error.hpp"

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

inline std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "localhost";
  return buf;
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
  // Whole ids, whatever their length: a fixed-size slot would merge hosts whose names differ only
  // past its end.
  const int length = static_cast<int>(id.size());
  std::vector<int> lengths(t.size), offsets(t.size, 0);
  mpi_check(MPI_Allgather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, world),
            "MPI_Allgather");
  for (int r = 1; r < t.size; ++r) offsets[r] = offsets[r - 1] + lengths[r - 1];
  std::vector<char> all(static_cast<std::size_t>(offsets.back()) + lengths.back());
  mpi_check(MPI_Allgatherv(id.data(), length, MPI_CHAR, all.data(), lengths.data(),
                           offsets.data(), MPI_CHAR, world),
            "MPI_Allgatherv");

  std::vector<std::string> hosts;  // in order of first appearance = lowest world rank
  t.host_of_rank.resize(t.size);
  for (int r = 0; r < t.size; ++r) {
    std::string h(all.data() + offsets[r], static_cast<std::size_t>(lengths[r]));
    t.host_names.push_back(display_host(h));
    auto it = std::find(hosts.begin(), hosts.end(), h);
    t.host_of_rank[r] = static_cast<int>(it - hosts.begin());
    if (it == hosts.end()) hosts.push_back(h);
  }
  t.local_sizes.assign(hosts.size(), 0);
  t.local_rank = 0;
  for (int r = 0; r < t.size; ++r) {
    if (t.host_of_rank[r] == t.host_of_rank[t.rank] && r < t.rank) ++t.local_rank;
    ++t.local_sizes[t.host_of_rank[r]];
  }
  t.local_size = t.local_sizes[t.host_of_rank[t.rank]];
  t.homogeneous = std::all_of(t.local_sizes.begin(), t.local_sizes.end(),
                              [&](int s) { return s == t.local_sizes.front(); });
  // Cross rank: position among ranks with the same local rank, in host order.
  t.cross_rank = 0;
  t.cross_size = 0;
  for (std::size_t h = 0; h < hosts.size(); ++h) {
    if (t.local_sizes[h] > t.local_rank) {
      if (static_cast<int>(h) < t.host_of_rank[t.rank]) ++t.cross_rank;
      ++t.cross_size;
    }
  }
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

}  // namespace dtrain::detail
