// dtrain's Gloo plugin, libdtrain_gloo.so: the host collectives of DTRAIN_CPU_OPERATIONS=gloo,
// over Gloo's TCP transport (Note [Gloo on the host path] in include/dtrain/comm/gloo_group.hpp).
//
// Note [Gloo behind dlopen]
// libtorch carries its own Gloo, another version, and exports its symbols. A program that links
// libtorch and Debian's libgloo would have every gloo:: call bound to whichever library the loader
// finds first: dtrain's calls reached libtorch's Gloo with Debian's struct layouts and failed
// ("listen: Socket operation on non-socket"). So dtrain's Gloo code lives in this library, which
// links Debian's libgloo and exports only a C table of functions, and the engine loads it with
// RTLD_DEEPBIND: its gloo:: references resolve in its own dependencies first, whatever the
// program has loaded. Gloo's headers and library never reach a program that uses dtrain. The
// plugin makes no MPI call: under RTLD_DEEPBIND, Open MPI's predefined handles (MPI_INT and
// MPI_MAX are the addresses of objects that the program holds copies of) resolved to libmpi's
// unused originals and crashed; the engine exchanges the Gloo addresses over MPI itself.
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
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "dtrain/comm/gloo_api.hpp"
#include "dtrain/comm/local_reduce.hpp"
#include "dtrain/core/error.hpp"

namespace dtrain::detail {
namespace {


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

class Group {
 public:
  // Opens the device on `iface` (empty: default_gloo_iface()) and a listening pair for each peer;
  // connect() completes it with the peers' addresses. `timeout`: how long connecting waits.
  Group(const std::string& iface, int rank, int size, std::chrono::milliseconds timeout) {
    iface_ = iface.empty() ? default_gloo_iface() : iface;
    try {
      gloo::transport::tcp::attr attr;
      attr.iface = iface_;
      device_ = gloo::transport::tcp::CreateDevice(attr);
    } catch (const std::exception& ex) {
      throw CommunicationError(fmt::format(
          "dtrain: DTRAIN_CPU_OPERATIONS=gloo: Gloo could not listen on interface '{}' "
          "(DTRAIN_GLOO_IFACE): {}", iface_, ex.what()));
    }
    context_ = std::make_shared<Connected>(rank, size);
    context_->setTimeout(timeout);
    run("listen", [&] { context_->listen(device_); });
  }

  // This rank's address for `peer`: what `peer` passes to connect() for this rank.
  const std::vector<char>& address_for(int peer) const { return context_->address_for(peer); }

  // `addresses[k]`: peer k's address for this rank (empty for this rank).
  void connect(const std::vector<std::vector<char>>& addresses) {
    run("connect", [&] { context_->connect(addresses, device_); });
    // Connected, the calls wait without a limit of their own: the engine's watchdog enforces the
    // op deadline, discounting this process's pauses and naming the ranks that did not arrive,
    // as it does for MPI's blocking calls (Note [One op deadline] in
    // runtime/execution/op_deadline.hpp).
    context_->wait_without_limit();
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

  // `counts[k]` elements of the reduction go to rank k, in rank order; this rank's into `out`.
  // Note [Gloo reduce-scatter]: Gloo's own (ReduceScatterHalvingDoubling) is of the old algorithm
  // API, with sum and product only and no bfloat16, so this is the ring over Gloo's pairs: in
  // step s (of size-1) a rank sends its partial sums of block rank-s-1 to the next rank and adds
  // the previous rank's partial sums of block rank-s-2 into its own, after which each rank holds
  // the whole reduction of its block. Every element crosses each link (size-1)/size times, half
  // of what an allreduce of the same input moves, with one block in flight per link at a time.
  void reduce_scatter(const void* send, void* out, const std::vector<std::int64_t>& counts,
                      DataType dtype, ReduceOp op) {
    const int size = context_->size, me = context_->rank;
    const std::size_t es = element_size(dtype);
    std::vector<std::size_t> offset(counts.size() + 1, 0);
    for (std::size_t k = 0; k < counts.size(); ++k)
      offset[k + 1] = offset[k] + static_cast<std::size_t>(counts[k]);
    const auto mine = static_cast<std::size_t>(me);
    if (size == 1) {
      if (counts[0] > 0) std::memcpy(out, send, offset[1] * es);
      return;
    }
    run("reduce_scatter", [&] {
      visit_dtype(dtype, [&](auto tag) {
        using T = decltype(tag);
        // The partial sums accumulate in a copy: the input is the caller's, read-only.
        work_.resize(std::max<std::size_t>(1, offset.back() * es));
        if (offset.back() > 0) std::memcpy(work_.data(), send, offset.back() * es);
        const auto largest = *std::max_element(counts.begin(), counts.end());
        incoming_.resize(std::max<std::size_t>(1, static_cast<std::size_t>(largest) * es));
        auto work = context_->createUnboundBuffer(work_.data(), work_.size());
        auto incoming = context_->createUnboundBuffer(incoming_.data(), incoming_.size());
        const int next = (me + 1) % size, previous = (me + size - 1) % size;
        const auto slot = gloo::Slot::build(kReduceScatterSlotPrefix, next_tag());
        for (int step = 0; step + 1 < size; ++step) {
          const auto out_block = static_cast<std::size_t>((me - step - 1 + 2 * size) % size);
          const auto in_block = static_cast<std::size_t>((me - step - 2 + 2 * size) % size);
          const bool sends = counts[out_block] > 0, receives = counts[in_block] > 0;
          if (sends)
            work->send(next, slot, offset[out_block] * es,
                       static_cast<std::size_t>(counts[out_block]) * es);
          if (receives) {
            incoming->recv(previous, slot, 0, static_cast<std::size_t>(counts[in_block]) * es);
            incoming->waitRecv();
            reduce_into(op, reinterpret_cast<const T*>(incoming_.data()),
                        reinterpret_cast<T*>(work_.data()) + offset[in_block], counts[in_block]);
          }
          if (sends) work->waitSend();
        }
        if (counts[mine] > 0)
          std::memcpy(out, work_.data() + offset[mine] * es,
                      static_cast<std::size_t>(counts[mine]) * es);
      });
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
  // A gloo::Context whose pairs are connected from addresses the engine exchanged over MPI,
  // instead of through a store. No MPI call here (Note [Gloo behind dlopen]).
  class Connected final : public gloo::Context {
   public:
    using gloo::Context::Context;
    void listen(const std::shared_ptr<gloo::transport::Device>& device) {
      transport_ = device->createContext(rank, size);
      transport_->setTimeout(getTimeout());
      addresses_.resize(static_cast<std::size_t>(size));
      for (int k = 0; k < size; ++k)
        if (k != rank)
          addresses_[static_cast<std::size_t>(k)] = transport_->createPair(k)->address().bytes();
    }
    const std::vector<char>& address_for(int peer) const {
      return addresses_.at(static_cast<std::size_t>(peer));
    }
    void connect(const std::vector<std::vector<char>>& peers,
                 const std::shared_ptr<gloo::transport::Device>& device) {
      for (int k = 0; k < size; ++k)
        if (k != rank) transport_->getPair(k)->connect(peers.at(static_cast<std::size_t>(k)));
      device_ = device;
      transportContext_ = std::move(transport_);
    }
    void wait_without_limit() {
      const auto year = std::chrono::milliseconds(std::chrono::hours(24 * 365));
      setTimeout(year);
      transportContext_->setTimeout(year);
    }

   private:
    std::shared_ptr<gloo::transport::Context> transport_;  // until connected
    std::vector<std::vector<char>> addresses_;             // this rank's, one per peer
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

  // Gloo's collectives use prefixes 0x01 to 0x08 (gloo/types.h); this one is dtrain's.
  static constexpr std::uint8_t kReduceScatterSlotPrefix = 0x41;

  std::shared_ptr<gloo::transport::Device> device_;
  std::vector<char> work_, incoming_;  // reduce_scatter's, kept between calls
  std::shared_ptr<Connected> context_;
  std::string iface_;
  std::uint32_t tag_ = 0;
};

}  // namespace
}  // namespace dtrain::detail

namespace {

using dtrain::detail::Group;

// Runs f, turning any exception into 1 and its text in `error`.
template <class F>
int guarded(char* error, std::size_t capacity, F&& f) noexcept {
  try {
    f();
    return 0;
  } catch (const std::exception& ex) {
    if (capacity > 0) {
      std::strncpy(error, ex.what(), capacity - 1);
      error[capacity - 1] = '\0';
    }
    return 1;
  }
}

std::vector<std::int64_t> to_vector(const std::int64_t* counts, int ranks) {
  return std::vector<std::int64_t>(counts, counts + ranks);
}

DtrainGlooGroup* create(const char* iface, int rank, int size, std::int64_t timeout_ms,
                        char* error, std::size_t capacity) {
  Group* group = nullptr;
  guarded(error, capacity, [&] {
    group = new Group(iface ? iface : "", rank, size, std::chrono::milliseconds(timeout_ms));
  });
  return reinterpret_cast<DtrainGlooGroup*>(group);
}

int address_for(DtrainGlooGroup* g, int peer, const char** bytes, std::size_t* length) {
  const std::vector<char>& a = reinterpret_cast<Group*>(g)->address_for(peer);
  *bytes = a.data();
  *length = a.size();
  return 0;
}

int connect(DtrainGlooGroup* g, const char* const* addresses, const std::size_t* lengths,
            int ranks, char* error, std::size_t capacity) {
  return guarded(error, capacity, [&] {
    std::vector<std::vector<char>> peers(static_cast<std::size_t>(ranks));
    for (int k = 0; k < ranks; ++k)
      peers[static_cast<std::size_t>(k)].assign(addresses[k], addresses[k] + lengths[k]);
    reinterpret_cast<Group*>(g)->connect(peers);
  });
}

void destroy(DtrainGlooGroup* g) { delete reinterpret_cast<Group*>(g); }

int allreduce(DtrainGlooGroup* g, void* buf, std::int64_t n, int dtype, int op, char* error,
              std::size_t capacity) {
  return guarded(error, capacity, [&] {
    reinterpret_cast<Group*>(g)->allreduce(buf, n, static_cast<dtrain::DataType>(dtype),
                                           static_cast<dtrain::ReduceOp>(op));
  });
}

int allgatherv(DtrainGlooGroup* g, const void* send, void* recv, const std::int64_t* counts,
               int ranks, int dtype, char* error, std::size_t capacity) {
  return guarded(error, capacity, [&] {
    reinterpret_cast<Group*>(g)->allgatherv(send, recv, to_vector(counts, ranks),
                                            static_cast<dtrain::DataType>(dtype));
  });
}

int broadcast(DtrainGlooGroup* g, void* buf, std::int64_t n, int dtype, int root, char* error,
              std::size_t capacity) {
  return guarded(error, capacity, [&] {
    reinterpret_cast<Group*>(g)->broadcast(buf, n, static_cast<dtrain::DataType>(dtype), root);
  });
}

int alltoallv(DtrainGlooGroup* g, const void* send, const std::int64_t* send_counts, void* recv,
              const std::int64_t* recv_counts, int ranks, int dtype, char* error,
              std::size_t capacity) {
  return guarded(error, capacity, [&] {
    reinterpret_cast<Group*>(g)->alltoallv(send, to_vector(send_counts, ranks), recv,
                                           to_vector(recv_counts, ranks),
                                           static_cast<dtrain::DataType>(dtype));
  });
}

int reduce_scatter(DtrainGlooGroup* g, const void* send, void* out, const std::int64_t* counts,
                   int ranks, int dtype, int op, char* error, std::size_t capacity) {
  return guarded(error, capacity, [&] {
    reinterpret_cast<Group*>(g)->reduce_scatter(send, out, to_vector(counts, ranks),
                                                static_cast<dtrain::DataType>(dtype),
                                                static_cast<dtrain::ReduceOp>(op));
  });
}

const char* interface_of(DtrainGlooGroup* g) { return reinterpret_cast<Group*>(g)->iface().c_str(); }

const DtrainGlooApi api = {DTRAIN_GLOO_API_VERSION, create,     address_for, connect,
                           destroy,                 interface_of, allreduce,  allgatherv,
                           broadcast,               alltoallv,    reduce_scatter};

}  // namespace

extern "C" __attribute__((visibility("default"))) const DtrainGlooApi* dtrain_gloo_api() {
  return &api;
}
