#pragma once
// The background engine: one thread per process that negotiates, fuses and executes ops.
// See Note [Negotiation] and Note [Batching] in runtime/negotiation/coordinator.hpp.
// The loop waits as Note [Waiting without burning cores] (runtime/engine/wait_policy.hpp) says.
#include <mpi.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "dtrain/core/config.hpp"
#include "dtrain/core/logging.hpp"
#include "dtrain/runtime/engine/agreement.hpp"
#include "dtrain/runtime/engine/control_channel.hpp"
#include "dtrain/runtime/engine/debug_trail.hpp"
#include "dtrain/runtime/engine/engine_autotuner.hpp"
#include "dtrain/runtime/engine/host_library.hpp"
#include "dtrain/runtime/engine/in_flight_table.hpp"
#include "dtrain/runtime/engine/thread_cpu_clock.hpp"
#include "dtrain/runtime/engine/wait_policy.hpp"
#include "dtrain/runtime/engine_stats.hpp"
#include "dtrain/runtime/execution/backend.hpp"
#include "dtrain/runtime/execution/engine_counters.hpp"
#include "dtrain/runtime/execution/host_backend.hpp"
#include "dtrain/runtime/execution/liveness.hpp"
#include "dtrain/runtime/execution/op_state.hpp"
#include "dtrain/runtime/execution/response_executor.hpp"
#include "dtrain/runtime/execution/topology.hpp"
#include "dtrain/runtime/execution/watchdog.hpp"
#include "dtrain/runtime/negotiation/coordinator.hpp"
#include "dtrain/runtime/negotiation/op_names.hpp"
#include "dtrain/runtime/negotiation/response_cache.hpp"

namespace dtrain {

namespace detail {

class Engine {
 public:
  // `topology` (optional) gives the host hierarchy for DTRAIN_HIERARCHICAL_ALLREDUCE and the
  // device backend; the engine keeps its own duplicates of its communicators.
  Engine(const Config& config, MPI_Comm world, const Topology* topology = nullptr)
      : config_(config),
        control_(Communicator::duplicate(world)),
        data_(Communicator::duplicate(world)) {
    MPI_Comm_rank(world, &rank_);
    MPI_Comm_size(world, &size_);
    if (topology) hierarchy_ = duplicate_hierarchy(*topology);
    std::string setup_error;
    if (rank_ == 0) {
      const CoordinatorOptions o{config, config, size_};
      CoordinatorHooks hooks;
      hooks.rank_ready = [this](const std::string& name, int r, Clock::time_point t) {
        if (timeline_.active()) timeline_.rank_ready(name, r, t);
      };
      hooks.negotiated = [this](const std::string& name, OpKind kind, Clock::time_point started,
                                Clock::time_point t) {
        if (timeline_.active())
          timeline_.span(name, negotiation_phase(to_string(kind)), started, t);
      };
      hooks.stall_warning = [this](const std::string& report) {
        log(LogLevel::warning, "{}", report);
      };
      coordinator_.emplace(o, std::move(hooks));
      if (!config.timeline_path.empty()) {
        try {
          timeline_.start(config.timeline_path, config.timeline_max_bytes, config.timeline_mark_cycles);
        } catch (const std::exception& e) {
          setup_error = e.what();
        }
      }
    }
    // Without the host layout, assume the worst: every rank on this host.
    const HierarchyComms hierarchy = hierarchy_.comms();
    const int ranks_on_host = hierarchy.valid() ? hierarchy.layout.local_size : size_;
    const AgreedSettings agreed =
        agree_on_settings(config, direct_pays(ranks_on_host), control_.get());
    if (rank_ == 0)
      for (const auto& w : agreed.warnings) log(LogLevel::warning, "{}", w);
    // Rank 0's setup can fail on its own (an unwritable DTRAIN_TIMELINE path). Init must then fail
    // on every rank: the others would otherwise wait forever for a coordinator that never started.
    std::string why = agree_on_setup(std::move(setup_error), control_.get());
    if (!agreed.error.empty()) why = agreed.error;
    HostBackend::Options ho;  // Note [Gloo on the host path] in comm/gloo_group.hpp
    if (why.empty())
      why = connect_host_library(
          choose_host_library(config, topology ? topology->machines : 1, gloo_built),
          ho.gloo_group, data_.get(), control_.get(), config.gloo_iface,
          agreed.op_timeout_seconds);
    if (!why.empty()) throw InvalidArgumentError(why);
    ho.comm = data_.get();
    ho.settings = config;
    ho.timeline = rank_ == 0 ? &timeline_ : nullptr;
    ho.stats = &counters_;
    ho.hierarchy = hierarchy;
    ho.direct_segments = agreed.direct_segments;
    ho.wait = data_wait(config, hierarchy);
    direct_segments_ = agreed.direct_segments;
    ResponseExecutor::Context ec;
    ec.rank = rank_;
    ec.config = &config_;
    ec.data_comm = data_.get();
    ec.hierarchy = hierarchy;
    if (topology) ec.host_of_rank = topology->host_of_rank;
    ec.timeline = rank_ == 0 ? &timeline_ : nullptr;
    ec.counters = &counters_;
    ec.take = [this](const OpKey& key) {
      std::lock_guard lock(mutex_);
      return table_.take(key);
    };
    ec.take_join = [this](std::int32_t process_set) {
      std::lock_guard lock(mutex_);
      return table_.take_join(process_set);
    };
    ec.set_not_made = [this](std::int32_t id) {
      if (coordinator_) coordinator_->forget_set(id);  // rank 0, on the engine thread
    };
    ec.names_caught_up = [this](std::int32_t id, const std::vector<std::uint64_t>& counts) {
      namer_.catch_up(id, counts);
    };
    ec.set_created = [this](std::int32_t id, std::vector<int> ranks) {
      std::lock_guard lock(mutex_);
      process_sets_.emplace(id, std::make_shared<const std::vector<int>>(std::move(ranks)));
    };
    {
      std::vector<int> everyone(static_cast<std::size_t>(size_));
      for (int r = 0; r < size_; ++r) everyone[static_cast<std::size_t>(r)] = r;
      process_sets_.emplace(0, std::make_shared<const std::vector<int>>(std::move(everyone)));
    }
    if (rank_ == 0 && config.autotune) {
      std::vector<int> ranks_per_host =
          topology && !topology->layout.local_sizes.empty() ? topology->layout.local_sizes
                                                            : std::vector<int>{size_};
      autotuner_.emplace(config, std::move(ranks_per_host), ho.gloo_group != nullptr);
    }
    if (size_ > 1) {
      std::vector<std::string> hosts;
      for (int r = 0; r < size_; ++r)
        hosts.push_back(topology ? topology->host_names.at(static_cast<std::size_t>(r)) : "?");
      monitor_.emplace(world, std::move(hosts),
                       std::chrono::duration_cast<Clock::duration>(
                           std::chrono::duration<double>(agreed.peer_timeout_seconds)));
    }
    channel_.emplace(control_.get());
    watchdog_.emplace(agreed.op_timeout_seconds, rank_, monitor_ ? &*monitor_ : nullptr,
                      [this](const std::string& why) { fail_everything(why); });
    ec.watchdog = &*watchdog_;
    ec.op_timeout_seconds = agreed.op_timeout_seconds;  // Note [One op deadline]
    ec.own_pauses = &watchdog_->own_pauses();
    executor_.emplace(std::move(ec), ho);
    thread_ = std::thread([this] { run(); });
  }

  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Only for an engine whose thread has exited (shutdown() returned true, or it never started
  // the collective protocol): a thread blocked inside MPI keeps using it.
  ~Engine() {
    if (thread_.joinable()) {
      // Destroyed without shutdown(): stop locally without the collective protocol.
      abandon();
      thread_.join();
    }
    if (watchdog_) watchdog_->stop();
    timeline_.stop();
    release_communicators();
  }

  // After a clean shutdown(): frees the MPI resources while the object may live on (a thread that
  // raced with shutdown may still hold it; it only ever sees ShutdownError).
  void release_communicators() noexcept {
    if (executor_) executor_->release_sets();  // before the communicators they were split from
    if (monitor_ && !peer_lost()) monitor_->close(/*all_closing=*/!failed());
    hierarchy_.local.reset();
    hierarchy_.cross.reset();
    control_.reset();
    data_.reset();
  }

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  const Config& config() const noexcept { return config_; }
  // Whether fused responses reduce large tensors in their own memory (agreed at init).
  bool direct_segments() const noexcept { return direct_segments_; }

  // The world ranks of process set `id` (ascending), or null for a set this engine does not know
  // (Note [Process sets] in runtime/negotiation/coordinator.hpp).
  std::shared_ptr<const std::vector<int>> process_set_ranks(std::int32_t id) const {
    std::lock_guard lock(mutex_);
    auto it = process_sets_.find(id);
    return it == process_sets_.end() ? nullptr : it->second;
  }

  // Note [Generated names] in runtime/negotiation/op_names.hpp.
  std::string generate_name(OpKind kind, std::int32_t process_set = 0) {
    if (auto name = namer_.next(kind, process_set)) return std::move(*name);
    const std::string why = OpNamer::why_refused(rank_, kind);
    end_job(why);
    throw InvalidArgumentError(why);
  }

  // Ends the job on every rank with `why` as the root cause: the coordinator hands it to every
  // engine, which then fails all its ops with it (Note [Engine failure]).
  void end_job(const std::string& why) noexcept {
    {
      std::lock_guard lock(mutex_);
      if (!fatal_.empty() || shutdown_requested_ || !job_ending_.empty()) return;
      job_ending_ = why;
    }
    cv_.notify_all();
  }

  // Submits `name` as rejected by this rank, so the peers' ops of that name fail at once instead of
  // waiting for it (Note [Failed ops]). The caller then throws its own error.
  void reject(const std::string& name, OpKind kind, const std::string& why,
              const std::string& group = {}, std::int32_t process_set = 0) noexcept {
    try {
      auto e = std::make_shared<Entry>();
      e->request.name = name;
      e->request.kind = kind;
      e->request.group = group;
      e->request.process_set = process_set;
      e->request.dtype = DataType::uint8;
      e->request.shape = {0};
      e->request.rejected = why.rfind("dtrain: ", 0) == 0 ? why.substr(8) : why;
      e->state = std::make_shared<OpState>();
      submit(std::move(e));
    } catch (...) {
      // The engine has stopped or the name is in flight: the caller's own error is what matters.
    }
  }

  // Enqueues ops; the engine thread picks them up at once. All or nothing: throws, submitting
  // none, for a duplicate in-flight name or when the engine has stopped.
  void submit_all(std::vector<std::shared_ptr<Entry>> entries) {
    while (true) {
      std::shared_ptr<OpState> rejection;  // of the same name, still being settled
      std::string across_threads;          // Note [In-flight table]: ends the job
      {
        std::lock_guard lock(mutex_);
        throw_if_stopped();
        try {
          rejection = table_.add(entries, rank_, Clock::now());
        } catch (const NameInFlightOnAnotherThread& e) {
          across_threads = e.what();
        }
        if (!rejection && across_threads.empty()) {
          if (log_enabled(LogLevel::debug))
            for (const auto& e : entries) log_submission(rank_, e->request);
          break;
        }
      }
      if (!across_threads.empty()) {
        log(LogLevel::error, "{}", across_threads);
        end_job(across_threads);
        throw InvalidArgumentError(across_threads);
      }
      // A rejection is settled by the coordinator's answer within a round trip.
      try {
        rejection->wait();
      } catch (const Error&) {
      }
    }
    cv_.notify_all();  // the engine thread, and no one else, waits for new work
  }
  void submit(std::shared_ptr<Entry> e) {
    std::vector<std::shared_ptr<Entry>> one;
    one.push_back(std::move(e));
    submit_all(std::move(one));
  }

  enum class ShutdownOutcome {
    clean,          // every rank shut down together
    after_failure,  // the engine had failed (Note [Engine failure]); its thread has exited
    blocked,        // the engine thread is blocked inside MPI for good: leave the engine alive
  };

  // Collective: returns once every rank has called it. After a failure (Note [Engine failure]) it
  // is local.
  ShutdownOutcome shutdown() {
    {
      std::lock_guard lock(mutex_);
      shutdown_requested_ = true;
      if (!fatal_.empty()) abandon_ = true;
    }
    cv_.notify_all();
    const bool exited = wait_for_engine_thread();
    if (watchdog_) watchdog_->stop();
    timeline_.stop();
    if (!exited) return ShutdownOutcome::blocked;
    return failed() ? ShutdownOutcome::after_failure : ShutdownOutcome::clean;
  }

  // A peer died or left (Note [Peer liveness]): MPI calls that involve every rank may never return.
  bool peer_lost() const noexcept { return watchdog_ && watchdog_->peer_lost(); }

  // True once the engine has failed for good (Note [Engine failure]).
  bool failed() const {
    std::lock_guard lock(mutex_);
    return !fatal_.empty();
  }

  // This rank leaves without shutdown(): tells the peers (Note [Peer liveness]).
  void announce_exit(const std::string& why) noexcept {
    if (monitor_) monitor_->announce_exit(why);
  }

  void start_timeline(const std::string& path) {
    if (rank_ == 0)
      timeline_.start(path, config_.timeline_max_bytes, config_.timeline_mark_cycles);
  }
  void stop_timeline() { timeline_.stop(); }

  EngineStats stats() const {
    EngineStats s = counters_.snapshot();
    s.buffer_allocations = executor_->buffer_allocations();
    s.engine_cpu_ns = cpu_clock_.read(const_cast<std::thread&>(thread_));  // Note [Engine CPU time]
    return s;
  }


 private:
  void throw_if_stopped() const {
    if (!fatal_.empty()) throw ShutdownError(fatal_);
    if (shutdown_requested_)
      throw ShutdownError(fmt::format("dtrain: rank {} has called dtrain::shutdown(); no new ops "
                                      "can be submitted on it", rank_));
  }

  // ---- the engine thread: runtime/engine/engine_loop.hpp ----------------------------------------
  void run();
  void loop();
  bool awaiting_peers();
  void wait_for_work(Clock::duration idle_for);
  void send_requests(const std::vector<std::shared_ptr<Entry>>& fresh, bool shutdown,
                     std::string ending);
  bool receive_requests();
  void tune(const ResponseMessage& msg, std::uint64_t bytes, Clock::time_point planned);
  bool apply(const ResponseMessage& msg);
  void publish_coordinator_stats();

  void abandon() {
    {
      std::lock_guard lock(mutex_);
      abandon_ = true;
    }
    cv_.notify_all();
  }
  // Joins the engine thread unless it is stuck in MPI after a failure (Note [Engine failure]).
  bool wait_for_engine_thread() {
    if (!thread_.joinable()) return true;
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [&] { return thread_exited_ || !fatal_.empty(); });
    if (!thread_exited_) {
      abandon_ = true;
      cv_.notify_all();
      cv_.wait_for(lock, std::chrono::seconds(2), [&] { return thread_exited_; });
    }
    const bool exited = thread_exited_;
    lock.unlock();
    if (!exited) return false;
    thread_.join();
    return true;
  }

  // Note [Engine failure]
  // Some failures leave this rank's engine unable to go on: a collective that outlived
  // DTRAIN_OP_TIMEOUT_SECONDS after every rank had submitted it (MPI cannot cancel it, so the
  // engine thread stays inside it), a device communicator aborted at its deadline, a dead peer
  // (Note [Peer liveness]), a stall shutdown. The op concerned fails with its own error
  // (TimeoutError for a deadline), every other op, in flight or submitted later, with a
  // ShutdownError carrying that first cause; the process stays free to save what it needs and exit.
  // shutdown() is then local: it does not wait for peers, leaves a blocked engine thread where it
  // is, and does not finalize MPI (which could block on the same peers).
  //
  // The watchdog (runtime/execution/watchdog.hpp) and the engine thread both end up here.
  void fail_everything(const std::string& why) {
    std::vector<std::shared_ptr<Entry>> victims;
    {
      std::lock_guard lock(mutex_);
      if (fatal_.empty()) fatal_ = why;
      victims = table_.drain();
    }
    cv_.notify_all();
    log(LogLevel::error, "{}", why);
    for (auto& e : victims) e->state->complete(std::make_exception_ptr(ShutdownError(why)));
  }

  Config config_;
  Communicator control_;
  Communicator data_;
  HostHierarchy hierarchy_;  // empty without a topology
  int rank_ = 0, size_ = 1;
  bool direct_segments_ = false;

  mutable std::mutex mutex_;  // guards everything the user threads touch
  std::condition_variable cv_;
  InFlightTable table_;
  // By id: the world ranks of every process set this rank has run the creation of, the world's
  // (0) included. Members or not: a non-member's use of a set is refused by name.
  std::unordered_map<std::int32_t, std::shared_ptr<const std::vector<int>>> process_sets_;
  bool shutdown_requested_ = false;
  bool shutdown_sent_ = false;
  bool abandon_ = false;
  bool thread_exited_ = false;
  std::string fatal_;
  std::string job_ending_;  // for the coordinator: end the job on every rank (end_job)

  std::optional<Coordinator> coordinator_;
  std::optional<EngineAutotuner> autotuner_;      // rank 0, with DTRAIN_AUTOTUNE
  std::optional<TunedSettings> pending_tuned_;    // for the next response message
  Timeline timeline_;

  std::optional<ControlChannel> channel_;
  CacheMirror mirror_;
  std::uint64_t responses_applied_ = 0;
  WaitPolicy wait_policy_;

  EngineCounters counters_;
  ThreadCpuClock cpu_clock_;  // the engine thread's (Note [Engine CPU time])
  OpNamer namer_;  // Note [Generated names]: constructed on the thread that calls init()

  std::optional<PeerMonitor> monitor_;

  std::optional<Watchdog> watchdog_;  // after everything it reads: destroyed (joined) first
  std::optional<ResponseExecutor> executor_;  // uses the watchdog
  std::thread thread_;
};

}  // namespace detail
}  // namespace dtrain

#include "dtrain/runtime/engine/engine_loop.hpp"  // the engine thread's member functions
