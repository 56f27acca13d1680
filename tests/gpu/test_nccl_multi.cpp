// NCCL with one GPU per rank (needs as many GPUs as ranks; skipped otherwise): every collective
// across ranks, and hierarchical allreduce through NCCL on emulated hosts, even and uneven.
#include <cuda_runtime.h>

#include <string>

#include <doctest/doctest.h>

#include "collective_checks.hpp"
#include "dtrain/cuda.hpp"
#include "gpu_test_support.hpp"

using namespace dtrain;
using gpu_test::have_device;

namespace {
int world_size() {
  int s = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}
int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
}  // namespace

TEST_CASE("nccl across ranks: every collective of every dtype") {
  if (!have_device(world_size())) return;
  init();
  const int device = cuda::set_device_from_local_rank();
  gpu_test::check_every_collective(device, rank(), size(), cuda::Transport::nccl);
  shutdown();
}

TEST_CASE("nccl across ranks: hierarchical allreduce on emulated hosts") {
  if (!have_device(world_size())) return;
  const int size = world_size();
  // Even hosts (reduce-scatter/allgather path) and, from 3 ranks, uneven ones (grouped
  // reduce/broadcast path).
  std::vector<std::string> layouts = {size >= 4 ? "AABB" : size == 3 ? "AAB" : "AB"};
  if (size >= 4) layouts.push_back("AAAB");
  for (const auto& layout : layouts) {
    CAPTURE(layout);
    Config config;
    config.hierarchical_allreduce = true;
    config.host_id = std::string("host-") + layout[static_cast<std::size_t>(world_rank())];
    init(config);
    // Emulated hosts: local ranks repeat across hosts, so pick GPUs by world rank.
    const int device = rank() % cuda::device_count();
    gpu_test::check_cuda(cudaSetDevice(device));
    gpu_test::check_allreduce(device, rank(), size);
    CHECK(cuda::active_transport() == cuda::Transport::nccl);
    CHECK(engine_stats().hierarchical_collectives > 0);
    shutdown();
  }
}
