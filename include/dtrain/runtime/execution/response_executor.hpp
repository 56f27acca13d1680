#pragma once
// The execution of responses on the engine thread: for each response this rank is told to run, in
// the coordinator's order, take this rank's entries of its ops out of the in-flight table, run the
// collective on the backend of their memory under the watchdog's deadline, count it, and complete
// the entries (or fail them with the response's error). Each process set this rank belongs to
// runs on communicators and backends of its own: the world's host backend is built with the
// engine, a set's when the response that creates the set runs, a device backend when the set's
// first device response arrives. Responses of sets this rank is not in are skipped without a
// call to MPI (Note [Process sets] in runtime/negotiation/coordinator.hpp).
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dtrain/core/config.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/logging.hpp"
#include "dtrain/runtime/execution/backend.hpp"
#include "dtrain/runtime/execution/engine_counters.hpp"
#include "dtrain/runtime/execution/entry.hpp"
#include "dtrain/runtime/execution/host_backend.hpp"
#include "dtrain/runtime/execution/op_state.hpp"
#include "dtrain/runtime/execution/timeline.hpp"
#include "dtrain/runtime/execution/topology.hpp"
#include "dtrain/runtime/execution/watchdog.hpp"
#include "dtrain/runtime/negotiation/messages.hpp"
#include "dtrain/runtime/negotiation/op_key.hpp"

namespace dtrain::detail {

// Tests set it before dtrain::init() on some ranks: the n-th add_process_set this rank runs fails
// after its MPI calls, as running out of communicators would (Note [Communicator limit]). 0: never.
inline int& fail_set_creation_at() noexcept {
  static int n = 0;
  return n;
}

class ResponseExecutor {
 public:
  using Clock = std::chrono::steady_clock;

  struct Context {
    int rank = 0;  // in the world
    const Config* config = nullptr;
    double op_timeout_seconds = 0;        // agreed: Note [One op deadline]
    const OwnPauses* own_pauses = nullptr;
    MPI_Comm data_comm = MPI_COMM_NULL;  // the world's
    HierarchyComms hierarchy;            // the world's
    std::vector<int> host_of_rank;       // world rank -> host index; empty: unknown
    Timeline* timeline = nullptr;  // rank 0
    EngineCounters* counters = nullptr;
    Watchdog* watchdog = nullptr;
    // This rank's entry of an op, removed from the in-flight table (null: none, e.g. joined).
    std::function<std::shared_ptr<Entry>(const OpKey& key)> take;
    std::function<std::shared_ptr<Entry>(std::int32_t process_set)> take_join;
    // Process set `id` of world ranks `ranks` exists from now on (for the submitting threads).
    std::function<void(std::int32_t id, std::vector<int> ranks)> set_created;
    // Process set `id` could not be made on every rank and does not exist.
    std::function<void(std::int32_t id)> set_not_made;
    // A join of `process_set` ended: generated names continue from `counts` (Note [Generated
    // names] in runtime/negotiation/op_names.hpp).
    std::function<void(std::int32_t process_set, const std::vector<std::uint64_t>& counts)>
        names_caught_up;
  };

  ResponseExecutor(Context context, const HostBackend::Options& host)
      : ctx_(std::move(context)), host_options_(host),
        tuned_(untuned(host.settings)) {
    SetRun& world = sets_[0];
    world.data = ctx_.data_comm;
    world.hierarchy = ctx_.hierarchy;
    world.host = std::make_unique<HostBackend>(host);
  }

  // The autotuner's settings, applied by every rank at the same response message (Note [Applying
  // tuned settings] in runtime/engine/engine_autotuner.hpp), to every set.
  void retune(const TunedSettings& tuned) {
    tuned_ = tuned;
    for (auto& [id, run] : sets_) run.host->retune(tuned);
  }
  std::uint64_t buffer_allocations() const noexcept {
    std::uint64_t n = 0;
    for (const auto& [id, run] : sets_) n += run.host ? run.host->buffer_allocations() : 0;
    return n;
  }
  // Frees the backends and the sets' communicators, before the world's (which the engine owns)
  // are freed (Note [Owned communicators] in comm/communicator.hpp).
  void release_sets() noexcept { sets_.clear(); }

  void execute(const Response& r, Clock::time_point arrival) {
    if (r.kind == OpKind::process_set) {
      create_set(r);
      return;
    }
    auto set = sets_.find(r.process_set);
    if (set == sets_.end()) return;  // not a member: nothing of this rank's, no MPI call
    SetRun& run = set->second;
    if (!r.applies_to(ctx_.rank)) return;
    if (r.kind == OpKind::join) {
      // Before join() returns: the next unnamed op pairs as on every other member.
      if (ctx_.names_caught_up) ctx_.names_caught_up(r.process_set, r.name_counts);
      std::shared_ptr<Entry> j = ctx_.take_join(r.process_set);
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
    for (const auto& name : r.names) owned.push_back(ctx_.take(OpKey{r.process_set, name}));
    if (r.error != ErrorKind::none) {
      for (auto& e : owned)
        if (e) e->state->complete(make_error(r.error, r.error_message));
      return;
    }
    entries_.clear();
    for (auto& e : owned) entries_.push_back(e.get());
    Backend* backend = run.host.get();
    if (r.device.is_cuda()) backend = device_backend(run);
    const auto started = Clock::now();
    {
      Watchdog::Scope watched(*ctx_.watchdog, r.names.empty() ? std::string() : r.names.front(),
                              to_string(r.kind), &owned);
      try {
        backend->execute(r, entries_, arrival);
      } catch (const TimeoutError& ex) {
        // The device path aborted its communicator at the deadline: this rank's engine cannot go
        // on.
        const std::string what = fmt::format("dtrain: {} '{}' on rank {} timed out: {}",
                                             r.kind, r.names.empty() ? "" : r.names.front(),
                                             ctx_.rank, ex.what());
        for (auto& e : owned)
          if (e) e->state->complete(std::make_exception_ptr(TimeoutError(what)));
        throw;  // run() fails every other op with this root cause
      } catch (const std::exception& ex) {
        // The peers are inside (or past) the same collective; this rank cannot rejoin it, and
        // returning would leave them blocked. Fail loudly instead of hanging the job.
        const std::string what = fmt::format(
            "dtrain: rank {} failed while executing {} '{}': {}. The other ranks are inside the "
            "same collective and cannot be released; aborting the job.",
            ctx_.rank, r.kind, r.names.empty() ? "" : r.names.front(), ex.what());
        log(LogLevel::fatal, "{}", what);
        for (auto& e : owned)
          if (e) e->state->complete(std::make_exception_ptr(CommunicationError(what)));
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
    }
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
      case OpKind::join:
      case OpKind::process_set: break;
    }
    return std::nullopt;
  }

  // What this rank runs one process set's responses with. Its members go in reverse order: the
  // backends before the communicators they use.
  struct SetRun {
    Communicator owned_data;       // the set's own; empty for the world's, which the engine owns
    HostHierarchy owned_hierarchy;
    MPI_Comm data = MPI_COMM_NULL;
    HierarchyComms hierarchy;  // invalid where the engine has no host layout
    std::shared_ptr<GlooGroup> gloo;  // DTRAIN_CPU_OPERATIONS=gloo: the set's own connections
    std::unique_ptr<HostBackend> host;
    std::unique_ptr<Backend> device;
  };

  Backend* device_backend(SetRun& run) {
    if (!run.device) {
      auto factory = device_backend_factory();
      if (!factory)
        throw InvalidArgumentError("dtrain: a device (CUDA) tensor reached the engine, but this "
                                   "program was built without dtrain's CUDA support: include "
                                   "<dtrain/cuda.hpp> and link dtrain::cuda");
      BackendContext ctx;
      ctx.config = ctx_.config;
      ctx.op_timeout_seconds = ctx_.op_timeout_seconds;
      ctx.own_pauses = ctx_.own_pauses;
      ctx.data_comm = run.data;
      ctx.hierarchy = run.hierarchy;
      ctx.stats = ctx_.counters;
      ctx.timeline = ctx_.timeline;
      run.device = factory(ctx);
    }
    return run.device.get();
  }

  // Runs add_process_set: every rank of the world splits the world's data communicator (one
  // collective, in the coordinator's order like any other), members keep the part that is theirs
  // and, where the engine knows the hosts, split it by host for hierarchical allreduce. Whether
  // every rank made its communicators is then agreed (Note [Communicator limit]).
  void create_set(const Response& r) {
    // An error for other ranks' submissions leaves this rank's own in flight (Note [Failed ops]).
    if (!r.applies_to(ctx_.rank)) return;
    std::shared_ptr<Entry> e = ctx_.take(OpKey{0, r.names.front()});
    if (r.error != ErrorKind::none) {
      if (e) e->state->complete(make_error(r.error, r.error_message));
      return;
    }
    const bool member = std::binary_search(r.set_ranks.begin(), r.set_ranks.end(), ctx_.rank);
    std::vector<std::shared_ptr<Entry>> owned{e};
    Watchdog::Scope watched(*ctx_.watchdog, r.names.front(), to_string(r.kind), &owned);
    SetRun run;
    std::string failure;
    try {
      run.owned_data = Communicator::split(ctx_.data_comm, member ? 0 : MPI_UNDEFINED, ctx_.rank,
                                           "MPI_Comm_split (add_process_set)");
      run.data = run.owned_data.get();
      if (member) {
        if (ctx_.hierarchy.valid() && !ctx_.host_of_rank.empty()) {
          run.owned_hierarchy =
              split_hierarchy(run.data, r.set_ranks, ctx_.host_of_rank, ctx_.rank);
          run.hierarchy = run.owned_hierarchy.comms();
        }
        if (const GlooGroup* world = host_options_.gloo_group.get()) {
          const std::string why = try_connect_gloo(run.gloo, run.data, world->requested_iface(),
                                                   world->connect_timeout_seconds());
          if (!why.empty()) throw CommunicationError(why);
        }
      }
      if (++sets_created_ == fail_set_creation_at())
        throw Error(fmt::format("MPI_Comm_split (add_process_set) failed: {}",
                                "injected failure (fail_set_creation_at)"));
    } catch (const std::exception& ex) {
      failure = ex.what();
    }
    const std::string why = agree_on_set_creation(r, failure);
    if (!why.empty()) {
      if (ctx_.set_not_made) ctx_.set_not_made(r.process_set);
      if (e) e->state->complete(std::make_exception_ptr(Error(why)));
      return;
    }
    if (member) {
      HostBackend::Options o = host_options_;
      o.comm = run.data;
      o.hierarchy = run.hierarchy;
      o.gloo_group = run.gloo;
      if (run.hierarchy.valid()) o.wait = data_wait(o.settings, run.hierarchy);
      run.host = std::make_unique<HostBackend>(o);
      run.host->retune(tuned_);
      sets_.emplace(r.process_set, std::move(run));
    }
    ctx_.set_created(r.process_set, std::vector<int>(r.set_ranks.begin(), r.set_ranks.end()));
    if (!e) return;
    if (e->set_created) e->set_created(r.process_set);
    e->state->complete();
  }

  // Note [Communicator limit]
  // An MPI library holds a bounded number of communicators per process (MPICH 4: 2048 context
  // ids), and each process set takes one on its members, three where the hosts are known (its own,
  // its in-host and its cross-host one). Past the limit MPI_Comm_split fails; MPICH agrees on a
  // new communicator's id with an allreduce inside the call, so every rank fails it together. A
  // creation that fails must fail on every rank, with the cause, and leave the engine running:
  // the ranks agree (one allgather of a flag on the world's data communicator) whether each made
  // its communicators, and if any did not, every rank frees what it made and fails the op.
  std::string agree_on_set_creation(const Response& r, const std::string& failure) {
    const int failed = failure.empty() ? 0 : 1;
    int size = 1;
    MPI_Comm_size(ctx_.data_comm, &size);
    std::vector<int> flags(static_cast<std::size_t>(size));
    MPI_Request request = MPI_REQUEST_NULL;
    mpi_check(MPI_Iallgather(&failed, 1, MPI_INT, flags.data(), 1, MPI_INT, ctx_.data_comm,
                             &request),
              "MPI_Iallgather (add_process_set)");
    host_options_.wait.wait(request, "MPI_Iallgather (add_process_set)");
    std::vector<int> failing;
    for (int k = 0; k < size; ++k)
      if (flags[static_cast<std::size_t>(k)]) failing.push_back(k);
    if (failing.empty()) return {};
    return fmt::format(
        "dtrain: add_process_set([{}]) failed: MPI could not create the set's communicators on "
        "ranks [{}]{}. MPI libraries hold a limited number of communicators per process (MPICH: "
        "2048), and each process set takes one, or three where dtrain knows the hosts; this was "
        "add_process_set call {} of this job. Process sets live until dtrain::shutdown(): create "
        "the sets you need once and reuse them.",
        fmt::join(r.set_ranks, ", "), fmt::join(failing, ", "),
        failed ? fmt::format(" (here: {})", failure) : std::string(), sets_created_);
  }

  Context ctx_;
  HostBackend::Options host_options_;  // the world's; a set's differ in their communicators
  // In effect now, for the sets made later (hierarchical is what was asked for: a set's backend
  // also needs host communicators).
  TunedSettings tuned_;
  std::map<std::int32_t, SetRun> sets_;  // the sets this rank is a member of, by id
  std::vector<Entry*> entries_;  // of the response being executed, reused
  int sets_created_ = 0;         // add_process_set responses run, failed ones included
};

}  // namespace dtrain::detail
