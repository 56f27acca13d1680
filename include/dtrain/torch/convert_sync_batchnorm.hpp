#pragma once
// convert_sync_batchnorm: replaces every torch::nn::BatchNorm1d/2d/3d in a module tree by a
// dtrain::SyncBatchNorm that takes over its parameters, buffers, options and training mode.
//
//   auto model = std::make_shared<Net>();
//   dtrain::convert_sync_batchnorm(*model);   // before building the optimizer is customary; after
//                                              // works too (the parameters are the same tensors)
//
// Note [Replacing modules in libtorch]
// Python swaps a submodule by assigning an attribute; libtorch has no such thing. A module reaches
// its children in two ways: through the registry every Module keeps (children_, which
// named_modules(), parameters(), to() and serialization walk), which Module::replace_module
// rewrites; and through its own pointers to them, which nothing outside the module can see. The
// containers keep such pointers in known places (Sequential the AnyModules its forward calls,
// ModuleList and ModuleDict their lists), and those are rewritten too. A user's module that holds
// a typed member (`torch::nn::BatchNorm2d bn;`) and calls it in forward would, once the registry
// was rewritten, still call the old BatchNorm while its parameters() listed the new one's: the
// model would train unsynchronized with no sign of it. Such a member cannot be redirected (a
// BatchNorm2d handle cannot hold a SyncBatchNorm), but it can be detected: the references to each
// BatchNorm are counted, and one that neither the registry nor a container accounts for means
// someone else holds it. Then nothing is replaced and the error names the module and the one-line
// fix: where the model declares and constructs torch::nn::BatchNorm2d, write
// dtrain::SyncBatchNorm2d (torch/sync_batch_norm.hpp: it takes the same options) and skip the
// conversion; or hold the norm in a Sequential, a ModuleList or a ModuleDict. A handle the caller
// merely keeps (a local variable) counts too: release it before converting.
#include <torch/torch.h>

#include <cstddef>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dtrain/core/error.hpp"
#include "dtrain/torch/sync_batch_norm.hpp"

namespace dtrain {

struct ConvertSyncBatchNormOptions {
  // Each new module is named "<name_prefix>.<its path in the model>" (Note [SyncBatchNorm op
  // names] in torch/sync_batch_norm.hpp). A process set will join these options (Note
  // [SyncBatchNorm and process sets]).
  std::string name_prefix = "sync_batch_norm";
};

namespace detail {

// The options and state of a libtorch BatchNorm of any dimension, or nothing for other modules.
struct BatchNormParts {
  torch::nn::BatchNormOptions options{1};
  SyncBatchNormState state;
  bool training = true;
  char dims = '2';  // which of BatchNorm1d/2d/3d, for the fix an error names
};

template <class Impl>
bool batch_norm_parts_as(torch::nn::Module& m, BatchNormParts& out, char dims) {
  auto* bn = dynamic_cast<Impl*>(&m);
  if (bn == nullptr) return false;
  out.options = bn->options;
  out.state = {bn->weight, bn->bias, bn->running_mean, bn->running_var, bn->num_batches_tracked};
  out.training = bn->is_training();
  out.dims = dims;
  return true;
}

inline bool batch_norm_parts(torch::nn::Module& m, BatchNormParts& out) {
  return batch_norm_parts_as<torch::nn::BatchNorm1dImpl>(m, out, '1') ||
         batch_norm_parts_as<torch::nn::BatchNorm2dImpl>(m, out, '2') ||
         batch_norm_parts_as<torch::nn::BatchNorm3dImpl>(m, out, '3');
}

// "write dtrain::SyncBatchNorm2d where the model says torch::nn::BatchNorm2d", for each dimension
// among `dims`.
inline std::string drop_in_fix(const std::set<char>& dims) {
  std::vector<std::string> pairs;
  for (const char d : dims)
    pairs.push_back(fmt::format("dtrain::SyncBatchNorm{0}d where it says torch::nn::BatchNorm{0}d",
                                d));
  return fmt::format("write {}", fmt::join(pairs, ", and "));
}

// Where a BatchNorm is registered: the parent and the child's name there.
struct ChildSlot {
  torch::nn::Module* parent;
  std::string key;
};

struct PlannedReplacement {
  std::shared_ptr<torch::nn::Module> batch_norm;  // the plan's own reference
  std::string path;                               // the first path it was found under
  std::vector<ChildSlot> slots;
  long known_references = 0;  // registry entries and container entries that hold it
};

// References a container holds to `target` besides its registry entry.
inline long container_references(torch::nn::Module& parent, const torch::nn::Module* target) {
  long n = 0;
  if (auto* seq = dynamic_cast<torch::nn::SequentialImpl*>(&parent)) {
    for (auto& any : *seq) n += any.ptr().get() == target ? 1 : 0;
  } else if (auto* list = dynamic_cast<torch::nn::ModuleListImpl*>(&parent)) {
    for (auto& p : *list) n += p.get() == target ? 1 : 0;
  } else if (auto* dict = dynamic_cast<torch::nn::ModuleDictImpl*>(&parent)) {
    for (auto& item : *dict) n += item.value().get() == target ? 1 : 0;
  }
  return n;
}

inline void replace_in_container(torch::nn::Module& parent, const torch::nn::Module* old,
                                 const std::shared_ptr<SyncBatchNormImpl>& sync) {
  if (auto* seq = dynamic_cast<torch::nn::SequentialImpl*>(&parent)) {
    for (auto& any : *seq)
      if (any.ptr().get() == old) any = torch::nn::AnyModule(sync);
  } else if (auto* list = dynamic_cast<torch::nn::ModuleListImpl*>(&parent)) {
    for (auto& p : *list)
      if (p.get() == old) p = sync;
  } else if (auto* dict = dynamic_cast<torch::nn::ModuleDictImpl*>(&parent)) {
    for (auto& item : *dict)
      if (item.value().get() == old) item.value() = sync;
  }
}

// Walks the registry below `parent`, recording every BatchNorm child once per registration.
inline void plan_replacements(torch::nn::Module& parent, const std::string& prefix,
                              std::map<const torch::nn::Module*, PlannedReplacement>& plan,
                              std::set<const torch::nn::Module*>& visited) {
  if (!visited.insert(&parent).second) return;  // a module registered twice is walked once
  BatchNormParts ignored;
  for (const auto& child : parent.named_children()) {
    const std::string path = prefix.empty() ? child.key() : prefix + "." + child.key();
    auto& module = *child.value();
    if (!batch_norm_parts(module, ignored)) {
      plan_replacements(module, path, plan, visited);
      continue;
    }
    auto [it, first] = plan.try_emplace(&module);
    auto& entry = it->second;
    if (first) {
      entry.batch_norm = child.value();
      entry.path = path;
    }
    entry.slots.push_back({&parent, child.key()});
    entry.known_references += 1 + container_references(parent, &module);
  }
}

}  // namespace detail

// Replaces every BatchNorm1d/2d/3d below `module` (Note [Replacing modules in libtorch]) and
// returns how many it replaced. Throws InvalidArgumentError, replacing nothing, when `module`
// itself is a BatchNorm or when some BatchNorm is referenced from outside the module tree.
inline std::size_t convert_sync_batchnorm(torch::nn::Module& module,
                                          const ConvertSyncBatchNormOptions& options = {}) {
  detail::BatchNormParts parts;
  if (detail::batch_norm_parts(module, parts))
    throw InvalidArgumentError(
        "dtrain::convert_sync_batchnorm: the module itself is a BatchNorm, which cannot be "
        "replaced in place: construct a dtrain::SyncBatchNorm instead, or convert its parent");
  std::map<const torch::nn::Module*, detail::PlannedReplacement> plan;
  std::set<const torch::nn::Module*> visited;
  detail::plan_replacements(module, "", plan, visited);

  std::vector<std::string> held_elsewhere;
  std::set<char> dims;
  for (const auto& [ptr, entry] : plan) {
    const long outside = entry.batch_norm.use_count() - 1 - entry.known_references;
    if (outside <= 0) continue;
    held_elsewhere.push_back(fmt::format("'{}' ({} more reference{})", entry.path, outside,
                                         outside == 1 ? "" : "s"));
    detail::batch_norm_parts(*entry.batch_norm, parts);
    dims.insert(parts.dims);
  }
  if (!held_elsewhere.empty())
    throw InvalidArgumentError(fmt::format(
        "dtrain::convert_sync_batchnorm: BatchNorm module{} {} {} referenced from outside the "
        "module tree, typically by a member such as `torch::nn::BatchNorm2d bn;` that forward() "
        "calls, which libtorch cannot redirect to a new module: replacing only the registry would "
        "leave forward() using unsynchronized batch norm. Nothing was replaced. The fix: in the "
        "model, {} (the member's type and its construction; it takes the same options and keeps "
        "the parameter names), and do not convert. Or hold these norms in a "
        "torch::nn::Sequential, ModuleList or ModuleDict; release any handle you keep to them.",
        held_elsewhere.size() == 1 ? "" : "s", fmt::join(held_elsewhere, ", "),
        held_elsewhere.size() == 1 ? "is" : "are", detail::drop_in_fix(dims)));

  for (auto& [ptr, entry] : plan) {
    detail::batch_norm_parts(*entry.batch_norm, parts);
    auto sync = std::make_shared<SyncBatchNormImpl>(
        detail::sync_batch_norm_options(parts.options)
            .name(options.name_prefix + "." + entry.path),
        parts.state);
    sync->train(parts.training);
    for (const auto& slot : entry.slots) {
      slot.parent->replace_module(slot.key, sync);
      detail::replace_in_container(*slot.parent, ptr, sync);
    }
  }
  return plan.size();
}

template <class ModuleType>
std::size_t convert_sync_batchnorm(torch::nn::ModuleHolder<ModuleType>& module,
                                   const ConvertSyncBatchNormOptions& options = {}) {
  return convert_sync_batchnorm(*module, options);
}

template <class ModuleType>
std::size_t convert_sync_batchnorm(const std::shared_ptr<ModuleType>& module,
                                   const ConvertSyncBatchNormOptions& options = {}) {
  return convert_sync_batchnorm(*module, options);
}

}  // namespace dtrain
