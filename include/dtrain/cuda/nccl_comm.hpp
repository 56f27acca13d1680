#pragma once
// NCCL communicators bootstrapped over MPI, and the host-side wait that turns a dead peer into an
// error instead of a hang.
//
// Note [Non-blocking NCCL]
// dtrain creates its communicators non-blocking (ncclConfig_t::blocking = 0): no NCCL call blocks
// the engine thread. A call may return ncclInProgress, meaning NCCL is still initializing or
// enqueuing; the engine then polls ncclCommGetAsyncError until it reports success or an error.
// Completion of device work is observed by polling a CUDA event recorded after it, interleaved
// with ncclCommGetAsyncError (which reports failures seen by NCCL's proxy threads, such as a peer
// whose connection broke). At the deadline (DTRAIN_OP_TIMEOUT_SECONDS) every communicator taking
// part is aborted with ncclCommAbort, which also stops its kernels, and the op fails with
// TimeoutError. A communicator that was aborted cannot be used again.
#include <mpi.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

#include <fmt/format.h>

#include "dtrain/comm/mpi_error.hpp"
#include "dtrain/comm/reduce_op.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/cuda/error.hpp"
#include "dtrain/runtime/execution/op_deadline.hpp"
#include "dtrain/tensor/dtype.hpp"

#if !defined(NCCL_VERSION_CODE) || NCCL_VERSION_CODE < 21400
#error "dtrain's CUDA support needs NCCL 2.14 or newer (non-blocking communicators)"
#endif

namespace dtrain::detail {

// NCCL's version code in the 2.9+ scheme (major*10000 + minor*100 + patch), from the library
// actually loaded; 0 if it cannot tell.
inline int nccl_runtime_version() noexcept {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return 0;
  if (v < 10000) v = (v / 1000) * 10000 + ((v / 100) % 10) * 100 + v % 100;  // before 2.9
  return v;
}

inline std::string nccl_version_string() {
  const int v = nccl_runtime_version();
  if (v == 0) return "unknown";
  return fmt::format("{}.{}.{}", v / 10000, (v / 100) % 100, v % 100);
}

// ncclAvg (divide by the communicator size inside the reduction) exists from NCCL 2.10.
inline bool nccl_has_avg() noexcept { return nccl_runtime_version() >= 21000; }

inline ncclDataType_t nccl_datatype(DataType d) {
  switch (d) {
    case DataType::uint8: return ncclUint8;
    case DataType::int8: return ncclInt8;
    case DataType::int32: return ncclInt32;
    case DataType::int64: return ncclInt64;
    case DataType::float16: return ncclFloat16;
    case DataType::bfloat16: return ncclBfloat16;
    case DataType::float32: return ncclFloat32;
    case DataType::float64: return ncclFloat64;
  }
  throw InvalidArgumentError(fmt::format("dtrain: no NCCL type for DataType value {}",
                                         static_cast<int>(d)));
}

inline ncclRedOp_t nccl_op(ReduceOp op) noexcept {
  switch (op) {
    case ReduceOp::Average: return ncclAvg;
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Min: return ncclMin;
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Product: return ncclProd;
    case ReduceOp::Adasum: break;  // host tensors only (Note [Adasum tree])
  }
  return ncclSum;
}

// When an op must have finished (Note [One op deadline] in runtime/execution/op_deadline.hpp).
using Deadline = OpDeadline;

// Polling back-off: spin briefly (an op that is about to finish costs no sleep), then yield, then
// sleep in short steps so a rank waiting for a slow peer uses almost no CPU.
class Backoff {
 public:
  void pause() {
    // Qualified: dtrain::detail has a milliseconds() of its own (the profiler's records).
    const auto waited = OpDeadline::Clock::now() - start_;
    if (waited < std::chrono::microseconds(50)) return;
    if (waited < std::chrono::milliseconds(2)) {
      std::this_thread::yield();
      return;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }

 private:
  OpDeadline::Clock::time_point start_ = OpDeadline::Clock::now();
};

class NcclComm {
 public:
  NcclComm() = default;
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;
  NcclComm(NcclComm&& o) noexcept { *this = std::move(o); }
  NcclComm& operator=(NcclComm&& o) noexcept {
    if (this != &o) {
      destroy();
      comm_ = std::exchange(o.comm_, nullptr);
      rank_ = o.rank_;
      size_ = o.size_;
      label_ = std::move(o.label_);
      aborted_ = o.aborted_;
    }
    return *this;
  }
  ~NcclComm() { destroy(); }

  // Collective over `bootstrap`: rank 0 makes the unique id and broadcasts it over MPI; every
  // member joins with its MPI rank. The calling thread's current device is the GPU this rank uses.
  static NcclComm create(MPI_Comm bootstrap, const Deadline& deadline, std::string label) {
    NcclComm c;
    c.label_ = std::move(label);
    MPI_Comm_rank(bootstrap, &c.rank_);
    MPI_Comm_size(bootstrap, &c.size_);
    struct {
      int status;
      ncclUniqueId id;
    } boot{};
    if (c.rank_ == 0) boot.status = static_cast<int>(ncclGetUniqueId(&boot.id));
    mpi_check(MPI_Bcast(&boot, sizeof(boot), MPI_BYTE, 0, bootstrap), "MPI_Bcast (NCCL unique id)");
    if (boot.status != ncclSuccess)
      throw CommunicationError(nccl_error_message(
          static_cast<ncclResult_t>(boot.status),
          fmt::format("ncclGetUniqueId on rank 0 of the {} communicator", c.label_)));

    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const ncclResult_t r = ncclCommInitRankConfig(&c.comm_, c.size_, boot.id, c.rank_, &config);
    if (r != ncclSuccess && r != ncclInProgress) {
      const std::string what = c.describe("ncclCommInitRankConfig");
      c.abort();
      throw CommunicationError(nccl_error_message(r, what));
    }
    c.wait_ready(deadline, "ncclCommInitRankConfig");
    return c;
  }

  ncclComm_t get() const noexcept { return comm_; }
  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  bool valid() const noexcept { return comm_ != nullptr && !aborted_; }
  const std::string& label() const noexcept { return label_; }

  // Checks the result of a call on this communicator; for ncclInProgress, waits until NCCL has
  // finished it (Note [Non-blocking NCCL]) so later calls and stream work are ordered after it.
  void check(ncclResult_t r, std::string_view call, const Deadline& deadline) {
    if (r == ncclSuccess) return;
    if (r == ncclInProgress) {
      wait_ready(deadline, call);
      return;
    }
    const std::string what = describe(call);
    const std::string detail = last_error();
    abort();
    throw CommunicationError(nccl_error_message(r, what, detail));
  }

  // ncclSuccess, ncclInProgress, or the error NCCL's background threads saw.
  ncclResult_t async_error() noexcept {
    if (!comm_ || aborted_) return ncclInvalidUsage;
    ncclResult_t e = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(comm_, &e);
    return r != ncclSuccess ? r : e;
  }

  std::string last_error() const {
    if (!comm_) return {};
    const char* s = ncclGetLastError(comm_);
    return s ? std::string(s) : std::string();
  }

  // Stops this communicator's work (kernels included) and frees it; never blocks on peers.
  void abort() noexcept {
    if (comm_ && !aborted_) {
      ncclCommAbort(comm_);
      aborted_ = true;
      comm_ = nullptr;
    }
  }

  std::string describe(std::string_view call) const {
    return fmt::format("{} on the {} NCCL communicator (rank {} of {})", call, label_, rank_, size_);
  }

 private:
  void wait_ready(const Deadline& deadline, std::string_view call) {
    Backoff backoff;
    while (true) {
      const ncclResult_t st = async_error();
      if (st == ncclSuccess) return;
      if (st != ncclInProgress) {
        const std::string what = describe(call);
        const std::string detail = last_error();
        abort();
        throw CommunicationError(nccl_error_message(st, what, detail));
      }
      if (deadline.passed()) {
        const std::string what = describe(call);
        abort();
        throw TimeoutError(fmt::format(
            "dtrain: {} did not finish within {} s (DTRAIN_OP_TIMEOUT_SECONDS): a peer rank "
            "died, hangs, or never reached the same NCCL call; the communicator was aborted",
            what, deadline.seconds()));
      }
      backoff.pause();
    }
  }

  void destroy() noexcept {
    if (!comm_ || aborted_) return;
    // Flush and free; bounded, because a destructor must not hang on a vanished peer.
    if (ncclCommFinalize(comm_) == ncclInProgress) {
      const Deadline d = Deadline::after(10);
      Backoff backoff;
      while (async_error() == ncclInProgress && !d.passed()) backoff.pause();
      if (async_error() != ncclSuccess) {
        abort();
        return;
      }
    }
    ncclCommDestroy(comm_);
    comm_ = nullptr;
  }

  ncclComm_t comm_ = nullptr;
  int rank_ = 0, size_ = 1;
  std::string label_;
  bool aborted_ = false;
};

// Waits on the host until `done` (recorded after the op's device work) has completed, polling
// the communicators for asynchronous errors; aborts them on error or at the deadline.
inline void wait_for_device(cudaEvent_t done, std::span<NcclComm* const> comms,
                            const Deadline& deadline, std::string_view what) {
  auto abort_all = [&] {
    for (NcclComm* c : comms)
      if (c) c->abort();
  };
  Backoff backoff;
  while (true) {
    const cudaError_t q = cudaEventQuery(done);
    if (q == cudaSuccess) return;
    if (q != cudaErrorNotReady) {
      abort_all();
      throw CommunicationError(cuda_error_message(q, fmt::format("{} (waiting for the device)", what)));
    }
    for (NcclComm* c : comms) {
      if (!c || !c->valid()) continue;
      const ncclResult_t st = c->async_error();
      if (st != ncclSuccess && st != ncclInProgress) {
        const std::string call = c->describe(what);
        const std::string detail = c->last_error();
        abort_all();
        throw CommunicationError(nccl_error_message(st, call, detail));
      }
    }
    if (deadline.passed()) {
      abort_all();
      throw TimeoutError(fmt::format(
          "dtrain: {} did not complete on the device within {} s (DTRAIN_OP_TIMEOUT_SECONDS): a "
          "peer rank died or hangs{}",
          what, deadline.seconds(),
          comms.empty() ? "" : "; its NCCL communicators were aborted"));
    }
    backoff.pause();
  }
}

}  // namespace dtrain::detail
