// The fault matrix within one job: every mismatch and every argument error, on any subset of
// ranks, becomes an exception on every rank; nothing waits for ever. Runs at 2, 3 and 4 ranks; the
// odd rank out is always the last one, so the coordinator (rank 0) is sometimes the odd one (2
// ranks) and sometimes not. Faults that end processes are in run_faults.py.
#include <sched.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <thread>
#include <typeinfo>
#include <vector>

#include "engine/engine_test.hpp"
#include "reliability/expected_errors.hpp"

// A tensor type whose traits refuse it, as an adapter does for an element type dtrain has no
// data type for: the refusal happens in the op's checks (Note [Compiled submission]).
struct RefusedTensor {
  std::vector<float> values = std::vector<float>(6, 1.0f);
};

template <>
struct dtrain::tensor_traits<RefusedTensor> {
  using output_type = std::vector<float>;
  static const void* data(const RefusedTensor& t) { return t.values.data(); }
  static void* mutable_data(RefusedTensor& t) { return t.values.data(); }
  static std::int64_t numel(const RefusedTensor& t) {
    return static_cast<std::int64_t>(t.values.size());
  }
  static DataType dtype(const RefusedTensor&) {
    throw InvalidArgumentError("complex64 has no dtrain data type");
  }
  static Device device(const RefusedTensor&) { return Device::cpu(); }
  static output_type make_output(const RefusedTensor&, const Shape& s) {
    return output_type(static_cast<std::size_t>(detail::numel(s)));
  }
  static void* output_data(output_type& o) { return o.data(); }
};

namespace {

using namespace dtrain;
using namespace std::chrono_literals;
using test::expect;
using test::Initialized;
using test::is_odd_one;
using test::last_rank;
using test::world_rank;
using test::world_size;

// The world still works: an unnamed allreduce pairs up on every rank (generated names in step).
void check_still_works() {
  std::vector<std::int64_t> v{1};
  allreduce(v, {.op = ReduceOp::Sum});
  CHECK(v[0] == world_size());
}

Config quick_config() {
  Config c = Config::from_env();
  c.stall_check_time_seconds = 1;
  return c;
}

}  // namespace

TEST_CASE("a mismatch on one rank fails the op on every rank, naming the field and the ranks") {
  Initialized dt(quick_config());
  const std::string odd = fmt::format("on ranks [{}]", last_rank());
  std::vector<float> f(6, 1.0f);
  std::vector<double> d(6, 1.0);
  std::vector<float> f7(7, 1.0f);
  expect<MismatchError>([&] { is_odd_one() ? allreduce(d, {.name = "m.dtype"}) : allreduce(f, {.name = "m.dtype"}); },
                        {"dtype", "'m.dtype'", "float64 " + odd}, "dtype");
  expect<MismatchError>([&] { is_odd_one() ? allreduce(f7, {.name = "m.shape"}) : allreduce(f, {.name = "m.shape"}); },
                        {"shape", "[7] " + odd}, "shape");
  expect<MismatchError>(
      [&] { allreduce(f, {.op = is_odd_one() ? ReduceOp::Max : ReduceOp::Sum, .name = "m.op"}); },
      {"reduce op", "Max " + odd}, "reduce op");
  expect<MismatchError>(
      [&] { allreduce(f, {.prescale = is_odd_one() ? 0.5 : 1.0, .name = "m.prescale"}); },
      {"prescale factor", "0.5 " + odd}, "prescale");
  expect<MismatchError>([&] { broadcast(f, is_odd_one() ? 1 : 0, "m.root"); },
                        {"root rank", "1 " + odd}, "root");
  expect<MismatchError>(
      [&] {
        if (is_odd_one()) (void)allgather(f, "m.kind");
        else allreduce(f, {.name = "m.kind"});
      },
      {"op kind", "allgather " + odd}, "op kind");
  check_still_works();
}

TEST_CASE("an argument error on one rank fails the op on every rank at once") {
  Initialized dt(quick_config());
  const int odd = last_rank();
  const std::string rejected = fmt::format("rejected on rank {}", odd);
  float storage[6] = {};
  std::vector<float> good(6, 1.0f);
  TensorView null_data(nullptr, 6, DataType::float32);
  std::vector<std::int32_t> ints(6, 1);
  std::vector<float> rows(static_cast<std::size_t>(world_size()), 1.0f);
  struct Case {
    const char* what;
    std::function<void()> bad;   // the odd rank's call
    std::function<void()> fine;  // everyone else's
    const char* local;           // the odd rank's own message
  };
  const std::vector<Case> cases = {
      {"null data", [&] { allreduce(null_data); }, [&] { allreduce(good); }, "null"},
      {"shape and count disagree",
       [&] { TensorView v(storage, 5, DataType::float32, Device::cpu(), {3, 2}); allreduce(v); },
       [&] { allreduce(good); }, "[3, 2] has 6 elements"},
      {"NaN prescale", [&] { allreduce(good, {.prescale = std::nan("")}); },
       [&] { allreduce(good); }, "prescale factor is nan"},
      {"infinite postscale",
       [&] { allreduce(good, {.postscale = std::numeric_limits<double>::infinity()}); },
       [&] { allreduce(good); }, "postscale factor is inf"},
      {"Average of integers", [&] { allreduce(ints); }, [&] { allreduce(ints, {.op = ReduceOp::Sum}); },
       "integer tensor"},
      {"broadcast root out of range", [&] { broadcast(good, world_size()); },
       [&] { broadcast(good, 0); }, "out of range"},
      {"allreduce of a tensor its traits refuse", [&] { RefusedTensor t; allreduce(t); },
       [&] { allreduce(good); }, "complex64 has no dtrain data type"},
      {"allgather of a tensor its traits refuse", [&] { (void)allgather(RefusedTensor{}); },
       [&] { (void)allgather(good); }, "complex64 has no dtrain data type"},
      {"alltoall with too many splits",
       [&] { std::vector<int> s(static_cast<std::size_t>(world_size()) + 1, 0); s[0] = world_size(); (void)alltoall(rows, s); },
       [&] { (void)alltoall(rows, std::vector<int>(static_cast<std::size_t>(world_size()), 1)); },
       "splits given"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.what);
    const auto start = std::chrono::steady_clock::now();
    if (is_odd_one()) {
      expect<InvalidArgumentError>(c.bad, {c.local}, c.what);
    } else {
      expect<InvalidArgumentError>(c.fine, {rejected, c.local}, c.what);
    }
    // Nobody waited for a stall check or a timeout.
    CHECK(std::chrono::steady_clock::now() - start < 30s);
    check_still_works();
  }
}

TEST_CASE("grouped_allreduce with a different number of tensors on one rank fails everywhere") {
  Initialized dt(quick_config());
  for (std::size_t odd_count : {std::size_t{2}, std::size_t{0}, std::size_t{5}}) {
    CAPTURE(odd_count);
    std::vector<std::vector<float>> tensors(is_odd_one() ? odd_count : 3, std::vector<float>(4, 1.0f));
    expect<MismatchError>([&] { grouped_allreduce(tensors, {.op = ReduceOp::Sum}); },
                          {"number of tensors in grouped_allreduce",
                           fmt::format("{} on ranks [{}]", odd_count, last_rank())},
                          "group size");
    check_still_works();
  }
  // Empty groups everywhere are fine.
  std::vector<std::vector<float>> none;
  CHECK_NOTHROW(grouped_allreduce(none));
  check_still_works();
}

TEST_CASE("an op a rank submits too late times out on every rank, naming the rank") {
  Config c = quick_config();
  c.op_timeout_seconds = 2;
  Initialized dt(c);
  std::vector<float> v(3, 1.0f);
  if (is_odd_one()) std::this_thread::sleep_for(3s);
  expect<TimeoutError>([&] { allreduce(v, {.name = "late"}); },
                       {"allreduce 'late' timed out after 2 s", "DTRAIN_OP_TIMEOUT_SECONDS",
                        fmt::format("ranks [{}] never submitted it", last_rank())},
                       "negotiation timeout");
  MPI_Barrier(MPI_COMM_WORLD);  // the late rank has caught up
  check_still_works();  // only the op failed, not the engine
}

TEST_CASE("a rank that never submits: the stall inspector names it and stall shutdown ends the wait") {
  Config c = quick_config();
  c.op_timeout_seconds = 0;
  c.stall_shutdown_time_seconds = 2;
  c.stall_check_disable = true;  // stall shutdown holds without the warnings
  Initialized dt(c);
  std::vector<float> v(3, 1.0f);
  if (!is_odd_one()) {
    expect<ShutdownError>([&] { allreduce(v, {.name = "never"}); },
                          {"stall shutdown", "allreduce 'never'",
                           fmt::format("missing on ranks [{}]", last_rank())},
                          "stall shutdown");
  } else {
    std::this_thread::sleep_for(4s);
    // The engine stopped everywhere; this rank learns why at its next call.
    expect<ShutdownError>([&] { allreduce(v, {.name = "after"}); }, {"stall shutdown"}, "after");
  }
}

TEST_CASE("join with every reduce op: joined ranks contribute the op's identity") {
  Initialized dt;
  const int rank = world_rank(), size = world_size();
  // Rank r runs r + 1 steps; at step s ranks s..size-1 contribute the value (r + 2).
  for (int s = 0; s <= rank; ++s) {
    CAPTURE(s);
    std::vector<double> expected_contribs;
    for (int k = s; k < size; ++k) expected_contribs.push_back(k + 2.0);
    auto fold = [&](ReduceOp op) {
      double acc = op == ReduceOp::Product ? 1 : op == ReduceOp::Min ? 1e9 : op == ReduceOp::Max ? -1e9 : 0;
      for (double x : expected_contribs) {
        if (op == ReduceOp::Sum || op == ReduceOp::Average) acc += x;
        if (op == ReduceOp::Product) acc *= x;
        if (op == ReduceOp::Min) acc = std::min(acc, x);
        if (op == ReduceOp::Max) acc = std::max(acc, x);
      }
      return op == ReduceOp::Average ? acc / static_cast<double>(expected_contribs.size()) : acc;
    };
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Average, ReduceOp::Min, ReduceOp::Max, ReduceOp::Product}) {
      CAPTURE(to_string(op));
      // A fused burst (a large tensor reduced in its own memory where ranks have cores) and a
      // lone int32 tensor.
      std::vector<float> small(5, rank + 2.0f), large(300000, rank + 2.0f);
      std::vector<Handle> hs;
      hs.push_back(allreduce_async(small, {.op = op, .name = fmt::format("j{}.{}.small", s, to_string(op))}));
      hs.push_back(allreduce_async(large, {.op = op, .name = fmt::format("j{}.{}.large", s, to_string(op))}));
      for (auto& h : hs) h.wait();
      CHECK(small[0] == doctest::Approx(fold(op)));
      CHECK(large.back() == doctest::Approx(fold(op)));
      if (op != ReduceOp::Average) {
        std::vector<std::int32_t> ints(3, rank + 2);
        allreduce(ints, {.op = op, .name = fmt::format("j{}.{}.int", s, to_string(op))});
        CHECK(ints[1] == static_cast<std::int32_t>(fold(op)));
      }
    }
  }
  CHECK(join() == size - 1);
  check_still_works();
}

TEST_CASE("a rank that shuts down while the others are in join() fails their join") {
  {
    Initialized dt;
    if (is_odd_one()) {
      shutdown();
    } else {
      // The ranks named are those shut down by then: the last one, and maybe peers that got
      // their own error first and shut down too.
      expect<ShutdownError>([] { (void)join(); },
                            {"join() can never complete",
                             fmt::format("{}] called dtrain::shutdown() without joining", last_rank())},
                            "join");
    }
  }
  Initialized again;  // the world can start over
  check_still_works();
}

// Note [Generated names] in runtime/engine/engine.hpp: unnamed ops belong to the thread that called
// init().
const std::string kNotInitThread = "from a thread other than the one that called dtrain::init()";

// Every op on this rank now fails with a ShutdownError naming the rank that ended the job (when
// several did, the coordinator passes on the first cause it received).
void check_job_ended_by(std::optional<int> rank) {
  std::vector<float> v(4, 1.0f);
  const std::string who = rank ? fmt::format("rank {} made an unnamed allreduce", *rank)
                               : std::string("made an unnamed allreduce");
  expect<ShutdownError>([&] { allreduce(v, {.name = "after.the.end"}); }, {who, kNotInitThread},
                        "an op after the job ended");
}

TEST_CASE("unnamed ops belong to the init thread: any other thread's unnamed op ends the job on every rank") {
  SUBCASE("the init thread's unnamed ops and other threads' named ops pair up") {
    Initialized dt;
    std::vector<float> v(4, 1.0f);
    allreduce(v, {.op = ReduceOp::Sum});
    CHECK(v[0] == world_size());
    std::thread other([] {
      std::vector<float> named(4, 1.0f);
      allreduce(named, {.op = ReduceOp::Sum, .name = "from.thread"});
      CHECK(named[0] == world_size());
    });
    other.join();
    check_still_works();
  }
  SUBCASE("two threads taking turns, in the opposite order on odd ranks: no result is wrong") {
    // Each thread reduces a tensor filled with its own value: a result that mixes threads' tensors
    // (A's on one rank with B's on another) is wrong. Before the rule, 400 of 400 were.
    Initialized dt;
    std::atomic<int> wrong{0}, refused{0}, ended{0}, completed{0};
    auto run = [&](float value) {
      for (int i = 0; i < 50; ++i) {
        std::vector<float> t(16, value);
        try {
          allreduce(t, {.op = ReduceOp::Sum});
          ++completed;
          if (t[0] != value * static_cast<float>(world_size())) ++wrong;
        } catch (const InvalidArgumentError& e) {
          if (std::string(e.what()).find(kNotInitThread) != std::string::npos) ++refused;
        } catch (const ShutdownError&) {
          ++ended;
        }
      }
    };
    const bool reversed = world_rank() % 2 == 1;
    std::thread first([&] { run(reversed ? 2.0f : 1.0f); });
    first.join();
    std::thread second([&] { run(reversed ? 1.0f : 2.0f); });
    second.join();
    CHECK(wrong == 0);
    CHECK(completed == 0);
    CHECK(refused == 100);  // no call from these threads is ever counted or submitted
    check_job_ended_by(std::nullopt);
  }
  SUBCASE("only the last rank's unnamed op comes from another thread: the peers' op fails at once") {
    Initialized dt;
    if (is_odd_one()) {
      std::thread other([] {
        std::vector<float> v(4, 1.0f);
        expect<InvalidArgumentError>([&] { allreduce(v); }, {kNotInitThread, "explicit names"},
                                     "the other thread");
      });
      other.join();
    } else {
      // The peers make the same call from their init thread: it can never pair, and fails.
      std::vector<float> v(4, 1.0f);
      expect<ShutdownError>([&] { allreduce(v); },
                            {fmt::format("rank {} made an unnamed allreduce", last_rank()),
                             kNotInitThread},
                            "the peers' op");
    }
    check_job_ended_by(last_rank());
  }
  Initialized again;  // the world can start over
  check_still_works();
}

TEST_CASE("settings that shape MPI calls must agree: init fails on every rank, naming them") {
  struct Case {
    const char* variable;
    std::function<void(Config&)> odd;
  };
  const std::vector<Case> cases = {
      {"DTRAIN_MPI_CHUNK_BYTES", [](Config& c) { c.mpi_chunk_bytes = 4096; }},
      {"DTRAIN_HIERARCHICAL_ALLREDUCE", [](Config& c) { c.hierarchical_allreduce = !c.hierarchical_allreduce; }},
      {"DTRAIN_NUM_NCCL_STREAMS", [](Config& c) { c.num_nccl_streams = 3; }},
      {"DTRAIN_MPI_NONBLOCKING", [](Config& c) { c.mpi_nonblocking = !c.mpi_nonblocking; }},
  };
  for (const auto& k : cases) {
    CAPTURE(k.variable);
    Config c = Config::from_env();
    if (is_odd_one()) k.odd(c);
    expect<InvalidArgumentError>([&] { init(c); },
                                 {"ranks disagree", k.variable, fmt::format("on ranks [{}]", last_rank())},
                                 k.variable);
    CHECK_FALSE(is_initialized());
  }
  Initialized fine;  // and a consistent init works afterwards
  check_still_works();
}

TEST_CASE("ranks with different CPU affinity or uneven hosts still agree on how to reduce") {
  // A fused burst of a tensor large enough to be reduced in its own memory (where every rank has
  // a core) and a small one: the plan must be the same on every rank.
  auto burst = [] {
    std::vector<float> large(300000, world_rank() + 1.0f), small(10, world_rank() + 1.0f);
    auto a = allreduce_async(large, {.op = ReduceOp::Sum, .name = "burst.large"});
    auto b = allreduce_async(small, {.op = ReduceOp::Sum, .name = "burst.small"});
    a.wait();
    b.wait();
    const float want = world_size() * (world_size() + 1) / 2.0f;
    std::size_t wrong = 0;
    for (float x : large) wrong += x != want;
    for (float x : small) wrong += x != want;
    CHECK(wrong == 0);
  };
  SUBCASE("the last rank is pinned to one core") {
    cpu_set_t all;
    REQUIRE(sched_getaffinity(0, sizeof(all), &all) == 0);
    if (is_odd_one() && CPU_COUNT(&all) > 1) {
      cpu_set_t one;
      CPU_ZERO(&one);
      for (int c = 0; c < CPU_SETSIZE; ++c)
        if (CPU_ISSET(c, &all)) {
          CPU_SET(c, &one);
          break;
        }
      REQUIRE(sched_setaffinity(0, sizeof(one), &one) == 0);
    }
    {
      Initialized dt;
      burst();
    }
    if (is_odd_one()) sched_setaffinity(0, sizeof(all), &all);
  }
  SUBCASE("every rank but the last on one host") {
    Config c = Config::from_env();
    c.host_id = is_odd_one() ? "host-b" : "host-a";
    Initialized dt(c);
    CHECK(local_size() == (is_odd_one() ? 1 : world_size() - 1));
    burst();
  }
}

TEST_CASE("shutdown while another thread submits: ops fail cleanly, nothing crashes") {
  init();
  std::atomic<bool> started{false};
  std::string failure;
  std::thread submitter([&] {
    try {
      for (int i = 0;; ++i) {
        std::vector<float> v(8, 1.0f);
        allreduce(v, {.name = fmt::format("spin.{}", i)});
        started = true;
      }
    } catch (const Error& e) {
      failure = e.what();
    }
  });
  while (!started) std::this_thread::sleep_for(1ms);
  std::this_thread::sleep_for(20ms);
  shutdown();
  submitter.join();
  INFO(failure);
  CHECK((failure.find("shutdown") != std::string::npos ||
         failure.find("after dtrain::shutdown()") != std::string::npos));
}

TEST_CASE("lifecycle: calls after shutdown say so; init with other settings is refused; nested sessions") {
  {
    Session outer;
    {
      Session inner;  // finds dtrain running: leaves it running when it ends
    }
    CHECK(is_initialized());
    check_still_works();
    Config other = config();
    other.cycle_time_ms += 1;
    expect<InvalidArgumentError>([&] { init(other); },
                                 {"already running with different settings", "cycle_time_ms"},
                                 "init with other settings");
    CHECK_NOTHROW(init(config()));  // the same settings: nothing to do
    CHECK_NOTHROW(init());
  }
  CHECK_FALSE(is_initialized());
  expect<NotInitializedError>([] { (void)rank(); }, {"after dtrain::shutdown()"}, "rank after shutdown");
}
