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
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>
#include <filesystem>
#include <future>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dtrain/core/error.hpp"
#include "dtrain/core/logging.hpp"
#include "dtrain/core/version.hpp"
#include "dtrain/train/atomic_file.hpp"
#include "dtrain/train/checkpoint_format.hpp"
#include "dtrain/train/crc32c.hpp"
#include "dtrain/train/objects.hpp"
#include "dtrain/core/serialize.hpp"

namespace dtrain {

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
  std::filesystem::path directory;  // created by rank 0 if missing; one job per folder
  int keep_last = 3;                // newest checkpoints kept after each save; 0 keeps every one
  WorldSizeChange on_world_size_change = WorldSizeChange::reshard;
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
  const std::filesystem::path& file() const noexcept { return file_; }      // as rank 0 named it

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
          file_.string(), name, fmt::join(names(), ", ")));
    const auto fail = [&](const std::string& why) {
      return CheckpointError(fmt::format(
          "dtrain: item '{}' of checkpoint {} ({} bytes) cannot be read into this type: {}. It "
          "was saved from a different type, or a dtrain_serialize/dtrain_deserialize pair reads "
          "differently than it writes",
          name, file_.string(), range->size, why));
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
  RestoredCheckpoint(std::shared_ptr<const std::vector<char>> bytes, detail::CheckpointRecord record,
                     std::filesystem::path file, int rank)
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
  std::filesystem::path file_;
  int rank_;
};

namespace detail {

inline constexpr std::size_t checkpoint_write_chunk_bytes = std::size_t{4} << 20;

// Removes temporary files that writers killed mid-write left behind (not this process's own).
inline void remove_stale_temporaries(const std::filesystem::path& directory) {
  const std::string own = fmt::format(".tmp-{}", static_cast<long>(::getpid()));
  std::error_code ec;
  for (std::filesystem::directory_iterator it(directory, ec), end; !ec && it != end;
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!is_temporary_name(name, checkpoint_prefix) || name.ends_with(own)) continue;
    std::error_code removed;
    std::filesystem::remove(it->path(), removed);
    log(LogLevel::debug, "dtrain: removed {}, left by a checkpoint write that did not finish",
        it->path().string());
  }
}

// Deletes every checkpoint but the newest keep_last (0: keeps all).
inline void prune_checkpoints(const std::filesystem::path& directory, int keep_last) {
  if (keep_last <= 0) return;
  const auto files = list_checkpoint_files(directory);
  const std::size_t keep = static_cast<std::size_t>(keep_last);
  for (std::size_t i = 0; i + keep < files.size(); ++i) {
    std::error_code ec;
    std::filesystem::remove(files[i].path, ec);
    if (ec)
      log(LogLevel::warning, "dtrain: cannot delete old checkpoint {}: {}", files[i].path.string(),
          ec.message());
  }
}

// The background half of save(): checksum, atomic write, pruning. Returns the buffer for reuse.
inline std::vector<char> write_checkpoint_file(std::filesystem::path directory, std::int64_t step,
                                               int keep_last, std::vector<char> payload) {
  AtomicFileWriter file(directory / checkpoint_file_name(step));
  const auto header = checkpoint_header(payload.size());
  std::uint32_t crc = crc32c(header.data(), header.size());
  file.write(header.data(), header.size());
  for (std::size_t at = 0; at < payload.size(); at += checkpoint_write_chunk_bytes) {
    const std::size_t n = std::min(checkpoint_write_chunk_bytes, payload.size() - at);
    crc = crc32c_extend(crc, payload.data() + at, n);
    file.write(payload.data() + at, n);
  }
  const auto trailer = checkpoint_trailer(crc);
  file.write(trailer.data(), trailer.size());
  file.commit();
  prune_checkpoints(directory, keep_last);
  payload.clear();
  return payload;
}

// Appends name, a size placeholder and the item's bytes, then patches the size: one copy of the
// value, straight into the payload.
inline void write_item(ObjectWriter& w, std::string_view name, const CheckpointItem& item) {
  w.write(std::string(name));
  const std::size_t size_at = w.bytes().size();
  w.write(std::uint64_t{0});
  item.write(w);
  const std::uint64_t size = w.bytes().size() - size_at - sizeof(std::uint64_t);
  std::memcpy(w.bytes().data() + size_at, &size, sizeof size);
}

inline std::string join_names(std::span<const CheckpointItem> items) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : ", ") + std::string(item.name());
  return out;
}

}  // namespace detail

class Checkpoint {
 public:
  // Not collective. Rank 0 creates the folder and removes temporary files of writes that a crash
  // interrupted.
  explicit Checkpoint(CheckpointOptions options)
      : options_(std::move(options)), rank_(dtrain::rank()), world_(dtrain::size()) {
    if (options_.directory.empty())
      throw InvalidArgumentError("dtrain: CheckpointOptions::directory is empty: name the folder "
                                 "the checkpoints go to");
    if (options_.keep_last < 0)
      throw InvalidArgumentError(fmt::format(
          "dtrain: CheckpointOptions::keep_last = {}: must be >= 1, or 0 to keep every checkpoint",
          options_.keep_last));
    if (rank_ != 0) return;
    std::error_code ec;
    std::filesystem::create_directories(options_.directory, ec);
    if (ec)
      throw CheckpointError(fmt::format("dtrain: cannot create the checkpoint folder {}: {}",
                                        options_.directory.string(), ec.message()));
    detail::remove_stale_temporaries(options_.directory);
  }

  Checkpoint(Checkpoint&&) noexcept = default;
  Checkpoint& operator=(Checkpoint&& other) noexcept {
    if (this != &other) {
      finish_quietly();
      options_ = std::move(other.options_);
      rank_ = other.rank_;
      world_ = other.world_;
      pending_ = std::move(other.pending_);
      spare_ = std::move(other.spare_);
      checked_folder_ = other.checked_folder_;
    }
    return *this;
  }
  Checkpoint(const Checkpoint&) = delete;
  Checkpoint& operator=(const Checkpoint&) = delete;

  // Waits for a write still in flight, so that the last checkpoint of a run that ends normally is
  // on disk; an error of that write is logged (a destructor cannot throw).
  ~Checkpoint() { finish_quietly(); }

  // Collective. The newest valid checkpoint of the folder, or nothing if there is none (start
  // afresh). Throws CheckpointError on every rank when the newest valid checkpoint does not fit
  // this job (Note [World size on resume]).
  std::optional<RestoredCheckpoint> restore() {
    std::pair<std::string, std::string> verdict{"none", ""};  // none | ok <file> | error <why>
    auto bytes = std::make_shared<std::vector<char>>();
    if (rank_ == 0) verdict = choose(*bytes);
    verdict = broadcast_object(verdict, 0, "dtrain.checkpoint.restore");
    if (verdict.first == "error") throw CheckpointError(verdict.second);
    if (verdict.first == "none") return std::nullopt;

    std::vector<std::int64_t> size{static_cast<std::int64_t>(bytes->size())};
    broadcast(size, 0, "dtrain.checkpoint.restore.size");
    bytes->resize(static_cast<std::size_t>(size[0]));
    std::span<std::uint8_t> view(reinterpret_cast<std::uint8_t*>(bytes->data()), bytes->size());
    broadcast(view, 0, "dtrain.checkpoint.restore.bytes");
    detail::CheckpointRecord record;
    if (const std::string why = detail::parse_checkpoint(*bytes, record); !why.empty())
      throw CheckpointError(fmt::format("dtrain: checkpoint {} arrived damaged on rank {}: {}",
                                        verdict.second, rank_, why));
    checked_folder_ = true;  // restore() picked the newest; later saves continue after it
    return RestoredCheckpoint(std::move(bytes), std::move(record), verdict.second, rank_);
  }

  // Saves a checkpoint of `progress` with the given items (Note [Checkpoint flow]). Call it on
  // every rank at the same point of training, with the same item names. Shared items are taken
  // from rank 0; per-rank items from every rank. Returns once the items are serialized; the file is
  // written in the background. Throws the error of the previous write, if it failed.
  void save(const TrainingProgress& progress, std::initializer_list<CheckpointItem> shared,
            std::initializer_list<CheckpointItem> per_rank = {}) {
    check_arguments(progress, shared, per_rank);
    std::vector<std::vector<std::pair<std::string, std::vector<char>>>> gathered;
    if (per_rank.size() > 0) gathered = gather_per_rank(per_rank);
    if (rank_ != 0) return;
    if (!checked_folder_) refuse_newer_checkpoints(progress.step);

    ObjectWriter w;
    w.bytes().swap(spare_);  // reuse the capacity of an earlier payload: no fresh pages
    w.bytes().clear();
    w.write(progress.step);
    w.write(progress.epoch);
    w.write(static_cast<std::int64_t>(world_));
    w.write(fmt::format("dtrain {}", version()));
    w.write(static_cast<std::uint64_t>(shared.size()));
    for (const auto& item : shared) detail::write_item(w, item.name(), item);
    w.write(static_cast<std::uint64_t>(per_rank.size()));
    for (std::size_t i = 0; i < per_rank.size(); ++i) {
      w.write(std::string(std::data(per_rank)[i].name()));
      for (const auto& rank_items : gathered) w.write(rank_items[i].second);
    }
    std::vector<char> payload = std::move(w.bytes());

    wait();
    pending_ = std::async(std::launch::async, &detail::write_checkpoint_file, options_.directory,
                          progress.step, options_.keep_last, std::move(payload));
  }

  // Rank 0: blocks until the last save is on disk, and throws its error if it failed. Other
  // ranks: returns at once.
  void wait() {
    if (!pending_.valid()) return;
    try {
      spare_ = pending_.get();
    } catch (const std::exception& e) {
      throw CheckpointError(fmt::format("dtrain: writing a checkpoint into {} failed: {}",
                                        options_.directory.string(), e.what()));
    }
  }

  // Rank 0: whether a save is still being written.
  bool writing() const {
    return pending_.valid() &&
           pending_.wait_for(std::chrono::seconds(0)) != std::future_status::ready;
  }

  const CheckpointOptions& options() const noexcept { return options_; }

 private:
  void finish_quietly() noexcept {
    try {
      wait();
    } catch (const std::exception& e) {
      detail::log(LogLevel::error, "{}", e.what());
    }
  }

  void check_arguments(const TrainingProgress& progress, std::span<const CheckpointItem> shared,
                       std::span<const CheckpointItem> per_rank) const {
    if (progress.step < 0 || progress.epoch < 0)
      throw InvalidArgumentError(fmt::format(
          "dtrain: Checkpoint::save: step {} and epoch {} must be >= 0", progress.step,
          progress.epoch));
    std::vector<std::string_view> names;
    for (const auto& item : shared) names.push_back(item.name());
    for (const auto& item : per_rank) names.push_back(item.name());
    std::sort(names.begin(), names.end());
    if (!names.empty() && names.front().empty())
      throw InvalidArgumentError("dtrain: Checkpoint::save: an item has an empty name");
    if (auto dup = std::adjacent_find(names.begin(), names.end()); dup != names.end())
      throw InvalidArgumentError(fmt::format(
          "dtrain: Checkpoint::save: item name '{}' appears twice: names must be unique", *dup));
  }

  // Every rank's per-rank items, in rank order (each rank's list in the order given).
  std::vector<std::vector<std::pair<std::string, std::vector<char>>>> gather_per_rank(
      std::span<const CheckpointItem> per_rank) const {
    std::vector<std::pair<std::string, std::vector<char>>> mine;
    for (const auto& item : per_rank) {
      ObjectWriter w;
      item.write(w);
      mine.emplace_back(std::string(item.name()), std::move(w.bytes()));
    }
    auto all = allgather_object(mine, "dtrain.checkpoint.save.per_rank");
    for (std::size_t r = 1; r < all.size(); ++r) {
      bool same = all[r].size() == all[0].size();
      for (std::size_t i = 0; same && i < all[r].size(); ++i) same = all[r][i].first == all[0][i].first;
      if (!same) {
        auto list = [](const auto& items) {
          std::string out;
          for (const auto& [n, b] : items) out += (out.empty() ? "" : ", ") + n;
          return out;
        };
        throw InvalidArgumentError(fmt::format(
            "dtrain: Checkpoint::save: rank {} passed per-rank items ({}), rank 0 passed ({}): "
            "every rank must pass the same names in the same order",
            r, list(all[r]), list(all[0])));
      }
    }
    return all;
  }

  // A first save below a checkpoint already in the folder would be pruned in favour of another
  // run's files and picked over by the next restore: stop instead.
  void refuse_newer_checkpoints(std::int64_t step) {
    const auto files = detail::list_checkpoint_files(options_.directory);
    if (!files.empty() && files.back().step > step)
      throw CheckpointError(fmt::format(
          "dtrain: checkpoint folder {} already holds {} (step {}), later than this save (step "
          "{}), and this job did not resume from it: resume (Checkpoint::restore), or use an empty "
          "folder, or delete the old checkpoints",
          options_.directory.string(), files.back().path.string(), files.back().step, step));
    checked_folder_ = true;
  }

  // Rank 0: the verdict restore() broadcasts, and the chosen file's bytes.
  std::pair<std::string, std::string> choose(std::vector<char>& bytes) const {
    std::vector<detail::SkippedCheckpointEntry> skipped;
    const auto files = detail::list_checkpoint_files(options_.directory, &skipped);
    for (const auto& entry : skipped)
      detail::log(LogLevel::warning, "dtrain: skipping {}: it is named like a checkpoint but is {}",
                  entry.path.string(), entry.what);
    for (auto it = files.rbegin(); it != files.rend(); ++it) {
      detail::CheckpointRecord record;
      std::string why = detail::read_file_bytes(it->path, bytes);
      if (why.empty()) why = detail::parse_checkpoint(bytes, record);
      if (why.empty() && record.step != it->step)
        why = fmt::format("it holds step {} but is named for step {}", record.step, it->step);
      if (!why.empty()) {
        set_aside(it->path, why);
        continue;
      }
      if (std::string refusal = world_size_refusal(it->path, record); !refusal.empty())
        return {"error", std::move(refusal)};
      detail::log(LogLevel::info, "dtrain: resuming from checkpoint {} (step {}, epoch {})",
                  it->path.string(), record.step, record.epoch);
      return {"ok", it->path.string()};
    }
    bytes.clear();
    return {"none", ""};
  }

  static void set_aside(const std::filesystem::path& path, const std::string& why) {
    const std::filesystem::path aside = path.string() + ".invalid";
    std::error_code ec;
    std::filesystem::rename(path, aside, ec);
    detail::log(LogLevel::warning, "dtrain: skipping checkpoint {}: {}; {}", path.string(), why,
                ec ? fmt::format("could not rename it aside: {}", ec.message())
                   : fmt::format("renamed it to {}", aside.string()));
  }

  std::string world_size_refusal(const std::filesystem::path& path,
                                 const detail::CheckpointRecord& record) const {
    if (record.world_size == world_) return {};
    if (!record.per_rank.empty()) {
      std::string names;
      for (const auto& [n, b] : record.per_rank) names += (names.empty() ? "'" : ", '") + n + "'";
      return fmt::format(
          "dtrain: cannot resume from checkpoint {}: it was written by {} ranks and holds per-rank "
          "state ({}) for each of them, but this job has {} ranks. Restart with {} ranks, or save "
          "that state as shared items",
          path.string(), record.world_size, names, world_, record.world_size);
    }
    if (options_.on_world_size_change == WorldSizeChange::refuse)
      return fmt::format(
          "dtrain: cannot resume from checkpoint {}: it was written by {} ranks, this job has {}, "
          "and CheckpointOptions::on_world_size_change is refuse. Restart with {} ranks, or allow "
          "WorldSizeChange::reshard (samplers then continue the epoch over {} ranks)",
          path.string(), record.world_size, world_, record.world_size, world_);
    detail::log(LogLevel::warning,
                "dtrain: checkpoint {} was written by {} ranks, this job has {}: samplers that load "
                "its state re-shard the rest of epoch {} over {} ranks, and the global batch "
                "changes with the world size",
                path.string(), record.world_size, world_, record.epoch, world_);
    return {};
  }

  CheckpointOptions options_;
  int rank_ = 0;
  int world_ = 1;
  std::future<std::vector<char>> pending_;  // rank 0: the write in flight; returns its buffer
  std::vector<char> spare_;                 // rank 0: a payload buffer to reuse
  bool checked_folder_ = false;             // rank 0: refuse_newer_checkpoints ran, or restore()
};

}  // namespace dtrain
