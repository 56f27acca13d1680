#pragma once
// The execution of responses on the engine thread: for each response this rank is told to run, in
// the coordinator's order, take this rank's entries of its ops out of the in-flight table, run the
// collective on the backend of their memory under the watchdog's deadline, count it, and complete
// the entries (or fail them with the response's error). The host backend is built with the
// engine; a device backend when the first device response arrives.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "dtrain/core/config.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/logging.hpp"
#include "dtrain/runtime/backend.hpp"
#include "dtrain/runtime/engine_counters.hpp"
#include "dtrain/runtime/entry.hpp"
#include "dtrain/runtime/host_backend.hpp"
#include "dtrain/runtime/messages.hpp"
#include "dtrain/runtime/op_state.hpp"
#include "dtrain/runtime/timeline.hpp"
#include "dtrain/runtime/watchdog.hpp"

namespace dtrain::detail {

class ResponseExecutor {
 public:
  using Clock = std::chrono::steady_clock;

  struct Context {
    int rank = 0;
    const Config* config = nullptr;
    MPI_Comm data_comm = MPI_COMM_NULL;
    HierarchyComms hierarchy;
    Timeline* timeline = nullptr;  // rank 0
    EngineCounters* counters = nullptr;
    Watchdog* watchdog = nullptr;
    // This rank's entry of an op, removed from the in-flight table (null: none, e.g. joined).
    std::function<std::shared_ptr<Entry>(const std::string& name)> take;
    std::function<std::shared_ptr<Entry>()> take_join;
  };

  ResponseExecutor(Context context, const HostBackend::Options& host)
      : ctx_(std::move(context)), host_(host) {}

  HostBackend& host() noexcept { return host_; }
  const HostBackend& host() const noexcept { return host_; }
  // Before the communicators a device backend may use are freed.
  void release_device() noexcept { device_.reset(); }

  void execute(const Response& r, Clock::time_point arrival) {
    if (!r.applies_to(ctx_.rank)) return;
    if (r.kind == OpKind::join) {
      std::shared_ptr<Entry> j = ctx_.take_join();
      if (!j) return;
      if (r.error != ErrorKind::none) {
        j->state->complete(make_error(r.error, r.error_message));
      } else {
        j->set_last_joined(r.last_joined_rank);
        j->state->complete();
      }
      return;
    }
    std::vector<std::shared_ptr<Entry>> owned;
    owned.reserve(r.names.size());
    for (const auto& name : r.names) owned.push_back(ctx_.take(name));
    if (r.error != ErrorKind::none) {
      for (auto& e : owned)
        if (e) e->state->complete(make_error(r.error, r.error_message));
      return;
    }
    entries_.clear();
    for (auto& e : owned) entries_.push_back(e.get());
    Backend* backend = &host_;
    if (r.device.is_cuda()) backend = device_backend();
    ctx_.watchdog->executing(r.names.empty() ? std::string() : r.names.front(), to_string(r.kind), &owned);
    const auto started = Clock::now();
    try {
      backend->execute(r, entries_, arrival);
    } catch (const TimeoutError& ex) {
      // The device path aborted its communicator at the deadline: this rank's engine cannot go on.
      const std::string what = fmt::format("dtrain: {} '{}' on rank {} timed out: {}",
                                           r.kind, r.names.empty() ? "" : r.names.front(),
                                           ctx_.rank, ex.what());
      for (auto& e : owned)
        if (e) e->state->complete(std::make_exception_ptr(TimeoutError(what)));
      ctx_.watchdog->finished();
      throw;  // run() fails every other op with this root cause
    } catch (const std::exception& ex) {
      // The peers are inside (or past) the same collective; this rank cannot rejoin it, and
      // returning would leave them blocked. Fail loudly instead of hanging the job.
      const std::string what = fmt::format(
          "dtrain: rank {} failed while executing {} '{}': {}. The other ranks are inside the same "
          "collective and cannot be released; aborting the job.",
          ctx_.rank, r.kind, r.names.empty() ? "" : r.names.front(), ex.what());
      log(LogLevel::fatal, "{}", what);
      for (auto& e : owned)
        if (e) e->state->complete(std::make_exception_ptr(CommunicationError(what)));
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    ctx_.watchdog->finished();
    count_completed(r, owned, arrival, started);
    for (auto& e : owned)
      if (e) e->state->complete();
  }

 private:
  static std::exception_ptr make_error(ErrorKind kind, const std::string& what) {
    switch (kind) {
      case ErrorKind::mismatch: return std::make_exception_ptr(MismatchError(what));
      case ErrorKind::invalid_argument: return std::make_exception_ptr(InvalidArgumentError(what));
      case ErrorKind::timeout: return std::make_exception_ptr(TimeoutError(what));
      case ErrorKind::shutdown:
      case ErrorKind::none: break;
    }
    return std::make_exception_ptr(ShutdownError(what));
  }

  // The per-kind and timing counters of EngineStats, for one response this rank executed.
  void count_completed(const Response& r, const std::vector<std::shared_ptr<Entry>>& owned,
                       Clock::time_point arrival, Clock::time_point started) {
    const auto ns = [](Clock::duration d) {
      return static_cast<std::uint64_t>(std::max<std::int64_t>(
          0, std::chrono::duration_cast<std::chrono::nanoseconds>(d).count()));
    };
    ctx_.counters->add(Counter::collective_ns, ns(Clock::now() - started));
    const auto es = static_cast<std::uint64_t>(element_size(r.dtype));
    std::uint64_t bytes = 0, tensors = 0, negotiation = 0;
    for (const auto& e : owned) {
      if (!e) continue;
      bytes += static_cast<std::uint64_t>(e->request.numel()) * es;
      ++tensors;
      negotiation += ns(arrival - e->submitted);
    }
    if (auto c = bytes_counter(r.kind)) ctx_.counters->add(*c, bytes);
    if (r.names.size() > 1) {
      ctx_.counters->add(Counter::fused_bytes, bytes);
      ctx_.counters->add(Counter::fused_tensors_executed, tensors);
    }
    ctx_.counters->add(Counter::negotiation_ns, negotiation);
  }

  static std::optional<Counter> bytes_counter(OpKind kind) {
    switch (kind) {
      case OpKind::allreduce: return Counter::allreduce_bytes;
      case OpKind::allgather: return Counter::allgather_bytes;
      case OpKind::broadcast: return Counter::broadcast_bytes;
      case OpKind::alltoall: return Counter::alltoall_bytes;
      case OpKind::reducescatter: return Counter::reducescatter_bytes;
      case OpKind::barrier:
      case OpKind::join: break;
    }
    return std::nullopt;
  }

  Backend* device_backend() {
    if (!device_) {
      auto factory = device_backend_factory();
      if (!factory)
        throw InvalidArgumentError("dtrain: a device (CUDA) tensor reached the engine, but this "
                                   "program was built without dtrain's CUDA support: include "
                                   "<dtrain/cuda.hpp> and link dtrain::cuda");
      BackendContext ctx;
      ctx.config = ctx_.config;
      ctx.data_comm = ctx_.data_comm;
      ctx.hierarchy = ctx_.hierarchy;
      ctx.stats = ctx_.counters;
      ctx.timeline = ctx_.timeline;
      device_ = factory(ctx);
    }
    return device_.get();
  }


  Context ctx_;
  HostBackend host_;
  std::unique_ptr<Backend> device_;
  std::vector<Entry*> entries_;  // of the response being executed, reused
};

}  // namespace dtrain::detail
