#pragma once
// Definitions of runtime/detail/submission.hpp, with the engine (Note [Build modes] in
// core/build_mode.hpp).
#include <algorithm>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dtrain/core/error.hpp"
#include "dtrain/runtime/detail/process_set_impl.hpp"
#include "dtrain/runtime/detail/submission.hpp"
#include "dtrain/runtime/engine/engine.hpp"
#include "dtrain/runtime/engine/runtime_state.hpp"

namespace dtrain::detail {

DTRAIN_API std::shared_ptr<Engine> engine(std::string_view caller) {
  auto rt = runtime(caller);
  Engine* e = rt->engine.get();
  return std::shared_ptr<Engine>(std::move(rt), e);
}

DTRAIN_API SetOfOp enter_process_set(Engine& engine, const ProcessSet& set, OpKind kind,
                                     std::string_view name) {
  SetOfOp out{set.id(), engine.process_set_ranks(set.id())};
  const auto& given = ProcessSetAccess::ranks(set);
  const std::string op = name.empty() ? fmt::format("an unnamed {}", kind)
                                      : fmt::format("{} '{}'", kind, name);
  if (!out.ranks || (given && *given != *out.ranks))
    throw InvalidArgumentError(fmt::format(
        "dtrain: {}: process set {} (ranks [{}]) is not one of this dtrain session's process "
        "sets: create sets with dtrain::add_process_set() after dtrain::init(); they do not "
        "survive dtrain::shutdown()",
        op, set.id(), given ? fmt::format("{}", fmt::join(*given, ", ")) : std::string("?")));
  if (!std::binary_search(out.ranks->begin(), out.ranks->end(), engine.rank()))
    throw InvalidArgumentError(fmt::format(
        "dtrain: {}: rank {} is not a member of process set {} (ranks [{}]); only its members "
        "may use it. Submit the op on the members only, or on a set this rank belongs to.",
        op, engine.rank(), set.id(), fmt::join(*out.ranks, ", ")));
  return out;
}

DTRAIN_API std::string generate_name(Engine& engine, OpKind kind, std::int32_t process_set) {
  return engine.generate_name(kind, process_set);
}

DTRAIN_API void reject(Engine& engine, const std::string& name, OpKind kind,
                       const std::string& why, const std::string& group,
                       std::int32_t process_set) noexcept {
  engine.reject(name, kind, why, group, process_set);
}

DTRAIN_API void submit_all(Engine& engine, std::vector<std::shared_ptr<Entry>> entries) {
  engine.submit_all(std::move(entries));
}

}  // namespace dtrain::detail
