#pragma once
// How the public ops reach the engine: the few calls the collectives' templates make, declared
// here and defined with the engine (runtime/submission_impl.hpp; Note [Build modes] in
// core/build_mode.hpp), so that a file using the collectives never compiles the engine itself.
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "dtrain/core/build_mode.hpp"
#include "dtrain/runtime/entry.hpp"
#include "dtrain/runtime/request.hpp"

namespace dtrain::detail {

class Engine;

// The running engine, kept alive for as long as the caller holds the pointer (Note [Lifecycle] in
// runtime/runtime_state.hpp). Throws NotInitializedError naming `caller` when dtrain is not
// running.
DTRAIN_API std::shared_ptr<Engine> engine(std::string_view caller);

// The name of an unnamed op (Note [Generated names] in runtime/engine.hpp).
DTRAIN_API std::string generate_name(Engine& engine, OpKind kind);

// Submits `name` as rejected by this rank, so the peers' ops of that name fail at once instead of
// waiting for it (Note [Failed ops]). Never throws: the caller throws its own error.
DTRAIN_API void reject(Engine& engine, const std::string& name, OpKind kind,
                       const std::string& why, const std::string& group) noexcept;

// Enqueues ops, all or nothing: throws, submitting none, for a duplicate in-flight name or when
// the engine has stopped.
DTRAIN_API void submit_all(Engine& engine, std::vector<std::shared_ptr<Entry>> entries);

// Ranks in the world of `engine`.
DTRAIN_API int world_size(const Engine& engine);

inline void submit(Engine& engine, std::shared_ptr<Entry> entry) {
  std::vector<std::shared_ptr<Entry>> one;
  one.push_back(std::move(entry));
  submit_all(engine, std::move(one));
}

}  // namespace dtrain::detail

#ifdef DTRAIN_HEADER_ONLY
#include "dtrain/runtime/submission_impl.hpp"
#endif
