#pragma once
// Checkpoint: save the training state from rank 0 without stalling the step, and resume every rank
// from the newest valid checkpoint after a crash or a restart.
//
//   dtrain::Checkpoint checkpoint({.directory = "ckpt", .keep_last = 3});
//   if (auto resumed = checkpoint.restore()) {             // collective; nothing: start afresh
//     resumed->load("model", model);                      // in place, on every rank
//     sampler.load_state(resumed->get<dtrain::SamplerState>("sampler"));
//     step = resumed->step();
//   }
//   ...after an optimizer step, on every rank:
//   checkpoint.save({.step = step, .epoch = epoch},
//                   {{"model", model}, {"optimizer", opt}, {"sampler", sampler.state(taken)}},
//                   {{"rng", rng}});                        // optional per-rank items
//
// Note [Checkpoint flow]
// save() serializes the items on the calling thread (a copy at memory speed into a buffer reused
// from the save before last), then hands the buffer to a background thread that checksums it and
// writes it atomically (Note [Atomic checkpoint files]), and returns. Training continues while the
// file is written; a save that arrives while the previous one is still being written waits for it,
// so at most one write is in flight and at most two buffers exist. After a write, checkpoints
// beyond the newest keep_last are deleted. Only rank 0 touches the folder: the other ranks'
// save() returns at once unless there are per-rank items, which are gathered to rank 0 first
// (a collective: every rank calls save() with the same item names).
//
// restore() is collective: rank 0 lists the folder, reads checkpoints newest first, and skips any
// that is truncated, fails its checksum or is not a checkpoint at all, with a warning naming the
// file and the reason (the file is renamed to "<name>.invalid" so it is never picked, or pruned,
// again). It decides whether the newest valid one fits this job (Note [World size on resume]) and
// broadcasts its verdict and the file's bytes; every rank then loads the items it asks for.
//
// Note [World size on resume]
// Shared items (model, optimizer, sampler position) are the same on every rank, so a checkpoint
// written by R ranks can resume a job of R' ranks: a DistributedSampler that loads the saved state
// re-shards the rest of the epoch from its global position (Note [Sampler position]). Per-rank
// items (each rank's random generator) have no owner in a different world, so such a checkpoint
// is refused with a message saying so; CheckpointOptions::on_world_size_change = refuse refuses
// every change (for jobs whose results must not depend on the world size). Bitwise equality with
// an uninterrupted run holds only for the same world size: the global batch differs otherwise.
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "dtrain/core/build_mode.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/serialize.hpp"
#include "dtrain/train/checkpoint_record.hpp"

namespace dtrain {
namespace detail {
struct PendingWrite;  // train/checkpoint_impl.hpp

// What rank 0 found in the checkpoint folder; restore() hands it to every rank.
struct CheckpointChoice {
  enum class Kind : std::uint8_t { none, found, refused };
  Kind kind = Kind::none;
  std::string detail;  // found: the file's path; refused: why, as the error says it

  template <class Self>
  static auto tie_fields(Self& c) {
    return std::tie(c.kind, c.detail);
  }
};
}  // namespace detail
namespace elastic {
class State;  // train/elastic.hpp: restores its local commits as RestoredCheckpoint too
}  // namespace elastic

// A checkpoint could not be written, read, or used by this job.
class CheckpointError : public Error {
 public:
  explicit CheckpointError(const std::string& what) : Error(what) {}
};

enum class WorldSizeChange : std::uint8_t {
  reshard,  // resume on another number of ranks when the checkpoint has no per-rank items
  refuse,   // resume only on the world size that wrote the checkpoint
};

struct CheckpointOptions {
  // Created by rank 0 if missing; one job per folder (a path converts). The same text on every
  // rank, unless `name` is given: it names this object's collectives (Note [Checkpoint op names]).
  std::string directory;
  int keep_last = 3;      // newest checkpoints kept after each save; 0 keeps every one
  WorldSizeChange on_world_size_change = WorldSizeChange::reshard;
  // Names this object's collectives instead of the directory: for objects of one folder made at
  // once on several threads, or a folder named differently on each rank.
  std::string name{};
};

// Where training stands when a checkpoint is taken: optimizer steps applied so far and the epoch
// they are in (its position within the epoch travels as the sampler's state).
struct TrainingProgress {
  std::int64_t step = 0;
  std::int64_t epoch = 0;
};

namespace detail {
template <class T> struct is_view : std::false_type {};
template <class T, std::size_t N> struct is_view<std::span<T, N>> : std::true_type {};
template <class C, class Tr> struct is_view<std::basic_string_view<C, Tr>> : std::true_type {};
}  // namespace detail

// A named value to save. It refers to the value (no copy) and is serialized inside save(), so it
// must stay alive for that call only; build the list right in the call.
class CheckpointItem {
 public:
  template <class T>
  CheckpointItem(std::string_view name, const T& value)
      : name_(name), value_(&value), write_(&write_as<T>) {
    static_assert(!std::is_pointer_v<T> && !detail::is_view<T>::value,
                  "dtrain: a checkpoint item must own its data: a pointer, span or string_view "
                  "would save an address, not the values; save the container itself");
  }

  std::string_view name() const noexcept { return name_; }
  void write(ObjectWriter& w) const { write_(w, value_); }

 private:
  template <class T>
  static void write_as(ObjectWriter& w, const void* value) {
    w.write(*static_cast<const T*>(value));
  }
  std::string_view name_;
  const void* value_;
  void (*write_)(ObjectWriter&, const void*);
};

// A checkpoint read by restore(): its progress, and its items, deserialized on request.
class RestoredCheckpoint {
 public:
  std::int64_t step() const noexcept { return record_.step; }
  std::int64_t epoch() const noexcept { return record_.epoch; }
  std::int64_t world_size() const noexcept { return record_.world_size; }  // of the job that wrote it
  const std::string& file() const noexcept { return file_; }  // as rank 0 named it

  bool contains(std::string_view name) const noexcept { return find(name).has_value(); }

  // Item names: shared ones, then per-rank ones.
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& [n, b] : record_.shared) out.push_back(n);
    for (const auto& [n, b] : record_.per_rank) out.push_back(n);
    return out;
  }

  // Reads item `name` into `value` in place (this rank's own copy for a per-rank item).
  template <class T>
  void load(std::string_view name, T& value) const {
    const auto range = find(name);
    if (!range)
      throw CheckpointError(fmt::format(
          "dtrain: checkpoint {} has no item '{}'; it holds: {}. Save it under that name, or "
          "do not load it from checkpoints written before it was added",
          file_, name, fmt::join(names(), ", ")));
    const auto fail = [&](const std::string& why) {
      return CheckpointError(fmt::format(
          "dtrain: item '{}' of checkpoint {} ({} bytes) cannot be read into this type: {}. It "
          "was saved from a different type, or a dtrain_serialize/dtrain_deserialize pair reads "
          "differently than it writes",
          name, file_, range->size, why));
    };
    ObjectReader reader(bytes_->data() + range->offset, range->size);
    try {
      reader.read(value);
    } catch (const InvalidArgumentError& e) {
      // Reading ran past the item's end, or a dtrain_deserialize refused the data (and says why).
      throw fail(e.what());
    }
    if (!reader.done()) throw fail("bytes were left over");
  }

  template <class T>
  T get(std::string_view name) const {
    T value{};
    load(name, value);
    return value;
  }

 private:
  friend class Checkpoint;
  friend class elastic::State;
  RestoredCheckpoint(std::shared_ptr<const std::vector<char>> bytes, detail::CheckpointRecord record,
                     std::string file, int rank)
      : bytes_(std::move(bytes)), record_(std::move(record)), file_(std::move(file)), rank_(rank) {}

  std::optional<detail::ItemBytes> find(std::string_view name) const noexcept {
    for (const auto& [n, b] : record_.shared)
      if (n == name) return b;
    for (const auto& [n, ranks] : record_.per_rank)
      if (n == name && rank_ < static_cast<int>(ranks.size())) return ranks[static_cast<std::size_t>(rank_)];
    return std::nullopt;
  }

  std::shared_ptr<const std::vector<char>> bytes_;
  detail::CheckpointRecord record_;
  std::string file_;
  int rank_;
};

class Checkpoint {
 public:
  // Not collective. Rank 0 creates the folder and removes temporary files of writes that a crash
  // interrupted.
  DTRAIN_API explicit Checkpoint(CheckpointOptions options);

  DTRAIN_API Checkpoint(Checkpoint&& other) noexcept;
  DTRAIN_API Checkpoint& operator=(Checkpoint&& other) noexcept;
  Checkpoint(const Checkpoint&) = delete;
  Checkpoint& operator=(const Checkpoint&) = delete;

  // Waits for a write still in flight, so that the last checkpoint of a run that ends normally is
  // on disk; an error of that write is logged (a destructor cannot throw).
  DTRAIN_API ~Checkpoint();

  // Collective. The newest valid checkpoint of the folder, or nothing if there is none (start
  // afresh). Throws CheckpointError on every rank when the newest valid checkpoint does not fit
  // this job (Note [World size on resume]).
  DTRAIN_API std::optional<RestoredCheckpoint> restore();

  // Saves a checkpoint of `progress` with the given items (Note [Checkpoint flow]). Call it on
  // every rank at the same point of training, with the same item names. Shared items are taken
  // from rank 0; per-rank items from every rank. Returns once the items are serialized; the file is
  // written in the background. Throws the error of the previous write, if it failed.
  DTRAIN_API void save(const TrainingProgress& progress, std::initializer_list<CheckpointItem> shared,
                       std::initializer_list<CheckpointItem> per_rank = {});

  // Rank 0: blocks until the last save is on disk, and throws its error if it failed. Other
  // ranks: returns at once.
  DTRAIN_API void wait();

  // Rank 0: whether a save is still being written.
  DTRAIN_API bool writing() const;

  const CheckpointOptions& options() const noexcept { return options_; }

 private:
  using PerRankItems = std::vector<std::vector<std::pair<std::string, std::vector<char>>>>;

  DTRAIN_API void finish_quietly() noexcept;
  DTRAIN_API void check_arguments(const TrainingProgress& progress,
                                  std::span<const CheckpointItem> shared,
                                  std::span<const CheckpointItem> per_rank) const;
  DTRAIN_API PerRankItems gather_per_rank(std::span<const CheckpointItem> per_rank) const;
  DTRAIN_API void refuse_newer_checkpoints(std::int64_t step);
  DTRAIN_API detail::CheckpointChoice choose(std::vector<char>& bytes) const;
  DTRAIN_API static void set_aside(const std::string& path, const std::string& why);
  DTRAIN_API std::string world_size_refusal(const std::string& path,
                                            const detail::CheckpointRecord& record) const;

  DTRAIN_API void release_name() noexcept;

  CheckpointOptions options_;
  std::string name_key_;  // CheckpointOptions::name, or else the directory
  int name_slot_ = -1;    // its number among live objects of that key; -1: moved from
  std::string op_name_;   // the base of its collectives' names (Note [Checkpoint op names])
  int rank_ = 0;
  int world_ = 1;
  std::unique_ptr<detail::PendingWrite> pending_;  // rank 0: the write in flight, if any
  std::vector<char> spare_;                 // rank 0: a payload buffer to reuse
  bool checked_folder_ = false;             // rank 0: refuse_newer_checkpoints ran, or restore()
};

}  // namespace dtrain

#ifdef DTRAIN_HEADER_ONLY
#include "dtrain/train/checkpoint_impl.hpp"
#endif
