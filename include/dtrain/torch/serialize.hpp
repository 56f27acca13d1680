#pragma once
// libtorch objects through dtrain's object serialization (Note [Object serialization]), which makes
// them checkpoint items and broadcast_object values: torch::Tensor, torch::nn::Module (and its
// holders: ResNet, Linear, ...), torch::optim::Optimizer, torch::Generator, and TorchRngState, the
// state of libtorch's default generators.
//
//   checkpoint.save({.step = step, .epoch = epoch},
//                   {{"model", *model}, {"optimizer", sgd}, {"torch_rng", dtrain::torch_rng_state()}});
//   ...
//   resumed->load("model", *model);                  // in place: the optimizer's references hold
//   resumed->load("optimizer", sgd);
//   dtrain::set_torch_rng_state(resumed->get<dtrain::TorchRngState>("torch_rng"));
//
// Note [libtorch objects in checkpoints]
// A tensor is written as its dtype, its shape and its elements' bytes, copied to the CPU and made
// contiguous; a restore therefore gives bitwise the values that were saved. Reading into a defined
// tensor copies into it, in place and on its own device, and requires the same dtype and shape;
// reading into an undefined one (a fresh element of a std::vector<torch::Tensor>) makes a CPU
// tensor. In place matters for modules: an optimizer holds its parameters by reference, so a
// module is restored by copying into its parameters and buffers, never by replacing them. A module
// is written as its named_parameters() and named_buffers() (recursively, with their dotted names);
// reading checks the names and shapes against the module first and throws, naming the tensor,
// before it changes anything. An optimizer goes through libtorch's own serialization
// (Optimizer::save into an archive, kept as bytes): its per-parameter state (momentum, Adam's
// moments and step counts) and every group's options, mapped to parameters by position in the
// groups, as torch::save does. Generators are written as their get_state() tensor.
#include <torch/torch.h>

#include <cstdint>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dtrain/core/error.hpp"
#include "dtrain/core/serialize.hpp"
#include "dtrain/torch/sharded_optimizers.hpp"

namespace dtrain {
namespace detail {

// A tensor as read from the bytes, before it is put anywhere.
inline torch::Tensor read_cpu_tensor(ObjectReader& r) {
  std::uint8_t defined = 0;
  r.read(defined);
  if (defined == 0) return {};
  std::int16_t type = 0;
  std::vector<std::int64_t> sizes;
  std::vector<char> bytes;
  r.read(type);
  r.read(sizes);
  r.read(bytes);
  if (type < 0 || type >= static_cast<std::int16_t>(c10::ScalarType::NumOptions))
    throw InvalidArgumentError(fmt::format(
        "dtrain: a serialized tensor has dtype code {}, which this libtorch does not know", type));
  auto t = torch::empty(sizes, torch::TensorOptions().dtype(static_cast<c10::ScalarType>(type)));
  if (static_cast<std::size_t>(t.nbytes()) != bytes.size())
    throw InvalidArgumentError(fmt::format(
        "dtrain: a serialized {} tensor of shape [{}] holds {} bytes, not {}",
        std::string(c10::toString(t.scalar_type())), fmt::join(sizes, ", "), bytes.size(), t.nbytes()));
  if (!bytes.empty()) std::memcpy(t.data_ptr(), bytes.data(), bytes.size());
  return t;
}

// Copies `from` (as read) into `to` in place; `what` names the tensor in errors.
inline void copy_into(torch::Tensor& to, const torch::Tensor& from, std::string_view what) {
  if (to.scalar_type() != from.scalar_type() || to.sizes() != from.sizes())
    throw InvalidArgumentError(fmt::format(
        "dtrain: {} is {} [{}] here but {} [{}] in the serialized data: restore into the same "
        "model (architecture, widths, dtype) that was saved",
        what, std::string(c10::toString(to.scalar_type())), fmt::join(to.sizes(), ", "),
        std::string(c10::toString(from.scalar_type())), fmt::join(from.sizes(), ", ")));
  torch::NoGradGuard no_grad;
  to.copy_(from);
}

// Checks that `saved` has exactly the names of `own`, each with its dtype and shape, and throws,
// naming what differs, otherwise.
inline void check_named(const torch::OrderedDict<std::string, torch::Tensor>& own,
                        const std::map<std::string, torch::Tensor>& saved, std::string_view kind) {
  std::vector<std::string> missing, unknown;
  for (const auto& item : own)
    if (saved.find(item.key()) == saved.end()) missing.push_back(item.key());
  for (const auto& [name, t] : saved)
    if (own.find(name) == nullptr) unknown.push_back(name);
  if (!missing.empty() || !unknown.empty())
    throw InvalidArgumentError(fmt::format(
        "dtrain: the module's {}s do not match the serialized module's: missing from the data: "
        "[{}]; in the data but not in the module: [{}]. Restore into the model that was saved",
        kind, fmt::join(missing, ", "), fmt::join(unknown, ", ")));
  for (const auto& item : own) {
    const auto& from = saved.at(item.key());
    if (item.value().scalar_type() != from.scalar_type() || item.value().sizes() != from.sizes()) {
      torch::Tensor target = item.value();
      copy_into(target, from, fmt::format("{} '{}'", kind, item.key()));  // throws, naming it
    }
  }
}

inline void copy_named(const torch::OrderedDict<std::string, torch::Tensor>& own,
                       const std::map<std::string, torch::Tensor>& saved) {
  for (const auto& item : own) {
    torch::Tensor target = item.value();
    copy_into(target, saved.at(item.key()), item.key());
  }
}

}  // namespace detail

// ---- torch::Tensor ------------------------------------------------------------------------------

inline void dtrain_serialize(ObjectWriter& w, const torch::Tensor& t) {
  w.write(static_cast<std::uint8_t>(t.defined()));
  if (!t.defined()) return;
  const auto cpu = t.detach().to(torch::kCPU).contiguous();
  w.write(static_cast<std::int16_t>(cpu.scalar_type()));
  w.write(std::vector<std::int64_t>(cpu.sizes().begin(), cpu.sizes().end()));
  // The layout of a std::vector<char>, written straight from the tensor's memory.
  const auto n = static_cast<std::size_t>(cpu.nbytes());
  w.write(static_cast<std::uint64_t>(n));
  const auto* p = static_cast<const char*>(cpu.data_ptr());
  if (n > 0) w.bytes().insert(w.bytes().end(), p, p + n);
}

inline void dtrain_deserialize(ObjectReader& r, torch::Tensor& t) {
  auto read = detail::read_cpu_tensor(r);
  if (!t.defined() || !read.defined()) {
    t = std::move(read);
    return;
  }
  detail::copy_into(t, read, "the tensor");
}

// ---- torch::nn::Module ---------------------------------------------------------------------------

namespace detail {

inline void write_named(ObjectWriter& w, const torch::OrderedDict<std::string, torch::Tensor>& dict) {
  w.write(static_cast<std::uint64_t>(dict.size()));
  for (const auto& item : dict) {
    w.write(item.key());
    dtrain_serialize(w, item.value());
  }
}

inline std::map<std::string, torch::Tensor> read_named(ObjectReader& r, std::string_view kind) {
  std::uint64_t n = 0;
  r.read(n);
  std::map<std::string, torch::Tensor> out;
  for (std::uint64_t i = 0; i < n; ++i) {
    std::string name;
    r.read(name);
    auto t = read_cpu_tensor(r);
    if (!out.emplace(name, std::move(t)).second)
      throw InvalidArgumentError(
          fmt::format("dtrain: the serialized module names {} '{}' twice", kind, name));
  }
  return out;
}

}  // namespace detail

// Parameters and buffers (batch-norm statistics), with their names (Note [libtorch objects in
// checkpoints]). A module derived from torch::nn::Module finds these through its base class.
inline void dtrain_serialize(ObjectWriter& w, const torch::nn::Module& m) {
  detail::write_named(w, m.named_parameters(/*recurse=*/true));
  detail::write_named(w, m.named_buffers(/*recurse=*/true));
}

inline void dtrain_deserialize(ObjectReader& r, torch::nn::Module& m) {
  auto parameters = detail::read_named(r, "parameter");
  auto buffers = detail::read_named(r, "buffer");
  const auto own_parameters = m.named_parameters(true);
  const auto own_buffers = m.named_buffers(true);
  // Both checked before either is copied: a failed restore leaves the module as it was.
  detail::check_named(own_parameters, parameters, "parameter");
  detail::check_named(own_buffers, buffers, "buffer");
  detail::copy_named(own_parameters, parameters);
  detail::copy_named(own_buffers, buffers);
}

// A module holder (torch::nn::Linear, TORCH_MODULE(ResNet), ...): its module.
template <class M>
void dtrain_serialize(ObjectWriter& w, const torch::nn::ModuleHolder<M>& holder) {
  dtrain_serialize(w, static_cast<const torch::nn::Module&>(*holder));
}

template <class M>
void dtrain_deserialize(ObjectReader& r, torch::nn::ModuleHolder<M>& holder) {
  dtrain_deserialize(r, static_cast<torch::nn::Module&>(*holder));
}

// ---- torch::optim::Optimizer ---------------------------------------------------------------------

namespace detail {

inline std::string optimizer_state_bytes(const torch::optim::Optimizer& optimizer) {
  torch::serialize::OutputArchive archive;
  optimizer.save(archive);
  std::ostringstream os;
  archive.save_to(os);
  return std::move(os).str();
}

inline void load_optimizer_state(torch::optim::Optimizer& optimizer, const std::string& bytes) {
  try {
    torch::serialize::InputArchive archive;
    std::istringstream is(bytes);
    archive.load_from(is);
    optimizer.load(archive);
  } catch (const c10::Error& e) {
    throw InvalidArgumentError(fmt::format(
        "dtrain: the serialized optimizer state does not fit this optimizer (the same optimizer "
        "class over the same parameter groups is needed): {}",
        e.what_without_backtrace()));
  }
}

}  // namespace detail

// Per-parameter state and every group's options (Note [libtorch objects in checkpoints]). SGD,
// Adam, AdamW, ... find these through their base class.
inline void dtrain_serialize(ObjectWriter& w, const torch::optim::Optimizer& optimizer) {
  detail::refuse_if_sharded(optimizer, "saving the state");
  w.write(detail::optimizer_state_bytes(optimizer));
}

inline void dtrain_deserialize(ObjectReader& r, torch::optim::Optimizer& optimizer) {
  detail::refuse_if_sharded(optimizer, "loading saved state");
  std::string bytes;
  r.read(bytes);
  detail::load_optimizer_state(optimizer, bytes);
}

// ---- generators ----------------------------------------------------------------------------------

// A generator's state (its seed and position in its stream); restored into a defined generator of
// the same kind.
inline void dtrain_serialize(ObjectWriter& w, const torch::Generator& generator) {
  if (!generator.defined())
    throw InvalidArgumentError("dtrain: an undefined torch::Generator cannot be serialized");
  torch::Generator shared = generator;  // the same generator; its mutex() is not const
  std::lock_guard<std::mutex> lock(shared.mutex());
  dtrain_serialize(w, shared.get_state());
}

inline void dtrain_deserialize(ObjectReader& r, torch::Generator& generator) {
  const auto state = detail::read_cpu_tensor(r);
  if (!generator.defined())
    throw InvalidArgumentError(
        "dtrain: restoring into an undefined torch::Generator: create the generator first "
        "(at::detail::createCPUGenerator, say), then load its state");
  try {
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(state);
  } catch (const c10::Error& e) {
    throw InvalidArgumentError(fmt::format(
        "dtrain: the serialized generator state does not fit this {} generator: {}",
        generator.device().str(), e.what_without_backtrace()));
  }
}

// The state of libtorch's default generators, which torch::manual_seed seeds and which dropout,
// torch::rand and the initializers draw from: the CPU generator and one per CUDA device.
struct TorchRngState {
  torch::Tensor cpu;
  std::vector<torch::Tensor> cuda;  // by device index

  friend void dtrain_serialize(ObjectWriter& w, const TorchRngState& s) {
    dtrain_serialize(w, s.cpu);
    w.write(static_cast<std::uint64_t>(s.cuda.size()));
    for (const auto& t : s.cuda) dtrain_serialize(w, t);
  }
  friend void dtrain_deserialize(ObjectReader& r, TorchRngState& s) {
    s.cpu = detail::read_cpu_tensor(r);
    std::uint64_t n = 0;
    r.read(n);
    s.cuda.clear();
    for (std::uint64_t i = 0; i < n; ++i) s.cuda.push_back(detail::read_cpu_tensor(r));
  }
};

inline TorchRngState torch_rng_state() {
  TorchRngState s;
  auto cpu = at::detail::getDefaultCPUGenerator();
  {
    std::lock_guard<std::mutex> lock(cpu.mutex());
    s.cpu = cpu.get_state();
  }
  const auto devices = static_cast<int>(torch::cuda::device_count());
  for (int d = 0; d < devices; ++d) {
    auto g = at::globalContext().defaultGenerator(torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(d)));
    std::lock_guard<std::mutex> lock(g.mutex());
    s.cuda.push_back(g.get_state());
  }
  return s;
}

inline void set_torch_rng_state(const TorchRngState& s) {
  const auto devices = static_cast<std::size_t>(torch::cuda::device_count());
  if (!s.cpu.defined() || s.cuda.size() != devices)
    throw InvalidArgumentError(fmt::format(
        "dtrain: set_torch_rng_state: the state holds {} and {} CUDA generator(s), and this "
        "process has 1 CPU and {} CUDA device(s): restore it where it was saved (the same "
        "visible devices per process)",
        s.cpu.defined() ? "the CPU generator" : "no CPU generator", s.cuda.size(), devices));
  auto cpu = at::detail::getDefaultCPUGenerator();
  {
    std::lock_guard<std::mutex> lock(cpu.mutex());
    cpu.set_state(s.cpu);
  }
  for (std::size_t d = 0; d < devices; ++d) {
    auto g = at::globalContext().defaultGenerator(torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(d)));
    std::lock_guard<std::mutex> lock(g.mutex());
    g.set_state(s.cuda[d]);
  }
}

}  // namespace dtrain
