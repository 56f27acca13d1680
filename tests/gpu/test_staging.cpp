// Device tensors over MPI through pinned host memory, with 2-4 ranks sharing one GPU (NCCL cannot
// put two ranks on one GPU). Without a device: "no CUDA device: skipped".
#include <cuda_runtime.h>

#include <string>

#include <doctest/doctest.h>

#include "collective_checks.hpp"
#include "dtrain/cuda.hpp"
#include "gpu_test_support.hpp"

using namespace dtrain;
using gpu_test::have_device;

TEST_CASE("staging: every collective on device tensors, ranks sharing a GPU") {
  if (!have_device()) return;
  init();
  const int device = cuda::set_device_from_local_rank();
  const bool shared = cuda::device_count() < local_size();
  // Ranks that share a GPU must get staging without asking; otherwise ask for it.
  if (!shared) cuda::set_transport(cuda::Transport::staging);
  gpu_test::check_every_collective(device, rank(), size(), cuda::Transport::staging);
  shutdown();
  cuda::set_transport(cuda::Transport::automatic);
}

TEST_CASE("staging: hierarchical allreduce of device tensors on emulated hosts") {
  if (!have_device()) return;
  const int r = [] { int x = 0; MPI_Comm_rank(MPI_COMM_WORLD, &x); return x; }();
  Config config;
  config.hierarchical_allreduce = true;
  config.host_id = "host-" + std::to_string(r / 2);  // pairs of ranks per host; uneven at 3
  init(config);
  const int device = cuda::set_device_from_local_rank();
  if (cuda::device_count() >= local_size()) cuda::set_transport(cuda::Transport::staging);
  gpu_test::check_allreduce(device, rank(), size());
  CHECK(cuda::active_transport() == cuda::Transport::staging);
  CHECK(engine_stats().hierarchical_collectives > 0);
  shutdown();
  cuda::set_transport(cuda::Transport::automatic);
}
