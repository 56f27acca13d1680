#pragma once
// Definitions of runtime/submission.hpp, with the engine (Note [Build modes] in
// core/build_mode.hpp).
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dtrain/runtime/engine.hpp"
#include "dtrain/runtime/runtime_state.hpp"
#include "dtrain/runtime/submission.hpp"

namespace dtrain::detail {

DTRAIN_API std::shared_ptr<Engine> engine(std::string_view caller) {
  auto rt = runtime(caller);
  Engine* e = rt->engine.get();
  return std::shared_ptr<Engine>(std::move(rt), e);
}

DTRAIN_API std::string generate_name(Engine& engine, OpKind kind) {
  return engine.generate_name(kind);
}

DTRAIN_API void reject(Engine& engine, const std::string& name, OpKind kind,
                       const std::string& why, const std::string& group) noexcept {
  engine.reject(name, kind, why, group);
}

DTRAIN_API void submit_all(Engine& engine, std::vector<std::shared_ptr<Entry>> entries) {
  engine.submit_all(std::move(entries));
}

DTRAIN_API int world_size(const Engine& engine) { return engine.size(); }

}  // namespace dtrain::detail
