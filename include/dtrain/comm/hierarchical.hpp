#pragma once
// Hierarchical allreduce on host memory: reduce-scatter inside each host, allreduce across hosts,
// allgather inside each host. The device backend runs the same plan with NCCL.
//
// Note [Hierarchical parts]
// The buffer is cut into `parts` pieces, where parts = the smallest number of ranks on any host.
// Local rank k < parts owns piece k on every host, so the ranks that own piece k (local rank k on
// each host) are exactly the members of cross communicator k, and every host has such a rank.
// Local ranks >= parts (only on hosts larger than the smallest) own nothing: they take part in
// the host's reduce-scatter and allgather with a count of zero and skip the cross-host step, as
// do all the other members of their cross communicator. On homogeneous jobs parts = local_size,
// the usual algorithm. Pieces differ by at most one element: the first n % parts take one more.
#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "dtrain/comm/communicator.hpp"
#include "dtrain/comm/host_buffer.hpp"
#include "dtrain/comm/host_layout.hpp"
#include "dtrain/comm/host_collectives.hpp"
#include "dtrain/comm/request_wait.hpp"
#include "dtrain/core/error.hpp"

namespace dtrain::detail {

// The two-level view of the job that hierarchical allreduce runs on. A view: the communicators
// belong to a HostHierarchy (Note [Owned communicators] in comm/communicator.hpp).
struct HierarchyComms {
  MPI_Comm local = MPI_COMM_NULL;  // ranks on this host, ordered by local rank
  MPI_Comm cross = MPI_COMM_NULL;  // ranks with this local rank, one per host, in host order
  HostLayout layout;               // parts(): see Note [Hierarchical parts]

  bool valid() const noexcept { return local != MPI_COMM_NULL && cross != MPI_COMM_NULL; }
};

// The owner of a pair of host communicators and their layout.
struct HostHierarchy {
  Communicator local, cross;
  HostLayout layout;

  HierarchyComms comms() const { return HierarchyComms{local.get(), cross.get(), layout}; }
};

// Which elements of an n-element buffer each local rank owns.
struct HierarchicalPlan {
  std::vector<std::int64_t> counts;  // per local rank; 0 for local ranks >= parts
  std::vector<std::int64_t> displs;  // element offset of each local rank's piece

  std::int64_t largest() const noexcept {
    return counts.empty() ? 0 : *std::max_element(counts.begin(), counts.end());
  }
};

inline HierarchicalPlan plan_hierarchical(std::int64_t n, int local_size, int parts) {
  if (n < 0 || local_size < 1 || parts < 1 || parts > local_size)
    throw InvalidArgumentError(fmt::format(
        "dtrain: hierarchical allreduce plan for {} elements over {} local ranks in {} parts: "
        "expected n >= 0 and 1 <= parts <= local_size",
        n, local_size, parts));
  HierarchicalPlan p;
  p.counts.assign(static_cast<std::size_t>(local_size), 0);
  p.displs.assign(static_cast<std::size_t>(local_size), 0);
  const std::int64_t base = n / parts, extra = n % parts;
  std::int64_t offset = 0;
  for (int k = 0; k < local_size; ++k) {
    p.displs[k] = offset;
    if (k < parts) p.counts[k] = base + (k < extra ? 1 : 0);
    offset += p.counts[k];
  }
  return p;
}

// In-place allreduce of `n` elements of `buf` through the host hierarchy. `op` must not be
// Average (fold it into a postscale). `scratch` holds the pieces between the steps. The result is
// multiplied by `factor` while the pieces are copied back, so a scaled allreduce costs no extra
// pass (Note [Scaled allreduce]). Collective over both communicators of `h`.
//
// The in-host gather is an MPI_Allgather (Note [Allgather, not Allgatherv]): where the pieces are
// of one size it gathers straight into `buf`; where they are not (n not a multiple of the parts, or
// hosts of different sizes) every local rank's piece sits in a block of the largest piece's size in
// `scratch`, and the blocks are gathered there and copied out.
//
// Every step is a nonblocking call: the in-host ones waited for hot, the cross-host one as
// `cross_wait` says (Note [Waiting for data collectives] in comm/request_wait.hpp).
inline void hierarchical_allreduce(void* buf, std::int64_t n, DataType dtype, ReduceOp op,
                                   const HierarchyComms& h, HostBuffer& scratch,
                                   std::int64_t chunk_elems, double factor = 1.0,
                                   const RequestWait& cross_wait = RequestWait::hot(),
                                   int in_flight = 1) {
  if (!h.valid())
    throw Error("dtrain: internal error: hierarchical allreduce without host communicators");
  const HierarchicalPlan plan = plan_hierarchical(n, h.layout.local_size, h.layout.parts());
  const std::int64_t mine = plan.counts[h.layout.local_rank];
  const std::int64_t block = plan.largest();
  const std::size_t es = element_size(dtype);
  const bool even = equal_counts(plan.counts);
  const bool blocks = !even && block * h.layout.local_size <= mpi_count_limit();
  // Never a zero-byte reservation: MPI rejects a null send buffer even for a zero count.
  const std::int64_t reserved =
      std::max<std::int64_t>(blocks ? block * h.layout.local_size : mine, 1);
  char* area = static_cast<char*>(scratch.reserve(static_cast<std::size_t>(reserved) * es));
  void* piece = blocks ? byte_ptr(area, block * h.layout.local_rank, dtype) : area;

  host_reduce_scatter(buf, piece, plan.counts, dtype, op, h.local, chunk_elems);
  if (mine > 0 && h.layout.cross_size > 1)
    host_allreduce(piece, mine, dtype, op, h.cross, chunk_elems, cross_wait, in_flight);

  if (blocks) {
    MPI_Request request = MPI_REQUEST_NULL;
    mpi_check(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, area, static_cast<int>(block),
                             mpi_datatype(dtype), h.local, &request),
              "MPI_Iallgather");
    RequestWait::hot().wait(request, "MPI_Iallgather");
    for (int k = 0; k < h.layout.local_size; ++k)
      scale_copy(dtype, byte_ptr(area, block * k, dtype), byte_ptr(buf, plan.displs[k], dtype),
                 plan.counts[k], factor);
    return;
  }
  // This rank's piece goes where it would be received; the gather is in place.
  scale_copy(dtype, piece, byte_ptr(buf, plan.displs[h.layout.local_rank], dtype), mine, factor);
  host_allgatherv_in_place(buf, plan.counts, dtype, h.local, chunk_elems);
}

}  // namespace dtrain::detail
