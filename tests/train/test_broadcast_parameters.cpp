// broadcast_parameters: ranges of tensors and (name, tensor) pairs in rank-dependent orders end up
// bitwise equal to root's; parameter lists that differ across ranks fail on every rank, naming the
// first differing parameter, before any data moves; bad names fail on every rank.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "dtrain/dtrain.hpp"
#include "train/train_test_util.hpp"

namespace {

using namespace train_test;
using dtrain::InvalidArgumentError;
using dtrain::MismatchError;

// Rank r's value for element i of the parameter with index or name hash `p`: distinct on every
// rank, with non-trivial low bits so a bitwise comparison means something.
template <class T>
T value(int r, std::size_t p, std::size_t i) {
  return static_cast<T>(1.0 / 3.0 + r * 1000.0 + static_cast<double>(p) * 10.0 + i * 0.1);
}

template <class T>
std::vector<T> filled(int r, std::size_t p, std::size_t n) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = value<T>(r, p, i);
  return v;
}

std::size_t key(const std::string& name) { return std::hash<std::string>{}(name) % 97; }

// A small model as name -> weights, built for rank r (so each rank starts from its own values).
const std::vector<std::pair<std::string, std::size_t>> kLayers = {
    {"conv1.weight", 27}, {"conv1.bias", 3}, {"fc.weight", 12}, {"fc.bias", 4}, {"norm.scale", 1}};

std::map<std::string, std::vector<float>> model_for(int r) {
  std::map<std::string, std::vector<float>> m;
  for (const auto& [name, n] : kLayers) m[name] = filled<float>(r, key(name), n);
  return m;
}

// (name, view) pairs over `model` in an order that depends on the rank: rotated by rank, and
// reversed on odd ranks.
std::vector<std::pair<std::string, std::span<float>>> named_views(
    std::map<std::string, std::vector<float>>& model) {
  std::vector<std::pair<std::string, std::span<float>>> v;
  for (auto& [name, w] : model) v.emplace_back(name, std::span<float>(w));
  std::rotate(v.begin(), v.begin() + world_rank() % static_cast<int>(v.size()), v.end());
  if (world_rank() % 2 == 1) std::reverse(v.begin(), v.end());
  return v;
}

bool bitwise_equal(const std::map<std::string, std::vector<float>>& a,
                   const std::map<std::string, std::vector<float>>& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [name, w] : a) {
    auto it = b.find(name);
    if (it == b.end() || it->second.size() != w.size() ||
        std::memcmp(w.data(), it->second.data(), w.size() * sizeof(float)) != 0)
      return false;
  }
  return true;
}

}  // namespace

TEST_CASE("a range of tensors becomes root's, bitwise, from every root") {
  dtrain::init();
  const int me = world_rank();
  for (int root = 0; root < world_size(); ++root) {
    CAPTURE(root);
    std::vector<std::vector<double>> params{filled<double>(me, 0, 5), filled<double>(me, 1, 1),
                                            filled<double>(me, 2, 300)};
    const std::vector<std::vector<double>> want{
        filled<double>(root, 0, 5), filled<double>(root, 1, 1), filled<double>(root, 2, 300)};
    dtrain::broadcast_parameters(params, root);
    for (std::size_t p = 0; p < params.size(); ++p)
      CHECK(std::memcmp(params[p].data(), want[p].data(), want[p].size() * sizeof(double)) == 0);
  }
}

TEST_CASE("a range of views with mixed dtypes and shapes becomes root's, bitwise") {
  dtrain::init();
  const int me = world_rank();
  const int root = world_size() - 1;
  auto w = filled<float>(me, 0, 6);
  auto steps = filled<std::int64_t>(me, 1, 1);
  auto table = filled<double>(me, 2, 8);
  auto mask = filled<std::uint8_t>(me, 3, 3);
  using dtrain::DataType;
  using dtrain::Device;
  std::vector<dtrain::TensorView> views{
      dtrain::TensorView(w.data(), 6, DataType::float32, Device::cpu(), {2, 3}),
      dtrain::TensorView(steps.data(), 1, DataType::int64, Device::cpu(), {1}),
      dtrain::TensorView(table.data(), 8, DataType::float64, Device::cpu(), {2, 2, 2}),
      dtrain::TensorView(mask.data(), 3, DataType::uint8, Device::cpu(), {3})};
  dtrain::broadcast_parameters(views, root);
  CHECK(w == filled<float>(root, 0, 6));
  CHECK(steps == filled<std::int64_t>(root, 1, 1));
  CHECK(std::memcmp(table.data(), filled<double>(root, 2, 8).data(), 8 * sizeof(double)) == 0);
  CHECK(mask == filled<std::uint8_t>(root, 3, 3));
  CHECK(same_on_all_ranks(table.data(), table.size() * sizeof(double)));
}

TEST_CASE("(name, tensor) pairs in a rank-dependent order are matched by name") {
  dtrain::init();
  const int me = world_rank();
  for (int root = 0; root < world_size(); ++root) {
    CAPTURE(root);
    {  // a vector of (name, span) pairs viewing the model's storage
      auto model = model_for(me);
      auto views = named_views(model);
      dtrain::broadcast_parameters(views, root);
      CHECK(bitwise_equal(model, model_for(root)));
    }
    {  // the map itself (its value_type is a pair)
      auto model = model_for(me);
      dtrain::broadcast_parameters(model, root);
      CHECK(bitwise_equal(model, model_for(root)));
    }
    {  // an unordered_map filled in a rank-dependent order
      std::unordered_map<std::string, std::vector<float>> model;
      for (std::size_t i = 0; i < kLayers.size(); ++i) {
        const auto& [name, n] = kLayers[(i + me) % kLayers.size()];
        model[name] = filled<float>(me, key(name), n);
      }
      dtrain::broadcast_parameters(model, root);
      for (const auto& [name, n] : kLayers)
        CHECK_MESSAGE(model[name] == filled<float>(root, key(name), n), name);
    }
  }
}

TEST_CASE("an empty parameter list is fine") {
  dtrain::init();
  std::vector<std::vector<float>> none;
  CHECK_NOTHROW(dtrain::broadcast_parameters(none, 0));
  std::map<std::string, std::vector<float>> no_names;
  CHECK_NOTHROW(dtrain::broadcast_parameters(no_names, 0));
}

// The three ways lists can differ, each on one rank only; every rank must throw MismatchError
// naming the first differing parameter, and no tensor may have changed.
TEST_CASE("parameter lists that differ across ranks are MismatchError on every rank") {
  dtrain::init();
  const int n = world_size();
  if (n < 2) return;  // nothing can differ in a world of one
  const int me = world_rank();
  const int odd = n - 1;  // the rank whose list differs
  for (int root : {0, n - 1}) {
    if (root == odd) continue;  // keep the odd one out off root, so "root has" is the model
    CAPTURE(root);

    {  // a missing parameter: in sorted order "norm.scale" is the last one
      auto model = model_for(me);
      if (me == odd) model.erase("norm.scale");
      const auto before = model;
      CHECK_THROWS_WITH_AS(dtrain::broadcast_parameters(model, root),
                           doctest::Contains("'norm.scale'"), MismatchError);
      CHECK(bitwise_equal(model, before));
    }
    {  // a renamed parameter: the first in sorted order that differs is "fc.bias" vs "fc.bias2"
      auto model = model_for(me);
      if (me == odd) {
        model["fc.bias2"] = model["fc.bias"];
        model.erase("fc.bias");
      }
      const auto expected = fmt::format(
          "parameter #2 differs: rank {} has 'fc.bias2' float32 [4], root rank {} has 'fc.bias' "
          "float32 [4]", odd, root);
      CHECK_THROWS_WITH_AS(dtrain::broadcast_parameters(model, root),
                           doctest::Contains(expected.c_str()), MismatchError);
    }
    {  // a different shape
      auto model = model_for(me);
      if (me == odd) model["fc.weight"].push_back(1.0f);
      const auto before = model;
      CHECK_THROWS_WITH_AS(dtrain::broadcast_parameters(model, root),
                           doctest::Contains("'fc.weight' float32"), MismatchError);
      CHECK(bitwise_equal(model, before));
    }
    {  // ranges without names: one tensor fewer, named by its position
      std::vector<std::vector<double>> params{filled<double>(me, 0, 4), filled<double>(me, 1, 4),
                                              filled<double>(me, 2, 4)};
      if (me == odd) params.pop_back();
      CHECK_THROWS_WITH_AS(dtrain::broadcast_parameters(params, root),
                           doctest::Contains("parameter #2"), MismatchError);
      CHECK(params[0] == filled<double>(me, 0, 4));
    }
    {  // ranges without names: a different dtype at position 1
      auto a = filled<float>(me, 0, 4);
      auto b = filled<float>(me, 1, 4);
      std::vector<double> b64(4);
      std::vector<dtrain::TensorView> views{
          dtrain::TensorView(a.data(), 4, dtrain::DataType::float32, dtrain::Device::cpu(), {4}),
          me == odd ? dtrain::TensorView(b64.data(), 4, dtrain::DataType::float64,
                                         dtrain::Device::cpu(), {4})
                    : dtrain::TensorView(b.data(), 4, dtrain::DataType::float32,
                                         dtrain::Device::cpu(), {4})};
      CHECK_THROWS_WITH_AS(dtrain::broadcast_parameters(views, root),
                           doctest::Contains("parameter #1"), MismatchError);
    }
  }
  // The world is still usable afterwards.
  auto model = model_for(me);
  dtrain::broadcast_parameters(model, 0);
  CHECK(bitwise_equal(model, model_for(0)));
}

TEST_CASE("duplicate or empty names are InvalidArgumentError on every rank") {
  dtrain::init();
  const int me = world_rank();
  const int odd = world_size() - 1;
  std::vector<float> a(3, 1.0f), b(3, 2.0f);
  using Pairs = std::vector<std::pair<std::string, std::span<float>>>;
  {  // on every rank
    Pairs dup{{"w", a}, {"w", b}};
    CHECK_THROWS_WITH_AS(dtrain::broadcast_parameters(dup, 0),
                         doctest::Contains("'w' appears twice"), InvalidArgumentError);
    Pairs empty{{"w", a}, {"", b}};
    CHECK_THROWS_WITH_AS(dtrain::broadcast_parameters(empty, 0),
                         doctest::Contains("empty name"), InvalidArgumentError);
  }
  {  // on one rank only: the others must not wait for it in the broadcast
    const auto dup_message = fmt::format("on rank {}: parameter name 'w' appears twice", odd);
    Pairs dup = me == odd ? Pairs{{"w", a}, {"w", b}} : Pairs{{"w", a}, {"v", b}};
    CHECK_THROWS_WITH_AS(dtrain::broadcast_parameters(dup, 0),
                         doctest::Contains(dup_message.c_str()), InvalidArgumentError);
    const auto empty_message = fmt::format("on rank {}: a parameter has an empty name", odd);
    Pairs empty = me == odd ? Pairs{{"w", a}, {"", b}} : Pairs{{"w", a}, {"v", b}};
    CHECK_THROWS_WITH_AS(dtrain::broadcast_parameters(empty, 0),
                         doctest::Contains(empty_message.c_str()), InvalidArgumentError);
  }
  CHECK(a == std::vector<float>(3, 1.0f));
}

TEST_CASE("a root outside the world is InvalidArgumentError") {
  dtrain::init();
  std::vector<std::vector<float>> params{std::vector<float>(2, 1.0f)};
  CHECK_THROWS_AS(dtrain::broadcast_parameters(params, world_size()), InvalidArgumentError);
  CHECK_THROWS_AS(dtrain::broadcast_parameters(params, -1), InvalidArgumentError);
}
