// broadcast_object / allgather_object (Note [Object serialization]): every supported kind of value,
// nested containers and a user type with dtrain_serialize/dtrain_deserialize hooks, from every
// root, with rank-dependent sizes so the byte counts differ across ranks.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "dtrain/dtrain.hpp"
#include "train/train_test_util.hpp"

namespace user {

// Not trivially copyable (it owns strings and a vector): serializable only through its hooks.
struct Checkpoint {
  std::string model_name;
  std::int64_t epoch = 0;
  std::vector<double> losses;
  std::map<std::string, std::string> tags;
  friend bool operator==(const Checkpoint&, const Checkpoint&) = default;
};

inline void dtrain_serialize(dtrain::ObjectWriter& w, const Checkpoint& c) {
  w.write(c.model_name);
  w.write(c.epoch);
  w.write(c.losses);
  w.write(c.tags);
}
inline void dtrain_deserialize(dtrain::ObjectReader& r, Checkpoint& c) {
  r.read(c.model_name);
  r.read(c.epoch);
  r.read(c.losses);
  r.read(c.tags);
}

}  // namespace user

namespace {

using namespace train_test;

struct Pod {
  std::int32_t a;
  double b;
  char c[3];
  friend bool operator==(const Pod&, const Pod&) = default;
};

// Rank r's values: sizes grow with r (rank 0's containers are empty).
std::string text(int r) { return std::string(static_cast<std::size_t>(r) * 5, static_cast<char>('a' + r)); }
std::vector<std::int64_t> ints(int r) {
  std::vector<std::int64_t> v;
  for (int i = 0; i < r * 3; ++i) v.push_back(static_cast<std::int64_t>(r) * 1'000'000'000'000 + i);
  return v;
}
std::vector<std::string> words(int r) {
  std::vector<std::string> v;
  for (int i = 0; i <= r; ++i) v.push_back(text(i) + "|" + std::to_string(r));
  return v;
}
std::map<std::string, std::vector<double>> table(int r) {
  std::map<std::string, std::vector<double>> m;
  for (int i = 0; i < r + 1; ++i) m["key" + std::to_string(i)] = std::vector<double>(i, r + 0.25);
  return m;
}
using Nested = std::map<int, std::vector<std::pair<std::string, std::optional<std::vector<float>>>>>;
Nested nested(int r) {
  Nested m;
  for (int i = 0; i < r + 2; ++i) {
    auto& v = m[i * 7 - r];
    v.emplace_back(text(r), std::nullopt);
    v.emplace_back("", std::vector<float>(static_cast<std::size_t>(i), 1.5f * r));
  }
  return m;
}
std::unordered_map<std::string, std::int32_t> counts(int r) {
  std::unordered_map<std::string, std::int32_t> m;
  for (int i = 0; i < r + 1; ++i) m[text(i) + "#"] = r * 10 + i;
  return m;
}
user::Checkpoint checkpoint(int r) {
  user::Checkpoint c;
  c.model_name = "resnet" + std::to_string(18 + r);
  c.epoch = 100 + r;
  c.losses = std::vector<double>(static_cast<std::size_t>(r) + 1, 0.5 / (r + 1));
  c.tags["rank"] = std::to_string(r);
  if (r % 2) c.tags["odd"] = "yes";
  return c;
}
Pod pod(int r) { return Pod{r * 3 - 1, r / 7.0, {'x', static_cast<char>('0' + r), '\0'}}; }

// Checks broadcast_object and allgather_object of make(r) for one kind of value.
template <class F>
void check_kind(F make, const char* what) {
  CAPTURE(what);
  const int me = world_rank();
  for (int root = 0; root < world_size(); ++root) {
    CAPTURE(root);
    CHECK(dtrain::broadcast_object(make(me), root) == make(root));
  }
  const auto all = dtrain::allgather_object(make(me));
  CHECK(all.size() == static_cast<std::size_t>(world_size()));
  for (int r = 0; r < world_size() && r < static_cast<int>(all.size()); ++r) {
    CAPTURE(r);
    CHECK(all[r] == make(r));
  }
}

}  // namespace

TEST_CASE("broadcast_object and allgather_object carry every supported kind of value") {
  dtrain::init();
  check_kind([](int r) { return static_cast<std::int64_t>(r) * -3'000'000'000; }, "int64");
  check_kind([](int r) { return 0.1 * r - 7.0; }, "double");
  check_kind([](int r) { return r % 2 == 1; }, "bool");
  check_kind(pod, "trivially copyable struct");
  check_kind(text, "string (empty on rank 0)");
  check_kind(ints, "vector<int64> (empty on rank 0)");
  check_kind(words, "vector<string>");
  check_kind([](int r) { return std::vector<bool>(static_cast<std::size_t>(r) + 3, r % 2 == 0); },
             "vector<bool>");
  check_kind(table, "map<string, vector<double>>");
  check_kind(counts, "unordered_map<string, int32>");
  check_kind([](int r) { return std::pair<std::string, Pod>(text(r), pod(r)); }, "pair");
  check_kind([](int r) { return r % 2 ? std::optional<std::string>(text(r)) : std::nullopt; },
             "optional<string>");
  check_kind(nested, "map<int, vector<pair<string, optional<vector<float>>>>>");
  check_kind(checkpoint, "user type with dtrain_serialize/dtrain_deserialize");
  check_kind([](int r) { return std::vector<user::Checkpoint>{checkpoint(r), checkpoint(r + 1)}; },
             "vector of user type");
}

TEST_CASE("named and unnamed object ops interleave without mixing up") {
  dtrain::init();
  const int me = world_rank();
  const int last = world_size() - 1;
  const auto a = dtrain::broadcast_object(text(me), last, "config.a");
  const auto b = dtrain::broadcast_object(words(me), 0);
  const auto c = dtrain::allgather_object(me * me, "ranks.squared");
  CHECK(a == text(last));
  CHECK(b == words(0));
  for (int r = 0; r < static_cast<int>(c.size()); ++r) CHECK(c[r] == r * r);
}

TEST_CASE("serialization round-trips and rejects data of another type") {
  const auto bytes = dtrain::serialize_object(checkpoint(3));
  CHECK(dtrain::deserialize_object<user::Checkpoint>(bytes.data(), bytes.size()) == checkpoint(3));
  // Too few bytes and too many bytes are both errors, never garbage values.
  CHECK_THROWS_AS(dtrain::deserialize_object<user::Checkpoint>(bytes.data(), bytes.size() - 1),
                  dtrain::InvalidArgumentError);
  const auto small = dtrain::serialize_object(std::int32_t{7});
  CHECK_THROWS_AS(dtrain::deserialize_object<std::int16_t>(small.data(), small.size()),
                  dtrain::InvalidArgumentError);
  // A string whose length prefix claims more than there is.
  auto s = dtrain::serialize_object(std::string("hello"));
  s.resize(s.size() - 2);
  CHECK_THROWS_AS(dtrain::deserialize_object<std::string>(s.data(), s.size()),
                  dtrain::InvalidArgumentError);
}
