#pragma once
// Definitions of train/checkpoint.hpp: the background write, the folder's housekeeping and the
// choice of the checkpoint to resume from (Note [Build modes] in core/build_mode.hpp).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>
#include <filesystem>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "dtrain/core/atomic_file.hpp"
#include "dtrain/core/crc32c.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/logging.hpp"
#include "dtrain/core/version.hpp"
#include "dtrain/runtime/session.hpp"
#include "dtrain/train/checkpoint.hpp"
#include "dtrain/train/checkpoint_format.hpp"
#include "dtrain/train/checkpoint_writer.hpp"
#include "dtrain/train/objects.hpp"

namespace dtrain {

namespace detail {

// A save being written in the background; its result is the payload buffer, for reuse.
struct PendingWrite {
  std::future<std::vector<char>> result;
};

inline std::string join_names(std::span<const CheckpointItem> items) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : ", ") + std::string(item.name());
  return out;
}

// Note [Checkpoint op names]
// A Checkpoint's collectives (restore()'s broadcasts, save()'s gather of per-rank items) carry
// names, so that any thread may call them (Note [Generated names] in
// runtime/negotiation/op_names.hpp), and the names are the object's own, so that two Checkpoint
// objects in use at once on two threads never submit one name: one rank's op of one object would
// pair with a peer's op of the other (a wrong restore, or a stall). Each rank must derive the same
// name for the same object without asking the others, since asking is itself an op that needs a
// name. So the name is "dtrain.checkpoint[<key>]", the key being CheckpointOptions::name or else
// the directory as the program wrote it (lexically normalized: "ckpt/" and "./ckpt" are "ckpt");
// objects of one key alive at the same time in a process add "#<n>", the lowest number no other
// live object of that key holds. An object made and dropped on one rank alone (to look at the
// folder, say) therefore shifts no other object's name, and a program that makes its objects in the
// same order on every rank names them alike. Two objects of one key made at the same moment on two
// threads may take their numbers in a different order on each rank: such objects need names of
// their own.
class CheckpointNameSlots {
 public:
  static int acquire(const std::string& key) {
    auto& self = instance();
    std::lock_guard lock(self.mutex_);
    std::set<int>& taken = self.taken_[key];
    int n = 0;
    while (taken.contains(n)) ++n;
    taken.insert(n);
    return n;
  }

  static void release(const std::string& key, int n) noexcept {
    auto& self = instance();
    std::lock_guard lock(self.mutex_);
    const auto it = self.taken_.find(key);
    if (it == self.taken_.end()) return;
    it->second.erase(n);
    if (it->second.empty()) self.taken_.erase(it);
  }

 private:
  static CheckpointNameSlots& instance() {
    static CheckpointNameSlots slots;
    return slots;
  }
  std::mutex mutex_;
  std::map<std::string, std::set<int>> taken_;
};

inline std::string checkpoint_name_key(const CheckpointOptions& options) {
  if (!options.name.empty()) return options.name;
  std::string key = std::filesystem::path(options.directory).lexically_normal().string();
  while (key.size() > 1 && key.back() == '/') key.pop_back();
  return key;
}

}  // namespace detail

DTRAIN_API Checkpoint::Checkpoint(CheckpointOptions options)
    : options_(std::move(options)), rank_(dtrain::rank()), world_(dtrain::size()) {
  if (options_.directory.empty())
    throw InvalidArgumentError("dtrain: CheckpointOptions::directory is empty: name the folder "
                               "the checkpoints go to");
  if (options_.keep_last < 0)
    throw InvalidArgumentError(fmt::format(
        "dtrain: CheckpointOptions::keep_last = {}: must be >= 1, or 0 to keep every checkpoint",
        options_.keep_last));
  name_key_ = detail::checkpoint_name_key(options_);
  name_slot_ = detail::CheckpointNameSlots::acquire(name_key_);
  op_name_ = name_slot_ == 0 ? fmt::format("dtrain.checkpoint[{}]", name_key_)
                             : fmt::format("dtrain.checkpoint[{}]#{}", name_key_, name_slot_);
  if (rank_ != 0) return;
  std::error_code ec;
  std::filesystem::create_directories(options_.directory, ec);
  if (ec) {
    release_name();  // no destructor runs after a constructor throws
    throw CheckpointError(fmt::format("dtrain: cannot create the checkpoint folder {}: {}",
                                      options_.directory, ec.message()));
  }
  detail::remove_stale_temporaries(options_.directory);
}

DTRAIN_API Checkpoint::Checkpoint(Checkpoint&& other) noexcept
    : options_(std::move(other.options_)), name_key_(std::move(other.name_key_)),
      name_slot_(std::exchange(other.name_slot_, -1)), op_name_(std::move(other.op_name_)),
      rank_(other.rank_), world_(other.world_), pending_(std::move(other.pending_)),
      spare_(std::move(other.spare_)), checked_folder_(other.checked_folder_) {}

DTRAIN_API Checkpoint::~Checkpoint() {
  finish_quietly();
  release_name();
}

DTRAIN_API void Checkpoint::release_name() noexcept {
  if (name_slot_ >= 0) detail::CheckpointNameSlots::release(name_key_, name_slot_);
  name_slot_ = -1;
}

DTRAIN_API Checkpoint& Checkpoint::operator=(Checkpoint&& other) noexcept {
  if (this != &other) {
    finish_quietly();
    release_name();
    name_key_ = std::move(other.name_key_);
    name_slot_ = std::exchange(other.name_slot_, -1);
    op_name_ = std::move(other.op_name_);
    options_ = std::move(other.options_);
    rank_ = other.rank_;
    world_ = other.world_;
    pending_ = std::move(other.pending_);
    spare_ = std::move(other.spare_);
    checked_folder_ = other.checked_folder_;
  }
  return *this;
}


DTRAIN_API std::optional<RestoredCheckpoint> Checkpoint::restore() {
  using Kind = detail::CheckpointChoice::Kind;
  detail::CheckpointChoice choice;
  auto bytes = std::make_shared<std::vector<char>>();
  if (rank_ == 0) choice = choose(*bytes);
  choice = broadcast_object(choice, 0, op_name_ + ".restore");
  if (choice.kind == Kind::refused) throw CheckpointError(choice.detail);
  if (choice.kind == Kind::none) return std::nullopt;

  std::vector<std::int64_t> size{static_cast<std::int64_t>(bytes->size())};
  broadcast(size, 0, op_name_ + ".restore.file_size");
  bytes->resize(static_cast<std::size_t>(size[0]));
  std::span<std::uint8_t> view(reinterpret_cast<std::uint8_t*>(bytes->data()), bytes->size());
  broadcast(view, 0, op_name_ + ".restore.bytes");
  detail::CheckpointRecord record;
  if (const std::string why = detail::parse_checkpoint(*bytes, record); !why.empty())
    throw CheckpointError(fmt::format("dtrain: checkpoint {} arrived damaged on rank {}: {}",
                                      choice.detail, rank_, why));
  checked_folder_ = true;  // restore() picked the newest; later saves continue after it
  return RestoredCheckpoint(std::move(bytes), std::move(record), choice.detail, rank_);
}

DTRAIN_API void Checkpoint::save(const TrainingProgress& progress,
                                std::initializer_list<CheckpointItem> shared,
                                std::initializer_list<CheckpointItem> per_rank) {
  check_arguments(progress, shared, per_rank);
  std::vector<std::vector<std::pair<std::string, std::vector<char>>>> gathered;
  if (per_rank.size() > 0) gathered = gather_per_rank(per_rank);
  if (rank_ != 0) return;
  if (!checked_folder_) refuse_newer_checkpoints(progress.step);

  ObjectWriter w;
  w.bytes().swap(spare_);  // reuse the capacity of an earlier payload: no fresh pages
  w.bytes().clear();
  detail::write_payload_head(w, progress, world_, shared);
  w.write(static_cast<std::uint64_t>(per_rank.size()));
  for (std::size_t i = 0; i < per_rank.size(); ++i) {
    w.write(std::string(std::data(per_rank)[i].name()));
    for (const auto& rank_items : gathered) w.write(rank_items[i].second);
  }
  std::vector<char> payload = std::move(w.bytes());

  wait();
  pending_ = std::make_unique<detail::PendingWrite>();
  pending_->result = std::async(std::launch::async, &detail::write_checkpoint_file,
                                options_.directory, progress.step, options_.keep_last,
                                std::move(payload));
}

DTRAIN_API void Checkpoint::wait() {
  if (!pending_) return;
  auto pending = std::move(pending_);
  try {
    spare_ = pending->result.get();
  } catch (const std::exception& e) {
    throw CheckpointError(fmt::format("dtrain: writing a checkpoint into {} failed: {}",
                                      options_.directory, e.what()));
  }
}

DTRAIN_API bool Checkpoint::writing() const {
  return pending_ &&
         pending_->result.wait_for(std::chrono::seconds(0)) != std::future_status::ready;
}


DTRAIN_API void Checkpoint::finish_quietly() noexcept {
  try {
    wait();
  } catch (const std::exception& e) {
    detail::log(LogLevel::error, "{}", e.what());
  }
}

DTRAIN_API void Checkpoint::check_arguments(const TrainingProgress& progress,
                                           std::span<const CheckpointItem> shared,
                                           std::span<const CheckpointItem> per_rank) const {
  detail::check_save_arguments("Checkpoint::save", progress, shared, per_rank);
}

DTRAIN_API Checkpoint::PerRankItems Checkpoint::gather_per_rank(
    std::span<const CheckpointItem> per_rank) const {
  std::vector<std::pair<std::string, std::vector<char>>> mine;
  for (const auto& item : per_rank) {
    ObjectWriter w;
    item.write(w);
    mine.emplace_back(std::string(item.name()), std::move(w.bytes()));
  }
  auto all = allgather_object(mine, op_name_ + ".save.per_rank");
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

DTRAIN_API void Checkpoint::refuse_newer_checkpoints(std::int64_t step) {
  const auto files = detail::list_checkpoint_files(options_.directory);
  if (!files.empty() && files.back().step > step)
    throw CheckpointError(fmt::format(
        "dtrain: checkpoint folder {} already holds {} (step {}), later than this save (step "
        "{}), and this job did not resume from it: resume (Checkpoint::restore), or use an empty "
        "folder, or delete the old checkpoints",
        options_.directory, files.back().path.string(), files.back().step, step));
  checked_folder_ = true;
}

DTRAIN_API detail::CheckpointChoice Checkpoint::choose(std::vector<char>& bytes) const {
  using Kind = detail::CheckpointChoice::Kind;
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
      set_aside(it->path.string(), why);
      continue;
    }
    if (std::string refusal = world_size_refusal(it->path.string(), record); !refusal.empty())
      return {Kind::refused, std::move(refusal)};
    detail::log(LogLevel::info, "dtrain: resuming from checkpoint {} (step {}, epoch {})",
                it->path.string(), record.step, record.epoch);
    return {Kind::found, it->path.string()};
  }
  bytes.clear();
  return {Kind::none, ""};
}

DTRAIN_API void Checkpoint::set_aside(const std::string& path, const std::string& why) {
  detail::set_aside_checkpoint(path, why);
}

DTRAIN_API std::string Checkpoint::world_size_refusal(const std::string& path,
                                                    const detail::CheckpointRecord& record) const {
  if (record.world_size == world_) return {};
  if (!record.per_rank.empty()) {
    std::string names;
    for (const auto& [n, b] : record.per_rank) names += (names.empty() ? "'" : ", '") + n + "'";
    return fmt::format(
        "dtrain: cannot resume from checkpoint {}: it was written by {} ranks and holds per-rank "
        "state ({}) for each of them, but this job has {} ranks. Restart with {} ranks, or save "
        "that state as shared items",
        path, record.world_size, names, world_, record.world_size);
  }
  if (options_.on_world_size_change == WorldSizeChange::refuse)
    return fmt::format(
        "dtrain: cannot resume from checkpoint {}: it was written by {} ranks, this job has {}, "
        "and CheckpointOptions::on_world_size_change is refuse. Restart with {} ranks, or allow "
        "WorldSizeChange::reshard (samplers then continue the epoch over {} ranks)",
        path, record.world_size, world_, record.world_size, world_);
  detail::log(LogLevel::warning,
              "dtrain: checkpoint {} was written by {} ranks, this job has {}: samplers that load "
              "its state re-shard the rest of epoch {} over {} ranks, and the global batch "
              "changes with the world size",
              path, record.world_size, world_, record.epoch, world_);
  return {};
}

}  // namespace dtrain
