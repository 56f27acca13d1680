#pragma once
// The background engine: one thread per process that negotiates, fuses and executes ops.
// See Note [Negotiation] and Note [Batching] in runtime/coordinator.hpp.
// The loop waits as Note [Waiting without burning cores] (runtime/wait_policy.hpp) says.
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
#include "dtrain/runtime/agreement.hpp"
#include "dtrain/runtime/autotuning.hpp"
#include "dtrain/runtime/backend.hpp"
#include "dtrain/runtime/control_channel.hpp"
#include "dtrain/runtime/coordinator.hpp"
#include "dtrain/runtime/engine_stats.hpp"
#include "dtrain/runtime/host_backend.hpp"
#include "dtrain/runtime/liveness.hpp"
#include "dtrain/runtime/op_state.hpp"
#include "dtrain/runtime/response_cache.hpp"
#include "dtrain/runtime/topology.hpp"
#include "dtrain/runtime/wait_policy.hpp"
#include "dtrain/runtime/watchdog.hpp"

namespace dtrain {

namespace detail {

class Engine {
 public:
  // `topology` (optional) gives the host hierarchy for DTRAIN_HIERARCHICAL_ALLREDUCE and the
  // device backend; the engine keeps its own duplicates of its communicators.
  Engine(const Config& config, MPI_Comm world, const Topology* topology = nullptr)
      : config_(config) {
    mpi_check(MPI_Comm_dup(world, &control_), "MPI_Comm_dup");
    mpi_check(MPI_Comm_dup(world, &data_), "MPI_Comm_dup");
    MPI_Comm_set_errhandler(control_, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(data_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(world, &rank_);
    MPI_Comm_size(world, &size_);
    if (topology) hierarchy_ = make_hierarchy(*topology);
    std::string setup_error;
    if (rank_ == 0) {
      CoordinatorOptions o;
      o.size = size_;
      o.fusion_threshold_bytes = config.fusion_threshold_bytes;
      o.cycle_time_ms = config.cycle_time_ms;
      o.cache_capacity = config.cache_capacity;
      o.stall_check_disable = config.stall_check_disable;
      o.stall_check_time_seconds = config.stall_check_time_seconds;
      o.stall_shutdown_time_seconds = config.stall_shutdown_time_seconds;
      o.op_timeout_seconds = config.op_timeout_seconds;
      CoordinatorHooks hooks;
      hooks.rank_ready = [this](const std::string& name, int r, Clock::time_point t) {
        if (timeline_.active()) timeline_.rank_ready(name, r, t);
      };
      hooks.negotiated = [this](const std::string& name, OpKind kind, Clock::time_point started,
                                Clock::time_point t) {
        if (timeline_.active())
          timeline_.span(name, fmt::format("NEGOTIATE_{}", upper(to_string(kind))), started, t);
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
    const int ranks_on_host = hierarchy_.valid() ? hierarchy_.local_size : size_;
    const AgreedSettings agreed = agree_on_settings(config, direct_pays(ranks_on_host), control_);
    if (rank_ == 0)
      for (const auto& w : agreed.warnings) log(LogLevel::warning, "{}", w);
    // Rank 0's setup can fail on its own (an unwritable DTRAIN_TIMELINE path). Init must then fail
    // on every rank: the others would otherwise wait forever for a coordinator that never started.
    std::string why = agree_on_setup(std::move(setup_error));
    if (!agreed.error.empty()) why = agreed.error;
    if (!why.empty()) {
      if (hierarchy_.local != MPI_COMM_NULL) MPI_Comm_free(&hierarchy_.local);
      if (hierarchy_.cross != MPI_COMM_NULL) MPI_Comm_free(&hierarchy_.cross);
      MPI_Comm_free(&control_);
      MPI_Comm_free(&data_);
      throw InvalidArgumentError(why);
    }
    HostBackend::Options ho;
    ho.comm = data_;
    ho.chunk_bytes = config.mpi_chunk_bytes;
    ho.pipeline = config.fusion_pipeline;
    ho.timeline = rank_ == 0 ? &timeline_ : nullptr;
    ho.stats = &backend_stats_;
    ho.hierarchical = config.hierarchical_allreduce && hierarchy_.valid();
    ho.hierarchy = hierarchy_;
    ho.direct_segments = agreed.direct_segments;
    direct_segments_ = agreed.direct_segments;
    host_ = std::make_unique<HostBackend>(ho);
    if (rank_ == 0 && config.autotune) {
      std::vector<int> ranks_per_host =
          topology && !topology->local_sizes.empty() ? topology->local_sizes : std::vector<int>{size_};
      autotuner_.emplace(config, std::move(ranks_per_host));
    }
    if (size_ > 1) {
      std::vector<std::string> hosts;
      for (int r = 0; r < size_; ++r)
        hosts.push_back(topology ? topology->host_names.at(static_cast<std::size_t>(r)) : "?");
      monitor_.emplace(world, std::move(hosts),
                       std::chrono::duration_cast<Clock::duration>(
                           std::chrono::duration<double>(agreed.peer_timeout_seconds)));
    }
    channel_.emplace(control_);
    watchdog_.emplace(agreed.op_timeout_seconds, rank_, monitor_ ? &*monitor_ : nullptr,
                      [this](const std::string& why) { fail_everything(why); });
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
    device_.reset();  // before the communicators it may use
    if (monitor_ && !peer_lost()) monitor_->close(/*all_closing=*/!failed());
    if (hierarchy_.local != MPI_COMM_NULL) MPI_Comm_free(&hierarchy_.local);
    if (hierarchy_.cross != MPI_COMM_NULL) MPI_Comm_free(&hierarchy_.cross);
    if (control_ != MPI_COMM_NULL) MPI_Comm_free(&control_);
    if (data_ != MPI_COMM_NULL) MPI_Comm_free(&data_);
  }

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  const Config& config() const noexcept { return config_; }
  // Whether fused responses reduce large tensors in their own memory (agreed at init).
  bool direct_segments() const noexcept { return direct_segments_; }

  // Note [Generated names]
  // An op without a name is called "<kind>.<n>" after a per-kind call count, so ranks pair their
  // n-th unnamed allreduce. That holds only while every rank counts the same calls in the same
  // order: one thread's program order gives that, several threads' interleaving does not (it
  // differs from rank to rank, and so would which thread happens to call first). So unnamed calls
  // belong to the thread that called dtrain::init(), which is the same thread of the program on
  // every rank; other threads name their ops. An unnamed call from another thread is not counted
  // (counting it would shift the owner's later names by a different amount on each rank) and ends
  // the job on every rank (RequestMessage::fatal): the program expected that call to pair with
  // one on each peer, and a peer that made it from its init thread would otherwise go on pairing
  // its calls with unrelated ones.
  std::string generate_name(OpKind kind) {
    if (std::this_thread::get_id() != init_thread_) {
      const std::string why = fmt::format(
          "dtrain: rank {} made an unnamed {} from a thread other than the one that called "
          "dtrain::init(). Unnamed ops are paired across ranks by the order in which the init "
          "thread makes them, so a call from another thread cannot be paired safely, and dtrain "
          "stops on every rank. Give ops called from other threads explicit names "
          "(AllreduceOptions::name, the name argument).",
          rank_, kind);
      end_job(why);
      throw InvalidArgumentError(why);
    }
    return fmt::format("{}.{}", kind,
                       name_counters_[static_cast<int>(kind)].fetch_add(1, std::memory_order_relaxed));
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
              const std::string& group = {}) noexcept {
    try {
      auto e = std::make_shared<Entry>();
      e->request.name = name;
      e->request.kind = kind;
      e->request.group = group;
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
      {
        std::lock_guard lock(mutex_);
        throw_if_stopped();
        for (std::size_t i = 0; i < entries.size() && !rejection; ++i) {
          const auto& q = entries[i]->request;
          if (q.kind == OpKind::join) {
            if (join_entry_) throw InvalidArgumentError("dtrain: join() is already in flight on this rank");
            continue;
          }
          auto it = in_flight_.find(q.name);
          if (it != in_flight_.end() && !it->second->request.rejected.empty()) {
            rejection = it->second->state;
            break;
          }
          bool repeated = it != in_flight_.end();
          for (std::size_t j = 0; j < i && !repeated; ++j) repeated = entries[j]->request.name == q.name;
          if (repeated)
            throw InvalidArgumentError(fmt::format(
                "dtrain: an op named '{}' is already in flight on rank {}: names must be unique "
                "among in-flight ops (wait for the first one, or give the second a different name)",
                q.name, rank_));
        }
        if (!rejection) {
          const auto now = Clock::now();
          for (auto& e : entries) {
            e->submitted = now;
            if (log_enabled(LogLevel::debug)) log_submission(e->request);
            if (e->request.kind == OpKind::join) join_entry_ = e;
            else in_flight_.emplace(e->request.name, e);
            incoming_.push_back(std::move(e));
          }
          break;
        }
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
    EngineStats s;
    s.collectives = backend_stats_.collectives.load();
    s.fused_collectives = backend_stats_.fused_collectives.load();
    s.bytes_reduced = backend_stats_.bytes_reduced.load();
    s.buffer_allocations = host_->buffer_allocations();
    s.hierarchical_collectives = backend_stats_.hierarchical_collectives.load();
    s.cache_ids_sent = cache_ids_sent_.load();
    s.requests_sent = requests_sent_.load();
    s.allreduce_bytes = op_stats_.kind_bytes[static_cast<int>(OpKind::allreduce)].load();
    s.allgather_bytes = op_stats_.kind_bytes[static_cast<int>(OpKind::allgather)].load();
    s.broadcast_bytes = op_stats_.kind_bytes[static_cast<int>(OpKind::broadcast)].load();
    s.alltoall_bytes = op_stats_.kind_bytes[static_cast<int>(OpKind::alltoall)].load();
    s.reducescatter_bytes = op_stats_.kind_bytes[static_cast<int>(OpKind::reducescatter)].load();
    s.fused_bytes = op_stats_.fused_bytes.load();
    s.fused_tensors_executed = op_stats_.fused_tensors.load();
    s.negotiation_ns = op_stats_.negotiation_ns.load();
    s.collective_ns = op_stats_.collective_ns.load();
    std::lock_guard lock(coordinator_stats_mutex_);
    s.responses = coordinator_stats_.responses;
    s.fused_tensors = coordinator_stats_.fused_tensors;
    s.cache_hits = coordinator_stats_.cache_hits;
    s.stall_warnings = coordinator_stats_.stall_warnings;
    s.wait_for_slowest_ns = coordinator_stats_.wait_for_slowest_ns;
    return s;
  }

 private:
  static std::string upper(std::string_view s) {
    std::string out(s);
    for (auto& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    return out;
  }

  static HierarchyComms make_hierarchy(const Topology& t) {
    HierarchyComms h;
    mpi_check(MPI_Comm_dup(t.local_comm, &h.local), "MPI_Comm_dup");
    mpi_check(MPI_Comm_dup(t.cross_comm, &h.cross), "MPI_Comm_dup");
    MPI_Comm_set_errhandler(h.local, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(h.cross, MPI_ERRORS_RETURN);
    h.local_rank = t.local_rank;
    h.local_size = t.local_size;
    h.cross_rank = t.cross_rank;
    h.cross_size = t.cross_size;
    h.hosts = static_cast<int>(t.local_sizes.size());
    h.parts = t.local_sizes.empty() ? 1 : *std::min_element(t.local_sizes.begin(), t.local_sizes.end());
    h.homogeneous = t.homogeneous;
    return h;
  }

  // Rank 0's setup error (empty: none), as every rank learns it.
  std::string agree_on_setup(std::string error) const {
    std::uint64_t n = error.size();
    mpi_check(MPI_Bcast(&n, 1, MPI_UINT64_T, 0, control_), "MPI_Bcast");
    error.resize(n);
    if (n > 0)
      mpi_check(MPI_Bcast(error.data(), static_cast<int>(n), MPI_CHAR, 0, control_), "MPI_Bcast");
    return error;
  }

  void throw_if_stopped() const {
    if (!fatal_.empty()) throw ShutdownError(fatal_);
    if (shutdown_requested_)
      throw ShutdownError(fmt::format("dtrain: rank {} has called dtrain::shutdown(); no new ops "
                                      "can be submitted on it", rank_));
  }

  // ---- the engine thread ----------------------------------------------------------------------

  void run() {
    lower_timer_slack();  // Note [Waiting without burning cores]
    try {
      loop();
    } catch (const std::exception& ex) {
      fail_everything(fmt::format("dtrain: the engine on rank {} failed: {}", rank_, ex.what()));
    }
    channel_->drain();
    std::vector<std::shared_ptr<Entry>> leftovers;
    std::string why;
    {
      std::lock_guard lock(mutex_);
      why = fatal_.empty() ? fmt::format("dtrain: rank {} shut down while the op was in flight", rank_)
                           : fatal_;
      for (auto& [name, e] : in_flight_) leftovers.push_back(e);
      in_flight_.clear();
      for (auto& e : incoming_) leftovers.push_back(e);
      incoming_.clear();
      if (join_entry_) leftovers.push_back(std::move(join_entry_));
      thread_exited_ = true;
    }
    cv_.notify_all();
    for (auto& e : leftovers) e->state->complete(std::make_exception_ptr(ShutdownError(why)));
  }

  void abandon() {
    {
      std::lock_guard lock(mutex_);
      abandon_ = true;
    }
    cv_.notify_all();
  }

  // Joins the engine thread unless it is blocked inside MPI after a failure (Note [Engine failure]).
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

  void loop() {
    auto last_progress = Clock::now();
    while (true) {
      std::vector<std::shared_ptr<Entry>> fresh;
      bool send_shutdown = false;
      std::string ending;
      {
        std::lock_guard lock(mutex_);
        if (abandon_) return;
        fresh.swap(incoming_);
        if (shutdown_requested_ && !shutdown_sent_) send_shutdown = shutdown_sent_ = true;
        ending.swap(job_ending_);
      }
      bool progressed = false;
      if (!fresh.empty() || send_shutdown || !ending.empty()) {
        send_requests(fresh, send_shutdown, std::move(ending));
        progressed = true;
      }
      if (coordinator_) {
        progressed |= receive_requests();
        if (auto msg = coordinator_->poll(Clock::now())) {
          if (pending_tuned_) msg->tuned = *std::exchange(pending_tuned_, std::nullopt);
          {
            std::lock_guard lock(coordinator_stats_mutex_);
            coordinator_stats_ = coordinator_->stats();
          }
          const auto planned = Clock::now();
          timeline_.cycle_mark(planned);
          channel_->send_response(*msg, size_);
          const auto reduced_before = backend_stats_.bytes_reduced.load(std::memory_order_relaxed);
          if (apply(*msg)) return;
          if (autotuner_)
            tune(*msg, backend_stats_.bytes_reduced.load(std::memory_order_relaxed) - reduced_before,
                 planned);
          progressed = true;
        }
      } else if (auto msg = channel_->receive_response()) {
        if (apply(*msg)) return;
        progressed = true;
      }
      channel_->progress();
      const auto now = Clock::now();
      if (progressed) {
        last_progress = now;
        continue;
      }
      wait_for_work(now - last_progress);
    }
  }

  bool awaiting_peers() {
    std::lock_guard lock(mutex_);
    return !in_flight_.empty() || join_entry_ || shutdown_sent_ || channel_->sending() ||
           (coordinator_ && coordinator_->has_pending());
  }

  void wait_for_work(Clock::duration idle_for) {
    const bool awaiting = awaiting_peers();
    Clock::duration limit = wait_policy_.sleep_for(awaiting, idle_for);
    if (limit == Clock::duration::zero()) return;  // hot poll: a peer in step answers soon
    if (coordinator_)
      if (auto d = coordinator_->next_deadline())
        limit = std::min(limit, std::max<Clock::duration>(*d - Clock::now(), Clock::duration::zero()));
    std::unique_lock lock(mutex_);
    auto wake = [&] {
      return !incoming_.empty() || abandon_ || (shutdown_requested_ && !shutdown_sent_) ||
             !job_ending_.empty();
    };
    if (!awaiting && !coordinator_) {
      cv_.wait(lock, wake);  // nothing in flight: nothing can arrive for this rank
    } else {
      cv_.wait_for(lock, limit, wake);
    }
  }

  void send_requests(const std::vector<std::shared_ptr<Entry>>& fresh, bool shutdown,
                     std::string ending) {
    RequestMessage m;
    m.rank = rank_;
    m.responses_applied = responses_applied_;
    m.shutdown = shutdown;
    m.fatal = std::move(ending);
    for (const auto& e : fresh) {
      const Request& q = e->request;
      if (auto id = mirror_.id_for(q)) {
        m.cached.push_back(*id);
        cache_ids_sent_.fetch_add(1, std::memory_order_relaxed);
      } else {
        m.requests.push_back(q);
      }
      requests_sent_.fetch_add(1, std::memory_order_relaxed);
    }
    if (coordinator_) {
      coordinator_->on_message(m, Clock::now());
    } else {
      channel_->send_request(m);
    }
  }

  bool receive_requests() {
    bool any = false;
    while (auto m = channel_->receive_request()) {
      coordinator_->on_message(*m, Clock::now());
      any = true;
    }
    return any;
  }

  // Rank 0: feeds the autotuner one executed message; a new configuration takes effect in the
  // coordinator at once and on every rank with the next message (Note [Applying tuned settings]).
  void tune(const ResponseMessage& msg, std::uint64_t bytes, Clock::time_point planned) {
    const auto knobs = autotuner_->on_executed(msg, static_cast<std::int64_t>(bytes), planned);
    if (!knobs) return;
    const Config tuned = autotune::apply_knobs(config_, *knobs);
    coordinator_->retune(tuned.fusion_threshold_bytes, tuned.cycle_time_ms, tuned.cache_capacity);
    pending_tuned_ = autotuner_->settings_for(autotuner_->generation());
    log(LogLevel::debug, "autotune: switching to {}", autotune::describe(*knobs));
  }

  // Applies one message from the coordinator. Returns true when the engine must stop.
  bool apply(const ResponseMessage& msg) {
    const auto arrival = Clock::now();
    responses_applied_ = msg.seq;
    if (msg.tuned.generation != 0)
      host_->retune(msg.tuned.fusion_pipeline, msg.tuned.hierarchical_allreduce);
    for (const auto& ins : msg.cache_inserts) {
      std::lock_guard lock(mutex_);
      auto it = in_flight_.find(ins.name);
      if (it == in_flight_.end()) continue;  // a rank that joined has nothing to remember
      mirror_.insert(ins.id, ins.name, it->second->request);
    }
    for (auto id : msg.cache_evictions) mirror_.evict(id);
    if (!msg.fatal.empty()) {
      fail_everything(msg.fatal);
      settle_after_job_failure();
      return true;
    }
    for (const auto& r : msg.responses) {
      if (log_enabled(LogLevel::debug)) log_response(r);
      execute(r, arrival);
    }
    return msg.shutdown_complete;
  }

  // Note [Settling a failed job]
  // When the coordinator ends the job (a stall shutdown, a rank that ended it), every engine stops
  // with requests perhaps still on their way to rank 0: a rank's own reason to end the job, sent
  // before it learnt another rank's came first. Unreceived, they outlive the control communicator,
  // and MPI may hand its context to the next dtrain::init()'s communicator, whose coordinator
  // would then read a stale request as new (measured: a restarted job failed with the previous
  // job's cause). So each rank's last control message says it is the last, and rank 0 reads and
  // drops requests until every rank's last one has come, for at most a few seconds (a rank that
  // died or hangs does not answer).
  void settle_after_job_failure() {
    if (size_ == 1) return;
    if (!coordinator_) {
      RequestMessage last;
      last.rank = rank_;
      last.last = true;
      channel_->send_request(last);
      return;
    }
    std::vector<bool> heard(static_cast<std::size_t>(size_), false);
    int missing = size_ - 1;
    const auto deadline = Clock::now() + std::chrono::seconds(3);
    while (missing > 0 && Clock::now() < deadline) {
      auto m = channel_->receive_request();
      if (!m) {
        channel_->progress();
        std::this_thread::sleep_for(std::chrono::microseconds(200));
        continue;
      }
      const auto r = static_cast<std::size_t>(m->rank);
      if (m->last && r < heard.size() && !heard[r]) {
        heard[r] = true;
        --missing;
      }
    }
  }

  // The debug trail (DTRAIN_LOG_LEVEL=debug): what each rank submitted and what it was told to
  // run, so a mismatch or a stall can be traced rank by rank.
  void log_submission(const Request& q) const {
    if (!q.rejected.empty()) {
      log(LogLevel::debug, "rank {} submits {} '{}' rejected here: {}", rank_, q.kind,
          q.name, q.rejected);
      return;
    }
    log(LogLevel::debug, "rank {} submits {} '{}'{}: {} [{}] on {}{}", rank_, q.kind,
        q.name, q.group.empty() ? "" : fmt::format(" (group '{}')", q.group), q.dtype,
        fmt::join(q.shape, ", "), q.device,
        q.kind == OpKind::allreduce || q.kind == OpKind::reducescatter
            ? fmt::format(", {}", q.reduce_op)
            : q.kind == OpKind::broadcast ? fmt::format(", root {}", q.root) : std::string());
  }
  void log_response(const Response& r) const {
    if (r.error != ErrorKind::none) {
      log(LogLevel::debug, "rank {} is told {} [{}] failed: {}", rank_, r.kind,
          fmt::join(r.names, ", "), r.error_message);
      return;
    }
    log(LogLevel::debug, "rank {} runs {} of {} tensor(s) [{}]: {} elements of {}", rank_,
        r.kind, r.names.size(), fmt::join(r.names, ", "), r.total_numel(),
        r.dtype);
  }

  std::shared_ptr<Entry> take(const std::string& name) {
    std::lock_guard lock(mutex_);
    auto it = in_flight_.find(name);
    if (it == in_flight_.end()) return nullptr;
    auto e = it->second;
    in_flight_.erase(it);
    return e;
  }

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

  void execute(const Response& r, Clock::time_point arrival) {
    if (!r.applies_to(rank_)) return;
    if (r.kind == OpKind::join) {
      std::shared_ptr<Entry> j;
      {
        std::lock_guard lock(mutex_);
        j = std::move(join_entry_);
      }
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
    for (const auto& name : r.names) owned.push_back(take(name));
    if (r.error != ErrorKind::none) {
      for (auto& e : owned)
        if (e) e->state->complete(make_error(r.error, r.error_message));
      return;
    }
    entries_.clear();
    for (auto& e : owned) entries_.push_back(e.get());
    Backend* backend = host_.get();
    if (r.device.is_cuda()) backend = device_backend();
    watchdog_->executing(r.names.empty() ? std::string() : r.names.front(), to_string(r.kind), &owned);
    const auto started = Clock::now();
    try {
      backend->execute(r, entries_, arrival);
    } catch (const TimeoutError& ex) {
      // The device path aborted its communicator at the deadline: this rank's engine cannot go on.
      const std::string what = fmt::format("dtrain: {} '{}' on rank {} timed out: {}",
                                           r.kind, r.names.empty() ? "" : r.names.front(),
                                           rank_, ex.what());
      for (auto& e : owned)
        if (e) e->state->complete(std::make_exception_ptr(TimeoutError(what)));
      watchdog_->finished();
      throw;  // run() fails every other op with this root cause
    } catch (const std::exception& ex) {
      // The peers are inside (or past) the same collective; this rank cannot rejoin it, and
      // returning would leave them blocked. Fail loudly instead of hanging the job.
      const std::string what = fmt::format(
          "dtrain: rank {} failed while executing {} '{}': {}. The other ranks are inside the same "
          "collective and cannot be released; aborting the job.",
          rank_, r.kind, r.names.empty() ? "" : r.names.front(), ex.what());
      log(LogLevel::fatal, "{}", what);
      for (auto& e : owned)
        if (e) e->state->complete(std::make_exception_ptr(CommunicationError(what)));
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    watchdog_->finished();
    count_completed(r, owned, arrival, started);
    for (auto& e : owned)
      if (e) e->state->complete();
  }

  // The per-kind and timing counters of EngineStats, for one response this rank executed.
  void count_completed(const Response& r, const std::vector<std::shared_ptr<Entry>>& owned,
                       Clock::time_point arrival, Clock::time_point started) {
    const auto ns = [](Clock::duration d) {
      return static_cast<std::uint64_t>(std::max<std::int64_t>(
          0, std::chrono::duration_cast<std::chrono::nanoseconds>(d).count()));
    };
    op_stats_.collective_ns.fetch_add(ns(Clock::now() - started), std::memory_order_relaxed);
    const auto es = static_cast<std::uint64_t>(element_size(r.dtype));
    std::uint64_t bytes = 0, tensors = 0, negotiation = 0;
    for (const auto& e : owned) {
      if (!e) continue;
      bytes += static_cast<std::uint64_t>(e->request.numel()) * es;
      ++tensors;
      negotiation += ns(arrival - e->submitted);
    }
    const auto kind = static_cast<std::size_t>(r.kind);
    if (kind < op_stats_.kind_bytes.size())
      op_stats_.kind_bytes[kind].fetch_add(bytes, std::memory_order_relaxed);
    if (r.names.size() > 1) {
      op_stats_.fused_bytes.fetch_add(bytes, std::memory_order_relaxed);
      op_stats_.fused_tensors.fetch_add(tensors, std::memory_order_relaxed);
    }
    op_stats_.negotiation_ns.fetch_add(negotiation, std::memory_order_relaxed);
  }

  Backend* device_backend() {
    if (!device_) {
      auto factory = device_backend_factory();
      if (!factory)
        throw InvalidArgumentError("dtrain: a device (CUDA) tensor reached the engine, but this "
                                   "program was built without dtrain's CUDA support: include "
                                   "<dtrain/cuda.hpp> and link dtrain::cuda");
      BackendContext ctx;
      ctx.config = &config_;
      ctx.data_comm = data_;
      ctx.hierarchy = hierarchy_;
      ctx.stats = &backend_stats_;
      ctx.timeline = rank_ == 0 ? &timeline_ : nullptr;
      device_ = factory(ctx);
    }
    return device_.get();
  }

  // Note [Engine failure]
  // Some failures leave this rank's engine unable to go on: a collective that outlived
  // DTRAIN_OP_TIMEOUT_SECONDS after every rank had submitted it (MPI cannot cancel it, so the engine
  // thread stays inside it), a device communicator aborted at its deadline, a dead peer (Note [Peer
  // liveness]), a stall shutdown. The op concerned fails with its own error (TimeoutError for a
  // deadline), every other op, in flight or submitted later, with a ShutdownError carrying that
  // first cause; the process stays free to save what it needs and exit. shutdown() is then local:
  // it does not wait for peers, leaves a blocked engine thread where it is, and does not finalize
  // MPI (which could block on the same peers).
  //
  // The watchdog (runtime/watchdog.hpp) and the engine thread both end up here.
  void fail_everything(const std::string& why) {
    std::vector<std::shared_ptr<Entry>> victims;
    {
      std::lock_guard lock(mutex_);
      if (fatal_.empty()) fatal_ = why;
      for (auto& [name, e] : in_flight_) victims.push_back(e);
      in_flight_.clear();
      for (auto& e : incoming_) victims.push_back(e);
      incoming_.clear();
      if (join_entry_) victims.push_back(std::move(join_entry_));
    }
    cv_.notify_all();
    log(LogLevel::error, "{}", why);
    for (auto& e : victims) e->state->complete(std::make_exception_ptr(ShutdownError(why)));
  }

  Config config_;
  MPI_Comm control_ = MPI_COMM_NULL;
  MPI_Comm data_ = MPI_COMM_NULL;
  HierarchyComms hierarchy_;
  int rank_ = 0, size_ = 1;
  bool direct_segments_ = false;

  mutable std::mutex mutex_;  // guards everything the user threads touch
  std::condition_variable cv_;
  std::vector<std::shared_ptr<Entry>> incoming_;
  std::unordered_map<std::string, std::shared_ptr<Entry>> in_flight_;
  std::shared_ptr<Entry> join_entry_;
  bool shutdown_requested_ = false;
  bool shutdown_sent_ = false;
  bool abandon_ = false;
  bool thread_exited_ = false;
  std::string fatal_;
  std::string job_ending_;  // for the coordinator: end the job on every rank (end_job)

  std::optional<Coordinator> coordinator_;
  std::optional<EngineAutotuner> autotuner_;      // rank 0, with DTRAIN_AUTOTUNE
  std::optional<TunedSettings> pending_tuned_;    // for the next response message
  mutable std::mutex coordinator_stats_mutex_;
  CoordinatorStats coordinator_stats_;
  Timeline timeline_;

  std::optional<ControlChannel> channel_;
  CacheMirror mirror_;
  std::uint64_t responses_applied_ = 0;
  WaitPolicy wait_policy_;
  std::vector<Entry*> entries_;

  BackendStats backend_stats_;
  std::unique_ptr<HostBackend> host_;
  std::unique_ptr<Backend> device_;
  std::array<std::atomic<std::uint64_t>, 7> name_counters_{};
  std::atomic<std::uint64_t> cache_ids_sent_{0};
  std::atomic<std::uint64_t> requests_sent_{0};
  struct OpCounters {
    std::array<std::atomic<std::uint64_t>, 8> kind_bytes{};  // by OpKind
    std::atomic<std::uint64_t> fused_bytes{0};
    std::atomic<std::uint64_t> fused_tensors{0};
    std::atomic<std::uint64_t> negotiation_ns{0};
    std::atomic<std::uint64_t> collective_ns{0};
  } op_stats_;

  std::optional<PeerMonitor> monitor_;
  const std::thread::id init_thread_ = std::this_thread::get_id();  // Note [Generated names]

  std::optional<Watchdog> watchdog_;  // after everything it reads: destroyed (joined) first
  std::thread thread_;
};

}  // namespace detail
}  // namespace dtrain
