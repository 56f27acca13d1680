#pragma once
// OptimizerState: an optimizer's whole state as DistributedOptimizer::gather_state() returns it
// (Note [Sharded state in checkpoints] in torch/optimizer_shards.hpp), and the libtorch archive
// helpers that make and read it.
#include <torch/torch.h>

#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <fmt/format.h>

namespace dtrain {

// An optimizer's whole state as DistributedOptimizer::gather_state() returns it: a value to save
// as a shared checkpoint (or elastic commit) item, and to hand to load_state() on any world size.
struct OptimizerState {
  bool sharded = false;
  std::string whole;                               // unsharded: libtorch's Optimizer::save bytes
  std::string layout;                              // sharded: the parameters, one line each
  std::vector<std::string> groups;                 // sharded: each group's options (lr, ...)
  std::vector<std::string> flats;                  // sharded: per flat buffer, its state's archive
  std::vector<std::vector<std::string>> gathered;  // ... and which of its fields span the buffer

  template <class Self>
  static auto tie_fields(Self& s) {
    return std::tie(s.sharded, s.whole, s.layout, s.groups, s.flats, s.gathered);
  }
};

}  // namespace dtrain

namespace dtrain::detail {

// A parameter state's fields as the optimizer writes them (tensors and numbers by name).
inline std::vector<std::pair<std::string, c10::IValue>> archive_entries(
    const torch::optim::OptimizerParamState& state) {
  torch::serialize::OutputArchive out;
  state.serialize(out);
  std::stringstream bytes;
  out.save_to(bytes);
  torch::serialize::InputArchive in;
  in.load_from(bytes);
  std::vector<std::pair<std::string, c10::IValue>> entries;
  for (const auto& key : in.keys()) {
    c10::IValue value;
    in.read(key, value);
    entries.emplace_back(key, std::move(value));
  }
  return entries;
}

static std::string options_bytes(const torch::optim::OptimizerParamGroup& group) {
  torch::serialize::OutputArchive out;
  group.options().serialize(out);
  std::ostringstream os;
  out.save_to(os);
  return std::move(os).str();
}

// The line of `s` that holds character `at`: a parameter of a layout description.
inline std::string line_at(const std::string& s, std::size_t at) {
  auto begin = at == 0 ? std::string::npos : s.rfind('\n', at - 1);
  begin = begin == std::string::npos ? 0 : begin + 1;
  auto end = s.find('\n', begin);
  return begin >= s.size() ? std::string("(no more parameters)") : s.substr(begin, end - begin);
}

inline std::string first_difference(const std::string& a, const std::string& b) {
  std::size_t at = 0;
  while (at < a.size() && at < b.size() && a[at] == b[at]) ++at;
  return fmt::format("\"{}\" where the other has \"{}\"", line_at(a, at), line_at(b, at));
}

}  // namespace dtrain::detail
