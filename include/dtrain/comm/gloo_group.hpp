#pragma once
// Host data collectives over Gloo's TCP transport, for the ranks of one MPI communicator
// (DTRAIN_CPU_OPERATIONS=gloo), through dtrain's Gloo plugin (libdtrain_gloo.so; Note [Gloo behind
// dlopen] in src/gloo_plugin.cpp). The plugin is built where dtrain is built with Gloo
// (DTRAIN_WITH_GLOO), and found at the path DTRAIN_GLOO_PLUGIN names.
//
// Note [Gloo on the host path]
// MPICH over UCX waits inside its collectives by polling: across hosts a link-bound allreduce
// takes a whole core from backward on every rank (docs/scaling.md). Posting MPI's nonblocking
// collectives and sleeping between tests frees the core, but MPICH 4.0.2's nonblocking allreduce
// over UCX's TCP transport carries the link at about two thirds of its blocking rate (Note
// [Waiting for data collectives] in comm/request_wait.hpp): neither form gives both. Gloo, the
// transport PyTorch DDP uses on CPUs, waits in the kernel: one loop thread per device sleeps in
// epoll_wait and the calling thread on a condition variable, so a rank waiting for the network
// costs no core, and its ring keeps two segments in flight per peer, which keeps a TCP link full.
// Measured (docs/scaling.md): a 64 MiB allreduce over 400 Mbit/s in the time of raw
// MPI_Allreduce, with 0.07 of a core. So host tensors can go through Gloo instead of MPI, chosen
// by a knob as in Horovod (HOROVOD_CPU_OPERATIONS): an existing library, not a transport of our
// own. MPI stays the launcher, the control plane (negotiation, heartbeats) and the rendezvous:
// the ranks of a communicator exchange their Gloo addresses with one MPI_Alltoallv and connect
// every pair, so no store or extra port is needed. Connecting waits at most the agreed op
// deadline; the collectives then wait without a limit of Gloo's own, and the engine's watchdog
// enforces the op deadline as for MPI's blocking calls (pauses discounted, late ranks named). A
// failure (a peer's connection lost) becomes a CommunicationError naming the call.
#include <dlfcn.h>
#include <mpi.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "dtrain/comm/gloo_api.hpp"
#include "dtrain/comm/mpi_error.hpp"
#include "dtrain/comm/reduce_op.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/tensor/dtype.hpp"

namespace dtrain::detail {

#ifdef DTRAIN_GLOO_PLUGIN
inline constexpr bool gloo_built = true;
#else
inline constexpr bool gloo_built = false;
#endif

// The plugin's table, loaded once per process; throws naming the library where it cannot be.
inline const DtrainGlooApi& gloo_api() {
#ifdef DTRAIN_GLOO_PLUGIN
  static const DtrainGlooApi* const api = [] {
    // RTLD_DEEPBIND: the plugin's gloo:: symbols resolve in its own libgloo, never in a Gloo the
    // program already has (libtorch's): Note [Gloo behind dlopen]. Where the path this engine was
    // compiled with is gone (a compiled dtrain installed elsewhere), the loader's search finds
    // the installed copy (ld.so.conf, LD_LIBRARY_PATH).
    constexpr int mode = RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND;
    void* lib = dlopen(DTRAIN_GLOO_PLUGIN, mode);
    if (!lib) {
      const std::string first = dlerror();
      lib = dlopen("libdtrain_gloo.so", mode);
      if (!lib)
        throw InvalidArgumentError(fmt::format(
            "dtrain: DTRAIN_CPU_OPERATIONS=gloo: cannot load dtrain's Gloo plugin: {}; nor "
            "libdtrain_gloo.so from the loader's search path (LD_LIBRARY_PATH): {}",
            first, dlerror()));
    }
    auto* entry = reinterpret_cast<const DtrainGlooApi* (*)()>(dlsym(lib, "dtrain_gloo_api"));
    const DtrainGlooApi* table = entry ? entry() : nullptr;
    if (!table || table->version != DTRAIN_GLOO_API_VERSION)
      throw InvalidArgumentError(fmt::format(
          "dtrain: DTRAIN_CPU_OPERATIONS=gloo: {} is not dtrain's Gloo plugin of this version ({})",
          DTRAIN_GLOO_PLUGIN, DTRAIN_GLOO_API_VERSION));
    return table;
  }();
  return *api;
#else
  throw InvalidArgumentError(
      "dtrain: DTRAIN_CPU_OPERATIONS=gloo: this dtrain was built without Gloo (install "
      "libgloo-dev and configure dtrain with -DDTRAIN_WITH_GLOO=ON)");
#endif
}

class GlooGroup {
 public:
  // Collective over `comm`: every rank of it connects to every other. `iface`: the network
  // interface to listen on (empty: the first that is up, not loopback and has an IPv4 address).
  // `timeout`: how long connecting waits; the collectives wait without a limit.
  GlooGroup(MPI_Comm comm, const std::string& iface, std::chrono::milliseconds timeout)
      : api_(gloo_api()), requested_iface_(iface), timeout_(timeout) {
    int rank = 0;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &ranks_);
    group_ = api_.create(iface.c_str(), rank, ranks_, timeout.count(), error_.data(),
                         error_.size());
    // A rank that cannot open its device must not leave the others waiting for its addresses.
    int failed = group_ ? 0 : 1, any_failed = 0;
    mpi_check(MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, comm),
              "MPI_Allreduce (Gloo set-up)");
    if (any_failed) {
      const std::string why =
          group_ ? "dtrain: DTRAIN_CPU_OPERATIONS=gloo: another rank could not open its Gloo "
                   "device (its error names the interface)"
                 : std::string(error_.data());
      if (group_) api_.destroy(group_);
      throw CommunicationError(why);
    }
    // Peer k needs this rank's address for k: one alltoallv of the lengths, one of the bytes.
    const auto n = static_cast<std::size_t>(ranks_);
    std::vector<int> send_len(n), recv_len(n), send_at(n), recv_at(n);
    std::vector<char> out, in;
    for (int k = 0; k < ranks_; ++k) {
      const char* bytes = nullptr;
      std::size_t length = 0;
      if (k != rank) api_.address_for(group_, k, &bytes, &length);
      send_at[static_cast<std::size_t>(k)] = static_cast<int>(out.size());
      send_len[static_cast<std::size_t>(k)] = static_cast<int>(length);
      out.insert(out.end(), bytes, bytes + length);
    }
    mpi_check(MPI_Alltoall(send_len.data(), 1, MPI_INT, recv_len.data(), 1, MPI_INT, comm),
              "MPI_Alltoall (Gloo addresses)");
    for (std::size_t k = 0; k < n; ++k) {
      recv_at[k] = static_cast<int>(in.size());
      in.resize(in.size() + static_cast<std::size_t>(recv_len[k]));
    }
    mpi_check(MPI_Alltoallv(out.data(), send_len.data(), send_at.data(), MPI_CHAR, in.data(),
                            recv_len.data(), recv_at.data(), MPI_CHAR, comm),
              "MPI_Alltoallv (Gloo addresses)");
    std::vector<const char*> peers(n);
    std::vector<std::size_t> lengths(n);
    for (std::size_t k = 0; k < n; ++k) {
      peers[k] = in.data() + recv_at[k];
      lengths[k] = static_cast<std::size_t>(recv_len[k]);
    }
    if (api_.connect(group_, peers.data(), lengths.data(), ranks_, error_.data(),
                     error_.size())) {
      api_.destroy(group_);
      throw CommunicationError(error_.data());
    }
  }
  GlooGroup(const GlooGroup&) = delete;
  GlooGroup& operator=(const GlooGroup&) = delete;
  ~GlooGroup() { api_.destroy(group_); }

  std::string iface() const { return api_.interface_of(group_); }
  // What this group was made with, for a process set's group to be made alike.
  const std::string& requested_iface() const noexcept { return requested_iface_; }
  double connect_timeout_seconds() const noexcept {
    return std::chrono::duration<double>(timeout_).count();
  }

  // In place; `op` must not be Average (the caller folds it into a scale).
  void allreduce(void* buf, std::int64_t n, DataType dtype, ReduceOp op) {
    check(api_.allreduce(group_, buf, n, static_cast<int>(dtype), static_cast<int>(op),
                         error_.data(), error_.size()));
  }
  // `counts[k]` elements from rank k, in rank order, into `recv`; this rank's block comes from
  // `send`, or is already in place in `recv` when `send` is null.
  void allgatherv(const void* send, void* recv, const std::vector<std::int64_t>& counts,
                  DataType dtype) {
    check(api_.allgatherv(group_, send, recv, counts.data(), ranks_, static_cast<int>(dtype),
                          error_.data(), error_.size()));
  }
  void broadcast(void* buf, std::int64_t n, DataType dtype, int root) {
    check(api_.broadcast(group_, buf, n, static_cast<int>(dtype), root, error_.data(),
                         error_.size()));
  }
  // `counts[k]` elements of the reduction to rank k; this rank's into `out`. A ring over Gloo's
  // pairs (Note [Gloo reduce-scatter] in src/gloo_plugin.cpp).
  void reduce_scatter(const void* send, void* out, const std::vector<std::int64_t>& counts,
                      DataType dtype, ReduceOp op) {
    check(api_.reduce_scatter(group_, send, out, counts.data(), ranks_, static_cast<int>(dtype),
                              static_cast<int>(op), error_.data(), error_.size()));
  }
  void alltoallv(const void* send, const std::vector<std::int64_t>& send_counts, void* recv,
                 const std::vector<std::int64_t>& recv_counts, DataType dtype) {
    check(api_.alltoallv(group_, send, send_counts.data(), recv, recv_counts.data(), ranks_,
                         static_cast<int>(dtype), error_.data(), error_.size()));
  }

 private:
  void check(int failed) const {
    if (failed) throw CommunicationError(error_.data());
  }

  const DtrainGlooApi& api_;
  std::string requested_iface_;
  std::chrono::milliseconds timeout_;
  DtrainGlooGroup* group_ = nullptr;
  int ranks_ = 1;
  mutable std::array<char, 1024> error_{};
};

// Collective over `comm`: connects its ranks through Gloo, listening on `iface` (empty: the
// default), waiting at most `timeout_seconds` for the connections (0: no limit).
inline std::shared_ptr<GlooGroup> connect_gloo(MPI_Comm comm, const std::string& iface,
                                               double timeout_seconds) {
  const auto timeout =
      timeout_seconds > 0
          ? std::chrono::milliseconds(static_cast<std::int64_t>(timeout_seconds * 1e3))
          : std::chrono::milliseconds(std::chrono::hours(24 * 365));
  return std::make_shared<GlooGroup>(comm, iface, timeout);
}

// connect_gloo() that reports its failure as text instead (empty: connected into `group`), for
// the callers that agree on the outcome across ranks.
// Collective over `comm` also where some rank cannot load the plugin: no rank is left waiting.
inline std::string try_connect_gloo(std::shared_ptr<GlooGroup>& group, MPI_Comm comm,
                                    const std::string& iface, double timeout_seconds) {
  std::string failure;
  try {
    (void)gloo_api();
  } catch (const std::exception& ex) {
    failure = ex.what();
  }
  int failed = failure.empty() ? 0 : 1, any_failed = 0;
  if (MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, comm) != MPI_SUCCESS)
    return "dtrain: MPI_Allreduce (Gloo set-up) failed";
  if (any_failed)
    return failed ? failure
                  : "dtrain: DTRAIN_CPU_OPERATIONS=gloo: another rank could not load dtrain's "
                    "Gloo plugin (its error names it)";
  try {
    group = connect_gloo(comm, iface, timeout_seconds);
    return {};
  } catch (const std::exception& ex) {
    return ex.what();
  }
}

}  // namespace dtrain::detail
