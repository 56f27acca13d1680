#pragma once
// Definitions of train/elastic.hpp: local commits, the newest one any host holds, the question to
// dtrainrun and the exit it understands (Note [Build modes] in core/build_mode.hpp).
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <future>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "dtrain/core/config.hpp"
#include "dtrain/core/dtrainrun_job.hpp"
#include "dtrain/core/env.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/fnv1a.hpp"
#include "dtrain/core/host_name.hpp"
#include "dtrain/core/logging.hpp"
#include "dtrain/runtime/collectives.hpp"
#include "dtrain/runtime/session.hpp"
#include "dtrain/train/checkpoint_format.hpp"
#include "dtrain/train/checkpoint_writer.hpp"
#include "dtrain/train/elastic.hpp"
#include "dtrain/train/elastic_commits.hpp"
#include "dtrain/train/elastic_launcher.hpp"

namespace dtrain {
namespace detail {

struct ElasticWorkings {
  std::future<std::vector<char>> write;  // this host's commit being written, if any
  std::vector<char> spare;               // a payload buffer to reuse: no fresh pages per commit
  std::optional<LauncherClient> launcher;  // rank 0, in elastic mode
  std::chrono::steady_clock::time_point next_question{};  // not before, after a failed one
  std::string last_problem;                                // said once until it changes
};

// Collective: the lowest rank that has a problem (a non-empty text), or nothing.
inline std::optional<int> first_rank_with_problem(const std::string& problem, int rank,
                                                  int world, const std::string& op_name) {
  std::vector<std::int64_t> lowest{problem.empty() ? world : rank};
  allreduce(lowest, {.op = ReduceOp::Min, .name = op_name});
  if (lowest[0] >= world) return std::nullopt;
  return static_cast<int>(lowest[0]);
}

// Throws on every rank when any rank has a problem: this rank's own text where it has one.
inline void agree_on_problem(const std::string& problem, int rank, int world,
                             const std::string& op_name, std::string_view doing) {
  const auto failed = first_rank_with_problem(problem, rank, world, op_name);
  if (!failed) return;
  if (!problem.empty()) throw CheckpointError(fmt::format("dtrain: elastic: {}", problem));
  throw CheckpointError(fmt::format("dtrain: elastic: rank {} failed while {}; its error says why",
                                    *failed, doing));
}

// DTRAIN_HOST_ID where set (hosts emulated on one machine), else the host name.
inline std::string this_host_name() { return host_label(dtrain::config().host_id); }

// A job's name as a number the ranks compare in restore()'s allgather (FNV-1a, 64 bits).
inline std::int64_t job_fingerprint(std::string_view job) {
  return static_cast<std::int64_t>(fnv1a(job) >> 1);  // non-negative
}

inline std::string describe_job(const std::string& job) {
  return job.empty() ? std::string("an unnamed job") : fmt::format("job '{}'", job);
}

// The background half of a commit: the file, then pruning among `job`'s commits (all when null).
inline std::vector<char> write_commit_file(std::filesystem::path directory, std::int64_t step,
                                           int keep_last, std::vector<char> payload,
                                           std::optional<std::string> job) {
  auto buffer = write_checkpoint_file(directory, step, 0, std::move(payload));
  prune_job_commits(directory, keep_last, job ? &*job : nullptr);
  return buffer;
}

}  // namespace detail

namespace elastic {

DTRAIN_API Launch launch_from_environment() {
  Launch launch;
  const char* on = std::getenv("DTRAIN_ELASTIC");
  launch.elastic = on != nullptr && std::string_view(on) == "1";
  if (on != nullptr && !launch.elastic && std::string_view(on) != "0" && *on != '\0')
    throw InvalidArgumentError(fmt::format(
        "dtrain: DTRAIN_ELASTIC='{}': expected 1 (set by dtrainrun's elastic mode) or 0", on));
  const detail::ProcessEnv env;
  std::string problem =
      detail::read_env_count(env, "DTRAIN_ELASTIC_GENERATION", launch.generation);
  if (problem.empty())
    problem = detail::read_env_count(env, "DTRAINRUN_RESTART_COUNT", launch.restart_count);
  if (!problem.empty())
    throw InvalidArgumentError(
        fmt::format("dtrain: {} (dtrainrun sets it in elastic mode)", problem));
  if (const char* notify = std::getenv("DTRAIN_ELASTIC_NOTIFY")) launch.notify = notify;
  detail::DtrainrunJob job;
  if (problem = detail::read_dtrainrun_job(env, job); !problem.empty())
    throw InvalidArgumentError(problem);
  launch.job_id = job.job_id;
  if (launch.elastic && !detail::parse_notify_address(launch.notify))
    throw InvalidArgumentError(fmt::format(
        "dtrain: DTRAIN_ELASTIC_NOTIFY='{}': expected <address>:<port> of dtrainrun's "
        "notification server (dtrainrun sets it in elastic mode)",
        launch.notify));
  return launch;
}

DTRAIN_API State::State(Options options)
    : options_(std::move(options)), rank_(dtrain::rank()), world_(dtrain::size()),
      writer_(dtrain::local_rank() == 0),
      workings_(std::make_unique<dtrain::detail::ElasticWorkings>()) {
  if (options_.directory.empty())
    throw InvalidArgumentError("dtrain: elastic::Options::directory is empty: name the folder on "
                               "each host that holds its commits (a local disk, or /dev/shm)");
  if (options_.keep_last < 0 || options_.commit_every < 0)
    throw InvalidArgumentError(fmt::format(
        "dtrain: elastic::Options: keep_last = {} and commit_every = {} must be >= 0",
        options_.keep_last, options_.commit_every));
  if (options_.launcher_timeout.count() <= 0 || options_.retry_after.count() < 0)
    throw InvalidArgumentError(fmt::format(
        "dtrain: elastic::Options: launcher_timeout = {} ms must be > 0 and retry_after = {} ms "
        ">= 0",
        options_.launcher_timeout.count(), options_.retry_after.count()));
  std::string problem;
  try {
    launch_ = launch_from_environment();
  } catch (const InvalidArgumentError& e) {
    problem = e.what();
  }
  job_ = options_.job_name.empty() ? launch_.job_id : options_.job_name;
  const std::string host = dtrain::detail::this_host_name();
  directory_ = dtrain::detail::resolve_commit_directory(options_.directory, host).string();
  if (problem.empty() && writer_)
    problem = dtrain::detail::claim_commit_directory(directory_, host);
  if (problem.empty() && rank_ == 0 && launch_.elastic)
    workings_->launcher.emplace(*dtrain::detail::parse_notify_address(launch_.notify),
                                options_.launcher_timeout);
  dtrain::detail::agree_on_problem(problem, rank_, world_, "dtrain.elastic.state",
                                   "setting up its commit folder");
}

DTRAIN_API State::State(State&& other) noexcept
    : options_(std::move(other.options_)), launch_(std::move(other.launch_)),
      directory_(std::move(other.directory_)), job_(std::move(other.job_)), rank_(other.rank_),
      world_(other.world_),
      writer_(other.writer_), resize_requested_(other.resize_requested_),
      next_world_size_(other.next_world_size_), last_commit_(other.last_commit_),
      checked_folder_(other.checked_folder_), workings_(std::move(other.workings_)) {}

DTRAIN_API State& State::operator=(State&& other) noexcept {
  if (this != &other) {
    finish_quietly();
    options_ = std::move(other.options_);
    launch_ = std::move(other.launch_);
    directory_ = std::move(other.directory_);
    job_ = std::move(other.job_);
    rank_ = other.rank_;
    world_ = other.world_;
    writer_ = other.writer_;
    resize_requested_ = other.resize_requested_;
    next_world_size_ = other.next_world_size_;
    last_commit_ = other.last_commit_;
    checked_folder_ = other.checked_folder_;
    workings_ = std::move(other.workings_);
  }
  return *this;
}

DTRAIN_API State::~State() { finish_quietly(); }

DTRAIN_API void State::finish_quietly() noexcept {
  try {
    wait();
  } catch (const std::exception& e) {
    dtrain::detail::log(LogLevel::error, "{}", e.what());
  }
}

DTRAIN_API void State::wait() {
  if (!workings_ || !workings_->write.valid()) return;
  try {
    workings_->spare = workings_->write.get();
  } catch (const std::exception& e) {
    throw CheckpointError(fmt::format("dtrain: elastic: writing a commit into {} failed: {}",
                                      directory_, e.what()));
  }
}

DTRAIN_API bool State::writing() const {
  return workings_ && workings_->write.valid() &&
         workings_->write.wait_for(std::chrono::seconds(0)) != std::future_status::ready;
}

DTRAIN_API std::optional<RestoredCheckpoint> State::restore() {
  namespace d = dtrain::detail;
  std::string problem;
  try {
    wait();
  } catch (const CheckpointError& e) {
    problem = e.what();
  }
  const bool own_only = options_.on_other_job == OtherJobCommits::skip;
  const std::string* own = own_only ? &job_ : nullptr;
  auto bytes = std::make_shared<std::vector<char>>();
  d::CheckpointRecord record;
  std::int64_t mine = -1;
  std::vector<d::OtherJobCommits> others;
  if (writer_ && problem.empty())
    mine = d::newest_valid_commit(directory_, *bytes, record, own, &others).value_or(-1);
  for (const auto& other : others)
    d::log(LogLevel::warning,
           "dtrain: elastic: {} holds {} commit(s) of {} (the newest of step {}), which this "
           "job ({}) does not resume: they are left alone. To resume that job's state, set "
           "elastic::Options::on_other_job = OtherJobCommits::resume (or give this job its name "
           "with Options::job_name); to start afresh without this warning, remove them",
           directory_, other.count, d::describe_job(other.job), other.newest_step,
           d::describe_job(job_));
  d::agree_on_problem(problem, rank_, world_, "dtrain.elastic.restore.check",
                      "reading its commits");

  // Each rank's {newest step, job}: a vote over the commits of two jobs would mix their states.
  const std::int64_t fingerprint =
      d::job_fingerprint(fmt::format("{}\n{}", job_, own_only ? "skip" : "resume"));
  const auto votes = allgather(std::vector<std::int64_t>{mine, fingerprint},
                               "dtrain.elastic.restore.steps");
  std::vector<std::int64_t> steps;
  std::vector<int> differ;
  for (std::size_t r = 0; r < votes.size() / 2; ++r) {
    steps.push_back(votes[2 * r]);
    if (votes[2 * r + 1] != votes[1]) differ.push_back(static_cast<int>(r));
  }
  if (!differ.empty())
    throw InvalidArgumentError(fmt::format(
        "dtrain: elastic: rank(s) {} name another job than rank 0 (elastic::Options::job_name, "
        "DTRAINRUN_JOB_ID, or Options::on_other_job differ); this rank ({}) names {}. Every rank "
        "must name the same job, or one restore would mix the commits of two jobs",
        fmt::join(differ, ", "), rank_, d::describe_job(job_)));
  const auto newest = std::max_element(steps.begin(), steps.end());  // the first: lowest rank
  checked_folder_ = true;  // commits continue after the newest one
  if (*newest < 0) {
    if (rank_ == 0)
      d::log(LogLevel::info, "dtrain: elastic: no host holds a commit {}in {}: starting afresh",
             own_only ? fmt::format("of {} ", d::describe_job(job_)) : "", options_.directory);
    return std::nullopt;
  }
  const std::int64_t step = *newest;
  const int holder = static_cast<int>(newest - steps.begin());
  if (rank_ != holder) bytes->clear();
  std::vector<std::int64_t> size{static_cast<std::int64_t>(bytes->size())};
  broadcast(size, holder, "dtrain.elastic.restore.size");
  bytes->resize(static_cast<std::size_t>(size[0]));
  std::span<std::uint8_t> view(reinterpret_cast<std::uint8_t*>(bytes->data()), bytes->size());
  broadcast(view, holder, "dtrain.elastic.restore.bytes");
  if (rank_ != holder) {
    if (std::string why = d::parse_checkpoint(*bytes, record); !why.empty())
      problem = fmt::format("the commit of step {} arrived damaged on rank {}: {}", step, rank_,
                            why);
  }
  d::agree_on_problem(problem, rank_, world_, "dtrain.elastic.restore.arrived",
                      "receiving the commit");

  // Hosts that lacked it hold it from now on (Note [Newest commit any rank holds]).
  if (writer_ && mine != step) {
    std::vector<char> payload(bytes->begin() + d::checkpoint_header_bytes,
                              bytes->end() - d::checkpoint_trailer_bytes);
    workings_->write = std::async(std::launch::async, &d::write_commit_file, directory_, step,
                                  options_.keep_last, std::move(payload),
                                  own_only ? std::optional(job_) : std::nullopt);
  }
  const std::string written_by = d::commit_job(*bytes, record, /*take=*/true);
  if (rank_ == 0)
    d::log(LogLevel::info,
           "dtrain: elastic: resuming from the commit of step {} (epoch {}) of {}, held by rank "
           "{}'s host, written by {} ranks; {} ranks now",
           step, record.epoch,
           written_by == job_ ? "this job" : d::describe_job(written_by) + ", another job", holder,
           record.world_size, world_);
  last_commit_ = step;
  const auto file = std::filesystem::path(directory_) / d::checkpoint_file_name(step);
  return RestoredCheckpoint(std::move(bytes), std::move(record), file.string(), rank_);
}

DTRAIN_API void State::commit(const TrainingProgress& progress,
                              std::initializer_list<CheckpointItem> shared) {
  namespace d = dtrain::detail;
  d::check_save_arguments("elastic::State::commit", progress, shared, {});
  for (const auto& item : shared)
    if (item.name() == d::commit_job_item)
      throw InvalidArgumentError(fmt::format(
          "dtrain: elastic::State::commit: the item name '{}' is dtrain's own (the job that "
          "wrote the commit, Note [Whose commits]); give the item another name",
          item.name()));
  const std::string* own = options_.on_other_job == OtherJobCommits::skip ? &job_ : nullptr;
  std::string problem;
  if (writer_ && !checked_folder_) {
    // Pruning keeps this job's highest steps: a later commit of an earlier run of the same job
    // would outlive every commit of this one, and a restart would resume from it.
    const auto files = d::job_commit_files(directory_, own);
    if (!files.empty() && files.back().step > progress.step)
      problem = fmt::format(
          "dtrain: elastic: the commit folder {} holds {} (step {}), later than this commit (step "
          "{}), and this job did not restore(): call restore() first, as every world should, or "
          "use an empty folder",
          directory_, files.back().path.filename().string(), files.back().step,
          progress.step);
  }
  checked_folder_ = true;
  if (writer_ && problem.empty()) {
    // Nothing may escape before the allreduce below, or the other ranks would wait in it forever.
    ObjectWriter w;
    try {
      w.bytes().swap(workings_->spare);
      w.bytes().clear();
      std::vector<CheckpointItem> items{{d::commit_job_item, job_}};  // Note [Whose commits]
      items.insert(items.end(), shared.begin(), shared.end());
      d::write_payload_head(w, progress, world_, items);
      w.write(std::uint64_t{0});  // no per-rank items
    } catch (const std::exception& e) {
      problem = fmt::format("dtrain: elastic: serializing the items of step {} failed: {}",
                            progress.step, e.what());
    }
    try {
      wait();
      if (problem.empty())
        workings_->write = std::async(std::launch::async, &d::write_commit_file, directory_,
                                      progress.step, options_.keep_last, std::move(w.bytes()),
                                      own ? std::optional(job_) : std::nullopt);
    } catch (const std::exception& e) {
      if (problem.empty()) problem = e.what();
    }
  }
  // {resize, target, next size, -(lowest rank with a problem)}: Max takes rank 0's answer (the
  // others send zeros) and, negated, the lowest rank that could not write.
  std::array<std::int64_t, 4> verdict{0, 0, 0, -(problem.empty() ? world_ : rank_)};
  if (rank_ == 0 && workings_->launcher &&
      std::chrono::steady_clock::now() >= workings_->next_question) {
    const auto outcome = workings_->launcher->ask();
    if (outcome.answer) {
      verdict[0] = outcome.answer->target > launch_.generation ? 1 : 0;
      verdict[1] = outcome.answer->target;
      verdict[2] = outcome.answer->size;
      workings_->last_problem.clear();
    } else {
      workings_->next_question = std::chrono::steady_clock::now() + options_.retry_after;
      if (outcome.problem != workings_->last_problem)
        d::log(LogLevel::warning,
               "dtrain: elastic: no answer from dtrainrun at {}: {}; carrying on (a missing "
               "answer is not a resize), asking again in {} ms",
               launch_.notify, outcome.problem, options_.retry_after.count());
      workings_->last_problem = outcome.problem;
    }
  }
  allreduce(verdict, {.op = ReduceOp::Max, .name = "dtrain.elastic.commit"});
  const std::int64_t failed = -verdict[3];
  if (failed < world_) {
    if (!problem.empty()) throw CheckpointError(problem);
    throw CheckpointError(fmt::format(
        "dtrain: elastic: rank {} could not commit step {} on its host; its error says why",
        failed, progress.step));
  }
  last_commit_ = progress.step;
  resize_requested_ = verdict[0] != 0;
  next_world_size_ = verdict[2];
  if (resize_requested_ && rank_ == 0)
    d::log(LogLevel::info,
           "dtrain: elastic: dtrainrun asks generation {} to stop for a resize (generation {}, "
           "{} ranks); committed step {}",
           launch_.generation, verdict[1], verdict[2], progress.step);
}

DTRAIN_API void State::exit_for_resize() {
  if (!last_commit_)
    throw InvalidArgumentError(
        "dtrain: elastic::State::exit_for_resize: nothing was committed or restored: call "
        "commit() first, since the next world resumes from the last commit");
  int status = resize_exit_status;
  try {
    wait();
  } catch (const std::exception& e) {
    // This host's copy is lost; the others hold the commit (Note [Local commits]).
    dtrain::detail::log(LogLevel::error, "{}", e.what());
  }
  try {
    dtrain::shutdown();
  } catch (const std::exception& e) {
    dtrain::detail::log(LogLevel::error, "dtrain: elastic: shutting down for the resize: {}",
                        e.what());
    status = 1;
  }
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Finalize();  // the program's own MPI: the process ends here
  std::fflush(nullptr);
  std::exit(status);
}

}  // namespace elastic
}  // namespace dtrain
