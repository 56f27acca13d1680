#pragma once
// How the public ops reach the engine: the few calls the collectives' templates make, declared
// here and defined with the engine (runtime/detail/submission_impl.hpp; Note [Build modes] in
// core/build_mode.hpp), so that a file using the collectives never compiles the engine itself.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "dtrain/core/build_mode.hpp"
#include "dtrain/runtime/execution/entry.hpp"
#include "dtrain/runtime/negotiation/request.hpp"
#include "dtrain/runtime/process_set.hpp"

namespace dtrain::detail {

class Engine;

// The running engine, kept alive for as long as the caller holds the pointer (Note [Lifecycle] in
// runtime/engine/runtime_state.hpp). Throws NotInitializedError naming `caller` when dtrain is not
// running.
DTRAIN_API std::shared_ptr<Engine> engine(std::string_view caller);

// The set `set` as an op of `kind` named `name` (empty: unnamed) about to run on it sees it.
// Throws InvalidArgumentError, naming the op, the set and its ranks, where this rank may not use
// the set: it is not a member, or the set is not one of this session's (created before a
// shutdown()). Nothing is submitted then: the members' ops are not this rank's concern.
DTRAIN_API SetOfOp enter_process_set(Engine& engine, const ProcessSet& set, OpKind kind,
                                     std::string_view name);

// The name of an unnamed op on process set `process_set` (Note [Generated names] in
// runtime/negotiation/op_names.hpp).
DTRAIN_API std::string generate_name(Engine& engine, OpKind kind, std::int32_t process_set);

// Submits `name` as rejected by this rank, so the peers' ops of that name fail at once instead of
// waiting for it (Note [Failed ops]). Never throws: the caller throws its own error.
DTRAIN_API void reject(Engine& engine, const std::string& name, OpKind kind,
                       const std::string& why, const std::string& group,
                       std::int32_t process_set) noexcept;

// Enqueues ops, all or nothing: throws, submitting none, for a duplicate in-flight name or when
// the engine has stopped.
DTRAIN_API void submit_all(Engine& engine, std::vector<std::shared_ptr<Entry>> entries);

inline void submit(Engine& engine, std::shared_ptr<Entry> entry) {
  std::vector<std::shared_ptr<Entry>> one;
  one.push_back(std::move(entry));
  submit_all(engine, std::move(one));
}

}  // namespace dtrain::detail

#ifdef DTRAIN_HEADER_ONLY
#include "dtrain/runtime/detail/submission_impl.hpp"
#endif
