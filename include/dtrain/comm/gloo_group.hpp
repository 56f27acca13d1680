#pragma once
// Host data collectives over Gloo's TCP transport, for the ranks of one MPI communicator
// (DTRAIN_CPU_OPERATIONS=gloo). Compiled only where dtrain is built with Gloo (DTRAIN_WITH_GLOO).
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
// So host tensors can go through Gloo instead of MPI, chosen by a knob as in Horovod
// (HOROVOD_CPU_OPERATIONS): an existing library, not a transport of our own. MPI stays the
// launcher, the control plane (negotiation, heartbeats) and the rendezvous: the ranks of a
// communicator exchange their Gloo addresses with one MPI_Alltoallv and connect every pair, so no
// store or extra port is needed. Errors and deadlines: every Gloo call waits at most the agreed op
// deadline (DTRAIN_OP_TIMEOUT_SECONDS) and a failure becomes a CommunicationError naming the call.
#include <mpi.h>

#include <exception>
#include <memory>
#include <string>

namespace dtrain::detail {
class GlooGroup;
// Collective over `comm`: connects its ranks through Gloo, listening on `iface` (empty: the
// default), each call waiting at most `timeout_seconds` (0: no limit). Throws where dtrain is
// built without Gloo.
std::shared_ptr<GlooGroup> connect_gloo(MPI_Comm comm, const std::string& iface,
                                        double timeout_seconds);
// connect_gloo() that reports its failure as text instead (empty: connected into `group`), for
// the callers that agree on the outcome across ranks.
inline std::string try_connect_gloo(std::shared_ptr<GlooGroup>& group, MPI_Comm comm,
                                    const std::string& iface, double timeout_seconds) {
  try {
    group = connect_gloo(comm, iface, timeout_seconds);
    return {};
  } catch (const std::exception& ex) {
    return ex.what();
  }
}
}  // namespace dtrain::detail

#if DTRAIN_WITH_GLOO
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/alltoallv.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/context.h>
#include <gloo/transport/context.h>
#include <gloo/transport/device.h>
#include <gloo/transport/tcp/device.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "dtrain/comm/local_reduce.hpp"
#include "dtrain/comm/mpi_error.hpp"
#include "dtrain/core/error.hpp"

namespace dtrain::detail {

// The interface Gloo listens on when DTRAIN_GLOO_IFACE names none: the first interface that is up,
// not loopback and has an IPv4 address; loopback where there is no other (a single machine).
// Gloo's own default resolves the host name, which need not name an address of this host's.
inline std::string default_gloo_iface() {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return "lo";
  std::string found;
  for (ifaddrs* a = list; a && found.empty(); a = a->ifa_next) {
    if (!a->ifa_addr || a->ifa_addr->sa_family != AF_INET) continue;
    if (!(a->ifa_flags & IFF_UP) || (a->ifa_flags & IFF_LOOPBACK)) continue;
    found = a->ifa_name;
  }
  freeifaddrs(list);
  return found.empty() ? std::string("lo") : found;
}

class GlooGroup {
 public:
  // Collective over `comm`: every rank of it connects to every other. `iface`: the network
  // interface to listen on (empty: default_gloo_iface()). `timeout`: how long any one call waits.
  GlooGroup(MPI_Comm comm, const std::string& iface, std::chrono::milliseconds timeout) {
    int rank = 0, size = 1;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    iface_ = iface.empty() ? default_gloo_iface() : iface;
    std::string failure;
    std::shared_ptr<gloo::transport::Device> device;
    try {
      gloo::transport::tcp::attr attr;
      attr.iface = iface_;
      device = gloo::transport::tcp::CreateDevice(attr);
    } catch (const std::exception& ex) {
      failure = ex.what();
    }
    // A rank that cannot open its device must not leave the others waiting for its address.
    int failed = failure.empty() ? 0 : 1, any_failed = 0;
    mpi_check(MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, comm),
              "MPI_Allreduce (Gloo set-up)");
    if (any_failed)
      throw CommunicationError(fmt::format(
          "dtrain: DTRAIN_CPU_OPERATIONS=gloo: {}", failed ? fmt::format(
              "Gloo could not listen on interface '{}' (DTRAIN_GLOO_IFACE): {}", iface_, failure)
                                                          : std::string(
              "another rank could not open its Gloo device (its error names the interface)")));
    context_ = std::make_shared<Connected>(rank, size);
    context_->setTimeout(timeout);
    run("connect", [&] { context_->connect(comm, device); });
  }

  const std::string& iface() const noexcept { return iface_; }

  // In place; `op` must not be Average (the caller folds it into a scale).
  void allreduce(void* buf, std::int64_t n, DataType dtype, ReduceOp op) {
    if (n <= 0 || context_->size == 1) return;
    run("allreduce", [&] {
      visit_dtype(dtype, [&](auto tag) {
        using T = decltype(tag);
        gloo::AllreduceOptions opts(context_);
        opts.setOutput(static_cast<T*>(buf), static_cast<std::size_t>(n));
        opts.setReduceFunction([op](void* c, const void* a, const void* b, std::size_t count) {
          if (c != a) std::memcpy(c, a, count * sizeof(T));
          reduce_into(op, static_cast<const T*>(b), static_cast<T*>(c),
                      static_cast<std::int64_t>(count));
        });
        opts.setTag(next_tag());
        gloo::allreduce(opts);
      });
    });
  }

  // `counts[k]` elements from rank k, in rank order, into `recv`; this rank's block comes from
  // `send`, or is already in place in `recv` when `send` is null.
  void allgatherv(const void* send, void* recv, const std::vector<std::int64_t>& counts,
                  DataType dtype) {
    if (context_->size == 1) {
      if (send && counts[0] > 0)
        std::memcpy(recv, send, static_cast<std::size_t>(counts[0]) * element_size(dtype));
      return;
    }
    run("allgatherv", [&] {
      visit_dtype(dtype, [&](auto tag) {
        using T = decltype(tag);
        std::vector<std::size_t> elements(counts.begin(), counts.end());
        gloo::AllgathervOptions opts(context_);
        if (send)
          opts.setInput(static_cast<T*>(const_cast<void*>(send)),
                        elements[static_cast<std::size_t>(context_->rank)]);
        opts.setOutput(static_cast<T*>(recv), std::move(elements));
        opts.setTag(next_tag());
        gloo::allgatherv(opts);
      });
    });
  }

  void broadcast(void* buf, std::int64_t n, DataType dtype, int root) {
    if (n <= 0 || context_->size == 1) return;
    run("broadcast", [&] {
      gloo::BroadcastOptions opts(context_);
      opts.setOutput(static_cast<std::uint8_t*>(buf),
                     static_cast<std::size_t>(n) * element_size(dtype));
      opts.setRoot(root);
      opts.setTag(next_tag());
      gloo::broadcast(opts);
    });
  }

  void alltoallv(const void* send, const std::vector<std::int64_t>& send_counts, void* recv,
                 const std::vector<std::int64_t>& recv_counts, DataType dtype) {
    run("alltoallv", [&] {
      const auto es = static_cast<std::int64_t>(element_size(dtype));
      std::vector<std::int64_t> send_bytes(send_counts), recv_bytes(recv_counts);
      for (auto& c : send_bytes) c *= es;
      for (auto& c : recv_bytes) c *= es;
      // Gloo's buffers need an address even when this rank sends or receives nothing.
      std::uint8_t none = 0;
      gloo::AlltoallvOptions opts(context_);
      opts.setInput(send ? static_cast<std::uint8_t*>(const_cast<void*>(send)) : &none,
                    std::move(send_bytes));
      opts.setOutput(recv ? static_cast<std::uint8_t*>(recv) : &none, std::move(recv_bytes));
      opts.setTag(next_tag());
      gloo::alltoallv(opts);
    });
  }

 private:
  // A gloo::Context whose pairs are connected through an MPI communicator instead of a store.
  class Connected final : public gloo::Context {
   public:
    using gloo::Context::Context;
    void connect(MPI_Comm comm, const std::shared_ptr<gloo::transport::Device>& device) {
      auto transport = device->createContext(rank, size);
      transport->setTimeout(getTimeout());
      // Each rank listens once per peer; peer k must learn the address of this rank's pair for k.
      std::vector<std::vector<char>> mine(static_cast<std::size_t>(size));
      for (int k = 0; k < size; ++k)
        if (k != rank) mine[static_cast<std::size_t>(k)] = transport->createPair(k)->address().bytes();
      std::vector<int> send_len(static_cast<std::size_t>(size)), recv_len(send_len.size());
      for (int k = 0; k < size; ++k)
        send_len[static_cast<std::size_t>(k)] = static_cast<int>(mine[static_cast<std::size_t>(k)].size());
      mpi_check(MPI_Alltoall(send_len.data(), 1, MPI_INT, recv_len.data(), 1, MPI_INT, comm),
                "MPI_Alltoall (Gloo addresses)");
      std::vector<int> send_at(send_len.size()), recv_at(recv_len.size());
      std::vector<char> out, in;
      for (int k = 0; k < size; ++k) {
        send_at[static_cast<std::size_t>(k)] = static_cast<int>(out.size());
        out.insert(out.end(), mine[static_cast<std::size_t>(k)].begin(),
                   mine[static_cast<std::size_t>(k)].end());
        recv_at[static_cast<std::size_t>(k)] = static_cast<int>(in.size());
        in.resize(in.size() + static_cast<std::size_t>(recv_len[static_cast<std::size_t>(k)]));
      }
      mpi_check(MPI_Alltoallv(out.data(), send_len.data(), send_at.data(), MPI_CHAR, in.data(),
                              recv_len.data(), recv_at.data(), MPI_CHAR, comm),
                "MPI_Alltoallv (Gloo addresses)");
      for (int k = 0; k < size; ++k) {
        if (k == rank) continue;
        const auto at = in.begin() + recv_at[static_cast<std::size_t>(k)];
        transport->getPair(k)->connect(
            std::vector<char>(at, at + recv_len[static_cast<std::size_t>(k)]));
      }
      device_ = device;
      transportContext_ = std::move(transport);
    }
  };

  template <class F>
  void run(std::string_view call, F&& f) {
    try {
      f();
    } catch (const gloo::Exception& ex) {
      throw CommunicationError(fmt::format("dtrain: Gloo {} failed: {}", call, ex.what()));
    }
  }

  std::uint32_t next_tag() noexcept { return tag_++; }

  std::shared_ptr<Connected> context_;
  std::string iface_;
  std::uint32_t tag_ = 0;
};

inline std::shared_ptr<GlooGroup> connect_gloo(MPI_Comm comm, const std::string& iface,
                                               double timeout_seconds) {
  const auto timeout =
      timeout_seconds > 0
          ? std::chrono::milliseconds(static_cast<std::int64_t>(timeout_seconds * 1e3))
          : std::chrono::milliseconds(std::chrono::hours(24 * 365));
  return std::make_shared<GlooGroup>(comm, iface, timeout);
}

}  // namespace dtrain::detail
#else
#include "dtrain/core/error.hpp"

namespace dtrain::detail {
inline std::shared_ptr<GlooGroup> connect_gloo(MPI_Comm, const std::string&, double) {
  throw InvalidArgumentError(
      "dtrain: DTRAIN_CPU_OPERATIONS=gloo: this dtrain was built without Gloo");
}
}  // namespace dtrain::detail
#endif  // DTRAIN_WITH_GLOO
