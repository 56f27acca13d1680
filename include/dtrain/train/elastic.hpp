#pragma once
// Elastic training, the program's side (docs/elastic.md): the training state committed to each
// host's own disk every few steps, the question to dtrainrun whether the world should change, and
// the way out that dtrainrun understands.
//
//   dtrain::elastic::State elastic({.directory = "/dev/shm/job", .commit_every = 20});
//   if (auto restored = elastic.restore()) {                  // collective; nothing: start afresh
//     restored->load("model", model);
//     sampler.load_state(restored->get<dtrain::SamplerState>("sampler"));
//     step = restored->step();
//   }
//   ...after each optimizer step, on every rank:
//   if (elastic.commit_due(step)) {
//     elastic.commit({.step = step, .epoch = epoch},
//                    {{"model", model}, {"optimizer", opt}, {"sampler", sampler.state(taken)}});
//     if (elastic.resize_requested()) elastic.exit_for_resize();  // every rank: exit status 75
//   }
//
// Note [Local commits]
// A commit needs no shared filesystem: one rank of each host (its local rank 0) writes the commit
// into that host's own folder, so every host holds every commit and losing a host loses nothing
// the others do not hold. The items are shared state, the same on every rank (the model and
// optimizer after an averaged step, the sampler's global position), so each writer serializes its
// own copy and no byte crosses the network. Per-rank items have no place here: the next world has
// another number of ranks. The write is Checkpoint's: the same file format and CRC-32C, written
// atomically by a background thread while training goes on (Note [Checkpoint flow]), at most one
// write in flight per host and the payload buffer reused, so a commit costs the calling thread a
// copy of the items at memory speed. Two hosts must not share a folder (each would remove the
// other's writes in progress as stale): each writer marks its folder with its host name and
// refuses a folder another host marked. With "{host}" in the directory, one shared path serves
// every host.
//
// Note [Newest commit any rank holds]
// restore() is collective. Each writer reads its folder's commits newest first and stops at the
// first valid one (a damaged file is renamed aside with a warning, as Checkpoint does); an
// allgather of those steps picks the newest, and the lowest rank that holds it broadcasts the
// file's bytes, which every rank checks again (CRC-32C) before it loads items. Hosts that lacked
// that commit then write it too, in the background, so that it survives the loss of the host that
// held it. A host that returns after an absence holds only older commits, which lose the vote.
//
// Note [Resize at a commit]
// At each commit rank 0 asks dtrainrun once (Note [Asking the launcher] in
// train/elastic_launcher.hpp) and the answer travels in the same small allreduce that tells every
// rank whether any host failed to write: every rank learns the same thing at the same step, so
// resize_requested() is a plain read, true only from the commit at which dtrainrun asked for a
// resize. exit_for_resize() then waits for this host's write, shuts dtrain down (finalizing MPI),
// and exits with 75, which dtrainrun takes as "committed, start the next world"; that world
// resumes from exactly this commit, so a resize loses no step. A question that fails is a missing
// answer, not a resize; after a failure rank 0 waits retry_after before asking again, so a
// launcher that cannot be reached costs one timeout now and then, not one every commit. Outside
// dtrainrun's elastic mode (no DTRAIN_ELASTIC) nothing is asked and State only commits and
// restores.
//
// Note [Whose commits]
// A folder outlives the job that wrote it: a new job pointed at a folder an earlier job used
// would otherwise resume that job's weights and step without a word. So every commit records the
// job that wrote it, as its first shared item "dtrain.job" (a string; the file format stays
// Checkpoint's, and a reader that does not know the item sees one item more), and restore() takes
// only its own job's commits. The job is Options::job_name, or else DTRAINRUN_JOB_ID, which is
// the same in every world of one dtrainrun and different for every dtrainrun (Note [Job
// identity] in tools/dtrain_launcher/mpi.py), or else "" (an unnamed job: mpiexec, no name);
// commits written before commits recorded their job count as an unnamed job's. Each host's writer
// reads only the first bytes of each file to learn its job; the other jobs' commits are left
// where they are, said once per restore (the folder, the job, how many, the newest step), and
// never pruned: pruning keeps this job's newest keep_last commits, so another job's later steps
// cannot push this job's commits out. Options::on_other_job = resume takes the newest commit of
// any job, as dtrain did before, and prunes across jobs. The ranks check that they name the same
// job (a hash of it travels with each host's newest step), since a vote over different jobs'
// commits would mix two jobs' states.
#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>

#include "dtrain/core/build_mode.hpp"
#include "dtrain/train/checkpoint.hpp"

namespace dtrain {
namespace detail {
struct ElasticWorkings;  // train/elastic_impl.hpp: the write in flight, buffers, launcher client
}  // namespace detail

namespace elastic {

// "A resize was asked for and my state is committed" (EX_TEMPFAIL), the status dtrainrun expects.
inline constexpr int resize_exit_status = 75;

// What restore() does with commits that another job wrote (Note [Whose commits]).
enum class OtherJobCommits : std::uint8_t {
  skip,    // resume only this job's commits; say how many of another job's were left alone
  resume,  // resume the newest commit of any job (to continue an earlier job's training)
};

struct Options {
  // This host's own folder (a local disk, or /dev/shm); "{host}" is replaced by the host's name.
  // Created by each host's writer.
  std::string directory;
  std::int64_t commit_every = 0;  // commit_due(step): every this many steps; 0: never
  int keep_last = 2;              // commits kept on each host; 0 keeps every one
  std::chrono::milliseconds launcher_timeout{2000};  // connection and answer, together
  std::chrono::milliseconds retry_after{10000};      // after a failed question
  // The job whose commits these are; empty: DTRAINRUN_JOB_ID (one per dtrainrun), or unnamed.
  // Give a name that stays the same where one job spans several dtrainruns (a requeued batch job).
  std::string job_name{};
  OtherJobCommits on_other_job = OtherJobCommits::skip;
};

// What dtrainrun's elastic mode told this process (docs/elastic.md, "Environment").
struct Launch {
  bool elastic = false;            // DTRAIN_ELASTIC=1
  std::string notify;              // DTRAIN_ELASTIC_NOTIFY: "<address>:<port>"
  std::int64_t generation = 0;     // DTRAIN_ELASTIC_GENERATION
  std::int64_t restart_count = 0;  // DTRAINRUN_RESTART_COUNT
  std::string job_id;              // DTRAINRUN_JOB_ID: the same in every world of one dtrainrun
};

// Reads the variables. Throws InvalidArgumentError naming a variable whose value is malformed.
DTRAIN_API Launch launch_from_environment();

class State {
 public:
  // Collective. Every host's writer creates and claims its folder (Note [Local commits]); a problem
  // on any rank (a folder another host uses, a malformed DTRAIN_ELASTIC_* variable) throws on
  // every rank.
  DTRAIN_API explicit State(Options options);

  DTRAIN_API State(State&& other) noexcept;
  DTRAIN_API State& operator=(State&& other) noexcept;
  State(const State&) = delete;
  State& operator=(const State&) = delete;

  // Waits for this host's write in flight; its error is logged (a destructor cannot throw).
  DTRAIN_API ~State();

  // Collective. The newest valid commit of this job that any rank's host holds, on every rank, or
  // nothing (start afresh) when no host holds one (Note [Newest commit any rank holds], Note
  // [Whose commits]). Throws InvalidArgumentError on every rank when the ranks name other jobs.
  DTRAIN_API std::optional<RestoredCheckpoint> restore();

  bool commit_due(std::int64_t step) const noexcept {
    return options_.commit_every > 0 && step > 0 && step % options_.commit_every == 0;
  }

  // Collective: call it on every rank at the same step, with the same item names. Commits the
  // items to each host's folder and learns whether dtrainrun wants a resize (Note [Resize at a
  // commit]). Throws CheckpointError on every rank when a host could not write its previous commit,
  // or, at a first commit without restore(), when a folder holds a later commit than this one.
  DTRAIN_API void commit(const TrainingProgress& progress,
                         std::initializer_list<CheckpointItem> shared);

  // The same on every rank; true only after a commit at which dtrainrun asked for a resize.
  bool resize_requested() const noexcept { return resize_requested_; }
  // The size dtrainrun gave for the next world at that commit (for messages).
  std::int64_t next_world_size() const noexcept { return next_world_size_; }

  // Collective, after a commit(): waits for this host's write, shuts dtrain down, finalizes MPI
  // and ends the process with resize_exit_status. Stack objects are not destroyed (std::exit).
  [[noreturn]] DTRAIN_API void exit_for_resize();

  // Blocks until this host's last commit is on its disk; throws its error if it failed.
  DTRAIN_API void wait();

  // Whether this host's last commit is still being written (false on ranks that do not write).
  DTRAIN_API bool writing() const;

  const Launch& launch() const noexcept { return launch_; }
  // This world's generation: 0 outside elastic mode.
  std::int64_t generation() const noexcept { return launch_.generation; }
  // Options::directory with "{host}" replaced: this host's folder.
  const std::string& directory() const noexcept { return directory_; }
  // The job its commits belong to (Note [Whose commits]); empty: an unnamed job.
  const std::string& job() const noexcept { return job_; }
  // Whether this rank writes its host's commits (its local rank 0).
  bool writes() const noexcept { return writer_; }
  const Options& options() const noexcept { return options_; }

 private:
  DTRAIN_API void finish_quietly() noexcept;

  Options options_;
  Launch launch_;
  std::string directory_;
  std::string job_;
  int rank_ = 0;
  int world_ = 1;
  bool writer_ = false;
  bool resize_requested_ = false;
  std::int64_t next_world_size_ = 0;
  std::optional<std::int64_t> last_commit_;
  bool checked_folder_ = false;  // restore() ran, or the first commit found nothing newer
  std::unique_ptr<dtrain::detail::ElasticWorkings> workings_;
};

}  // namespace elastic
}  // namespace dtrain

#ifdef DTRAIN_HEADER_ONLY
#include "dtrain/train/elastic_impl.hpp"
#endif
