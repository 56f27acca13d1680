#pragma once
// The device backend the engine runs device responses on: NCCL, or pinned host staging over MPI,
// chosen once by every rank together at the first device op.
#include <mpi.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dtrain/core/logging.hpp"
#include "dtrain/cuda/device.hpp"
#include "dtrain/cuda/nccl_backend.hpp"
#include "dtrain/cuda/nccl_comm.hpp"
#include "dtrain/cuda/staging_backend.hpp"
#include "dtrain/cuda/transport.hpp"
#include "dtrain/runtime/execution/backend.hpp"

namespace dtrain {
namespace cuda {

// How device tensors travel between ranks.
enum class Transport : int {
  automatic,  // NCCL when every rank has a GPU of its own and NCCL >= 2.14 is loaded; else staging
  nccl,
  staging,  // pinned host buffers over MPI
};

constexpr std::string_view to_string(Transport t) noexcept {
  switch (t) {
    case Transport::automatic: return "automatic";
    case Transport::nccl: return "nccl";
    case Transport::staging: return "staging";
  }
  return "unknown";
}

}  // namespace cuda

namespace detail {
inline std::atomic<int>& requested_transport() noexcept {
  static std::atomic<int> t{static_cast<int>(cuda::Transport::automatic)};
  return t;
}
inline std::atomic<int>& chosen_transport() noexcept {
  static std::atomic<int> t{static_cast<int>(cuda::Transport::automatic)};
  return t;
}
}  // namespace detail

namespace cuda {

// Chooses the transport for device tensors. Every rank must ask for the same one, before its
// first device op (the choice is made then, once, by all ranks together).
inline void set_transport(Transport t) noexcept {
  detail::requested_transport().store(static_cast<int>(t));
}

// The transport device ops use: Transport::automatic until the first device op has chosen.
inline Transport active_transport() noexcept {
  return static_cast<Transport>(detail::chosen_transport().load());
}

}  // namespace cuda

namespace detail {

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const BackendContext& ctx) : ctx_(ctx) {
    MPI_Comm_rank(ctx.data_comm, &rank_);
    MPI_Comm_size(ctx.data_comm, &size_);
  }
  ~CudaBackend() override { chosen_transport().store(static_cast<int>(cuda::Transport::automatic)); }

  // `arrival` is not used: the device timeline spans start when the transport starts.
  void execute(const Response& r, std::span<Entry* const> entries,
               std::chrono::steady_clock::time_point) override {
    const int device = pick_device(entries);
    if (!transport_) choose(device);
    transport_->execute(r, entries, device);
  }

 private:
  // This rank's GPU for a response: its own tensor's; for a rank that joined (no tensor), the one
  // it used before, else local_rank % device_count (dtrain::cuda::set_device_from_local_rank()).
  int pick_device(std::span<Entry* const> entries) {
    for (Entry* e : entries)
      if (e) return last_device_ = e->request.device.index;
    if (last_device_ >= 0) return last_device_;
    const int n = cuda::device_count();
    if (n == 0)
      throw Error(fmt::format("dtrain: rank {} must take part in a device op but sees no CUDA device",
                              rank_));
    return last_device_ = ctx_.hierarchy.layout.local_rank % n;
  }

  // Collective over the data communicator (every rank reaches its first device response together).
  void choose(int device) {
    struct Vote {
      int requested;
      int nccl_version;
      char uuid[16];
    } mine{};
    mine.requested = requested_transport().load();
    mine.nccl_version = nccl_runtime_version();
    cudaDeviceProp prop{};
    cuda_check(cudaGetDeviceProperties(&prop, device), fmt::format("cudaGetDeviceProperties({})", device));
    std::memcpy(mine.uuid, prop.uuid.bytes, sizeof(mine.uuid));
    std::vector<Vote> all(static_cast<std::size_t>(size_));
    mpi_check(MPI_Allgather(&mine, sizeof(Vote), MPI_BYTE, all.data(), sizeof(Vote), MPI_BYTE,
                            ctx_.data_comm),
              "MPI_Allgather (device transport)");

    std::vector<int> requested;
    for (const auto& v : all) requested.push_back(v.requested);
    if (std::adjacent_find(requested.begin(), requested.end(), std::not_equal_to<>()) != requested.end()) {
      std::vector<std::string> names;
      for (int v : requested) names.emplace_back(cuda::to_string(static_cast<cuda::Transport>(v)));
      throw MismatchError(fmt::format(
          "dtrain: ranks asked for different device transports (dtrain::cuda::set_transport): "
          "[{}] by rank; call it with the same value on every rank",
          fmt::join(names, ", ")));
    }
    std::string shared;
    for (int a = 0; a < size_ && shared.empty(); ++a)
      for (int b = a + 1; b < size_; ++b)
        if (std::memcmp(all[a].uuid, all[b].uuid, sizeof(all[a].uuid)) == 0) {
          shared = fmt::format("ranks {} and {} use the same GPU", a, b);
          break;
        }
    int oldest = all[0].nccl_version;
    for (const auto& v : all) oldest = std::min(oldest, v.nccl_version);
    const bool nccl_too_old = oldest < 21400;
    const auto requested_t = static_cast<cuda::Transport>(mine.requested);

    bool use_nccl = false;
    std::string why;
    switch (requested_t) {
      case cuda::Transport::staging:
        why = "requested with dtrain::cuda::set_transport";
        break;
      case cuda::Transport::nccl:
        if (!shared.empty())
          throw InvalidArgumentError(fmt::format(
              "dtrain: NCCL was requested for device tensors but {}; NCCL needs one GPU per "
              "rank. Call dtrain::cuda::set_device_from_local_rank() and run at most one rank "
              "per GPU, or use dtrain::cuda::Transport::staging",
              shared));
        use_nccl = true;
        break;
      case cuda::Transport::automatic:
        if (!shared.empty()) why = shared + " (NCCL needs one GPU per rank)";
        else if (nccl_too_old) why = "a rank loaded an NCCL older than 2.14";
        else use_nccl = true;
        break;
    }
    if (use_nccl) {
      transport_ = std::make_unique<NcclBackend>(ctx_);
      chosen_transport().store(static_cast<int>(cuda::Transport::nccl));
      if (rank_ == 0) log(LogLevel::debug, "dtrain: device tensors use NCCL {}", nccl_version_string());
    } else {
      transport_ = std::make_unique<StagingBackend>(ctx_);
      chosen_transport().store(static_cast<int>(cuda::Transport::staging));
      if (rank_ == 0)
        log(requested_t == cuda::Transport::staging ? LogLevel::debug : LogLevel::warning,
            "dtrain: device tensors go through pinned host memory over MPI (slower than NCCL): {}",
            why);
    }
  }

  BackendContext ctx_;
  int rank_ = 0, size_ = 1;
  int last_device_ = -1;
  std::unique_ptr<DeviceTransport> transport_;  // chosen at the first device op
};

inline std::unique_ptr<Backend> make_cuda_backend(const BackendContext& ctx) {
  return std::make_unique<CudaBackend>(ctx);
}

}  // namespace detail
}  // namespace dtrain
