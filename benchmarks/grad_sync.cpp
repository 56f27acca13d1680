// Gradient synchronization of a real model's parameter list: dtrain vs hand-written raw MPI, with
// ReduceOp::Sum and with ReduceOp::Average (the default, and what DistributedOptimizer uses),
// side by side in one run.
//
// Every step refills the gradients (outside the timed region, as backward would), then times from
// a barrier until every gradient is reduced (float32) on every rank.
// dtrain strategies (tensors submitted one by one in backward order, then all handles waited):
//   dtrain fused            the default Config (fusion on, pipelined packing)
//   dtrain fused, grouped   the default Config, one grouped_allreduce of the whole list
//   dtrain fused, grads in fusion memory
//                           "dtrain fused" with the gradients as views of a GradientBuffer
//                           (Note [Gradients in fusion memory]): no pack/unpack copies
//   dtrain forced overlap   the default Config with packing overlapped with reduction even where
//                           the ranks fill the host's cores (the default then packs inline; see
//                           Note [Fusion pipeline])
//   dtrain no pipeline      DTRAIN_FUSION_PIPELINE=0: pack, reduce, unpack in sequence
//   dtrain no fusion        DTRAIN_FUSION_THRESHOLD=0: one collective per tensor
//   dtrain scale after      the default Config with scaled allreduces scaling their whole result
//                           after one MPI_Allreduce (detail::disable_scaling_in_shards()), i.e.
//                           what Note [Scaled allreduce] saves; its Sum column equals "fused"
//   dtrain fused, profiled  "dtrain fused" (Sum) inside a dtrain::Profiler step, the wait for the
//                           handles in a communication_wait phase, the sampler at its shortest
//                           period (100 ms) and the writer thread running (docs/profiling.md);
//                           measured in 3 adjacent pairs with "dtrain fused" per round, so these
//                           two have 3 samples per round
// Raw MPI strategies (the three a user would write by hand); for Average each follows MPI_SUM by
// a 1/n scaling, as a user must (MPI has no average):
//   raw per-tensor          one MPI_Allreduce per tensor, backward order (then a 1/n loop over it)
//   raw concat              copy into one preallocated buffer, one MPI_Allreduce, copy back (the
//                           1/n folded into the copy back)
//   raw concat chunked      the same buffer reduced in DTRAIN_MPI_CHUNK_BYTES calls
// and the floor that no strategy above can beat without changing the model's memory layout:
//   ref flat, no copies     the gradients already live in one buffer: chunked MPI_Allreduce
//                           (MPI_SUM) only, no scaling; the same figure heads both columns
// The configurations are interleaved round by round: each round initializes dtrain with each
// Config in turn (dtrain::init / dtrain::shutdown in one process, MPI owned by the benchmark).
//
// Usage: mpiexec -n <ranks> bench_grad_sync [--rounds=8] [--model=resnet50|resnet18|all]
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <vector>

#include <dtrain/comm/host_collectives.hpp>
#include <dtrain/dtrain.hpp>
#include <dtrain/runtime/execution/fusion_pipeline.hpp>

#include "bench_common.hpp"

namespace {

struct Model {
  std::string name;
  std::vector<bench::Param> params;
  std::vector<std::vector<float>> grads;  // backward order
  std::int64_t total = 0;                 // elements
};

Model make_model(const std::string& name) {
  Model m;
  m.name = name;
  m.params = name == "resnet50" ? bench::resnet50_params() : bench::resnet18_params();
  for (const auto& p : m.params) {
    m.grads.emplace_back(static_cast<std::size_t>(p.numel()), 0.0f);
    m.total += p.numel();
  }
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  bench::MpiProcess mpi(argc, argv);
  const bench::Args args(argc, argv);
  const int rounds = static_cast<int>(args.get_int("rounds", 8));
  const std::string which = args.get("model", "all");

  const dtrain::Config fused = dtrain::Config::from_env();
  dtrain::Config no_fusion = fused;
  no_fusion.fusion_threshold_bytes = 0;
  dtrain::Config no_pipeline = fused;
  no_pipeline.fusion_pipeline = false;
  const std::int64_t chunk = fused.mpi_chunk_bytes / 4;

  std::vector<Model> models;
  if (which == "all" || which == "resnet50") models.push_back(make_model("resnet50"));
  if (which == "all" || which == "resnet18") models.push_back(make_model("resnet18"));

  std::int64_t largest = 0;
  for (const auto& m : models) largest = std::max(largest, m.total);
  std::vector<float> concat(static_cast<std::size_t>(largest), 0.0f);  // raw strategies' buffer
  std::vector<float> flat(static_cast<std::size_t>(largest), 0.0f);    // the reference's layout

  using dtrain::ReduceOp;
  const ReduceOp ops[] = {ReduceOp::Sum, ReduceOp::Average};
  auto op_name = [](ReduceOp op) { return std::string(dtrain::to_string(op)); };
  // What a user multiplies the MPI_SUM result by.
  auto scale_of = [&](ReduceOp op) {
    return op == ReduceOp::Average ? 1.0f / static_cast<float>(mpi.size()) : 1.0f;
  };
  bool wrong = false;
  auto refill = [](Model& m) {
    for (auto& g : m.grads) std::fill(g.begin(), g.end(), 1.0f);
  };
  auto timed_step = [&](Model& m, ReduceOp op, auto&& body) {
    refill(m);
    mpi.barrier();
    const auto t0 = bench::Clock::now();
    body();
    const double t = mpi.max_over_ranks(bench::seconds_since(t0));
    const float expected = op == ReduceOp::Average ? 1.0f : static_cast<float>(mpi.size());
    auto near = [&](float v) { return std::abs(v - expected) <= 1e-6f * expected; };
    wrong |= !near(m.grads.front().front()) || !near(m.grads.back().back());
    return t;
  };

  auto dtrain_async = [&](Model& m, ReduceOp op) {
    std::vector<dtrain::Handle> handles;
    handles.reserve(m.grads.size());
    for (std::size_t i = 0; i < m.grads.size(); ++i)
      handles.push_back(dtrain::allreduce_async(m.grads[i], {.op = op, .name = m.params[i].name}));
    for (auto& h : handles) h.wait();
  };
  // The same step, profiled as a training loop would be.
  auto dtrain_profiled = [&](Model& m, dtrain::Profiler& profiler) {
    auto step = profiler.step();
    std::vector<dtrain::Handle> handles;
    handles.reserve(m.grads.size());
    {
      auto backward = profiler.phase(dtrain::Phase::backward);
      for (std::size_t i = 0; i < m.grads.size(); ++i)
        handles.push_back(dtrain::allreduce_async(
            m.grads[i], {.op = ReduceOp::Sum, .name = m.params[i].name}));
    }
    auto wait = profiler.phase(dtrain::Phase::communication_wait);
    for (auto& h : handles) h.wait();
  };
  long profile_pid = static_cast<long>(::getpid());
  MPI_Bcast(&profile_pid, 1, MPI_LONG, 0, mpi.comm());
  dtrain::ProfilerOptions profiled;
  profiled.dir = (std::filesystem::temp_directory_path() /
                  ("dtrain_bench_grad_sync_profile_" + std::to_string(profile_pid)))
                     .string();
  profiled.sample_interval = dtrain::min_profile_interval;
  profiled.start_recording = false;
  auto dtrain_grouped = [&](Model& m, ReduceOp op) {
    dtrain::grouped_allreduce(m.grads, {.op = op, .name = m.name + ".grads." + op_name(op)});
  };
  auto scale_loop = [](float* p, std::size_t n, float s) {
    if (s != 1.0f)
      for (std::size_t i = 0; i < n; ++i) p[i] *= s;
  };
  auto raw_per_tensor = [&](Model& m, ReduceOp op) {
    for (auto& g : m.grads) {
      MPI_Allreduce(MPI_IN_PLACE, g.data(), static_cast<int>(g.size()), MPI_FLOAT, MPI_SUM,
                    mpi.comm());
      scale_loop(g.data(), g.size(), scale_of(op));
    }
  };
  auto pack = [&](Model& m) {
    float* p = concat.data();
    for (auto& g : m.grads) p = std::copy(g.begin(), g.end(), p);
  };
  auto unpack = [&](Model& m, ReduceOp op) {
    const float s = scale_of(op);
    const float* p = concat.data();
    for (auto& g : m.grads) {
      if (s == 1.0f) std::copy(p, p + g.size(), g.begin());
      else std::transform(p, p + g.size(), g.begin(), [s](float v) { return v * s; });
      p += g.size();
    }
  };
  auto chunked = [&](float* buf, std::int64_t n) {
    for (std::int64_t off = 0; off < n; off += chunk)
      MPI_Allreduce(MPI_IN_PLACE, buf + off, static_cast<int>(std::min(chunk, n - off)), MPI_FLOAT,
                    MPI_SUM, mpi.comm());
  };
  auto raw_concat = [&](Model& m, ReduceOp op) {
    pack(m);
    MPI_Allreduce(MPI_IN_PLACE, concat.data(), static_cast<int>(m.total), MPI_FLOAT, MPI_SUM,
                  mpi.comm());
    unpack(m, op);
  };
  auto raw_concat_chunked = [&](Model& m, ReduceOp op) {
    pack(m);
    chunked(concat.data(), m.total);
    unpack(m, op);
  };

  dtrain::init(fused);
  const int local_ranks = dtrain::local_size();
  const bool overlap = fused.fusion_pipeline && dtrain::detail::overlap_pays(local_ranks);
  // The same gradients, living in fusion memory: one GradientBuffer per model, backward order.
  std::map<std::string, std::unique_ptr<dtrain::GradientBuffer<float>>> in_fusion;
  for (const auto& m : models) {
    std::vector<std::int64_t> numels;
    for (const auto& g : m.grads) numels.push_back(static_cast<std::int64_t>(g.size()));
    in_fusion[m.name] = std::make_unique<dtrain::GradientBuffer<float>>(numels);
  }
  dtrain::shutdown();
  auto fusion_memory_step = [&](Model& m, ReduceOp op) {
    auto& b = *in_fusion[m.name];
    std::fill(b.flat().begin(), b.flat().end(), 1.0f);
    mpi.barrier();
    const auto t0 = bench::Clock::now();
    std::vector<dtrain::Handle> handles;
    handles.reserve(b.count());
    for (std::size_t i = 0; i < b.count(); ++i) {
      std::span<float> g = b.view(i);
      handles.push_back(dtrain::allreduce_async(g, {.op = op, .name = m.params[i].name + ".fm"}));
    }
    for (auto& h : handles) h.wait();
    const double t = mpi.max_over_ranks(bench::seconds_since(t0));
    const float expected = op == ReduceOp::Average ? 1.0f : static_cast<float>(mpi.size());
    auto near = [&](float v) { return std::abs(v - expected) <= 1e-6f * expected; };
    wrong |= !near(b.view(0).front()) || !near(b.view(b.count() - 1).back());
    return t;
  };

  std::map<std::string, std::uint64_t> collectives_per_step;
  std::map<std::string, std::vector<double>> profiled_ratio;  // profiled / adjacent unprofiled
  bench::Samples samples;  // "<model>/<op>/<strategy>"
  for (int round = 0; round < rounds; ++round) {
    for (auto& m : models) {
      auto record = [&](ReduceOp op, const std::string& strategy, double t) {
        samples.add(m.name + "/" + op_name(op) + "/" + strategy, t);
      };
      // One block per Config; a warm-up step per op after each init fills the response cache and
      // allocates the fusion buffer, as the first step of a training run would. The two ops
      // alternate in order from round to round.
      auto ops_in_order = [&] {
        return round % 2 == 0 ? std::vector<ReduceOp>{ops[0], ops[1]}
                              : std::vector<ReduceOp>{ops[1], ops[0]};
      };
      auto with_dtrain = [&](const dtrain::Config& c, auto&& strategies, bool force_overlap = false) {
        dtrain::detail::force_fusion_overlap() = force_overlap;
        dtrain::init(c);
        for (ReduceOp op : ops) dtrain_async(m, op);
        strategies();
        dtrain::shutdown();
        dtrain::detail::force_fusion_overlap() = false;
      };
      auto dtrain_blocks = [&] {
        with_dtrain(fused, [&] {
          for (ReduceOp op : ops) dtrain_grouped(m, op);  // warm the group's names too
          dtrain::Profiler profiler(profiled);  // recording only around its own samples
          double plain_t = 0, profiled_t = 0;
          auto plain = [&] {
            const auto before = dtrain::engine_stats().collectives;
            plain_t = timed_step(m, ReduceOp::Sum, [&] { dtrain_async(m, ReduceOp::Sum); });
            record(ReduceOp::Sum, "dtrain fused", plain_t);
            collectives_per_step[m.name] = dtrain::engine_stats().collectives - before;
          };
          auto with_profiler = [&] {
            profiler.start();
            profiled_t = timed_step(m, ReduceOp::Sum, [&] { dtrain_profiled(m, profiler); });
            record(ReduceOp::Sum, "dtrain fused, profiled", profiled_t);
            profiler.stop();
          };
          // Several adjacent pairs, in alternating order: the difference is small next to the
          // noise of a shared machine, so it is judged pair by pair.
          for (int pair = 0; pair < 3; ++pair) {
            if ((round + pair) % 2 == 0) {
              plain();
              with_profiler();
            } else {
              with_profiler();
              plain();
            }
            profiled_ratio[m.name].push_back(profiled_t / plain_t);
            // Average's step sits next to each pair, so both ops see the same machine.
            record(ReduceOp::Average, "dtrain fused",
                   timed_step(m, ReduceOp::Average, [&] { dtrain_async(m, ReduceOp::Average); }));
          }
          for (ReduceOp op : ops_in_order())
            record(op, "dtrain fused, grouped", timed_step(m, op, [&] { dtrain_grouped(m, op); }));
          for (ReduceOp op : ops) fusion_memory_step(m, op);  // warm-up: names, cache ids
          for (ReduceOp op : ops_in_order())
            record(op, "dtrain fused, grads in fusion memory", fusion_memory_step(m, op));
        });
        auto each_op = [&](const std::string& strategy) {
          return [&, strategy] {
            for (ReduceOp op : ops_in_order())
              record(op, strategy, timed_step(m, op, [&] { dtrain_async(m, op); }));
          };
        };
        if (!overlap) with_dtrain(fused, each_op("dtrain forced overlap"), true);
        with_dtrain(no_pipeline, each_op("dtrain no pipeline"));
        with_dtrain(no_fusion, each_op("dtrain no fusion"));
        dtrain::detail::disable_scaling_in_shards() = true;
        with_dtrain(fused, each_op("dtrain scale after"));
        dtrain::detail::disable_scaling_in_shards() = false;
      };
      auto raw_blocks = [&] {
        for (ReduceOp op : ops_in_order()) {
          record(op, "raw per-tensor", timed_step(m, op, [&] { raw_per_tensor(m, op); }));
          record(op, "raw concat", timed_step(m, op, [&] { raw_concat(m, op); }));
          record(op, "raw concat chunked", timed_step(m, op, [&] { raw_concat_chunked(m, op); }));
        }
        const double floor = timed_step(m, ReduceOp::Sum, [&] {
          chunked(flat.data(), m.total);
          const float sum = static_cast<float>(mpi.size());
          for (auto& g : m.grads) g.front() = g.back() = sum;  // the check reads the grads
        });
        for (ReduceOp op : ops) record(op, "ref flat, no copies", floor);
      };
      if (round % 2 == 0) {
        dtrain_blocks();
        raw_blocks();
      } else {
        raw_blocks();
        dtrain_blocks();
      }
    }
  }

  if (mpi.rank() == 0) std::filesystem::remove_all(profiled.dir);
  int any_wrong = wrong ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &any_wrong, 1, MPI_INT, MPI_MAX, mpi.comm());
  if (mpi.rank() == 0) {
    fmt::print("# gradient sync, float32, Sum and Average side by side, backward order, {} rounds "
               "(median over rounds; ratios of medians)\n",
               rounds);
    fmt::print("# {}\n", bench::machine_line(mpi.size()));
    fmt::print("# {} ranks on this host: fused responses {} tensors >= {} KiB in place; packing "
               "overlap (DTRAIN_FUSION_PIPELINE=1) {}\n",
               local_ranks, dtrain::detail::direct_pays(local_ranks) ? "reduce" : "do not reduce",
               dtrain::detail::kFusionDirectMinBytes >> 10, overlap ? "used" : "not used");
    if (any_wrong) fmt::print("# ERROR: some strategy produced a wrong result\n");
    const std::vector<std::string> raw = {"raw per-tensor", "raw concat", "raw concat chunked"};
    for (const auto& m : models) {
      auto get = [&](ReduceOp op, const std::string& strategy) {
        return samples.get(m.name + "/" + op_name(op) + "/" + strategy);
      };
      auto best_raw = [&](ReduceOp op) {
        std::string best = raw.front();
        for (const auto& r : raw)
          if (get(op, r).median < get(op, best).median) best = r;
        return best;
      };
      const std::string best_sum = best_raw(ReduceOp::Sum), best_avg = best_raw(ReduceOp::Average);
      const double raw_tensor_sum = get(ReduceOp::Sum, "raw per-tensor").median;
      const double floor = get(ReduceOp::Sum, "ref flat, no copies").median;
      fmt::print("\n## {}: {} tensors, {:.1f} MB; dtrain fused ran {} collectives per step (Sum)\n",
                 m.name, m.params.size(), static_cast<double>(m.total) * 4 / 1e6,
                 collectives_per_step[m.name]);
      fmt::print("best raw Sum: {}; best raw Average: {}\n\n", best_sum, best_avg);
      fmt::print("| strategy | Sum median | Average median | Avg / Sum | Sum / best raw Sum | "
                 "Avg / raw per-tensor Sum | Avg / best raw Avg | Sum / floor | Avg / floor |\n");
      fmt::print("|---|---|---|---|---|---|---|---|---|\n");
      std::vector<std::string> strategies;
      for (const auto& full : samples.names()) {
        const std::string prefix = m.name + "/Sum/";
        if (full.rfind(prefix, 0) == 0) strategies.push_back(full.substr(prefix.size()));
      }
      auto ratio = [](double a, double b) {
        return a > 0 && b > 0 ? fmt::format("{:.2f}", a / b) : std::string("-");
      };
      auto time = [](double t) { return t > 0 ? bench::human_time(t) : std::string("-"); };
      for (const auto& s : strategies) {
        const double sum = get(ReduceOp::Sum, s).median, avg = get(ReduceOp::Average, s).median;
        fmt::print("| {} | {} | {} | {} | {} | {} | {} | {} | {} |\n", s, time(sum), time(avg),
                   ratio(avg, sum), ratio(sum, get(ReduceOp::Sum, best_sum).median),
                   ratio(avg, raw_tensor_sum), ratio(avg, get(ReduceOp::Average, best_avg).median),
                   ratio(sum, floor), ratio(avg, floor));
      }
      auto ratios = profiled_ratio[m.name];
      std::sort(ratios.begin(), ratios.end());
      if (!ratios.empty())
        fmt::print("\nprofiled / unprofiled (Sum), adjacent pairs: median {:.3f}, quartiles {:.3f} "
                   "- {:.3f} ({} pairs)\n",
                   bench::summarize(ratios).median, ratios[ratios.size() / 4],
                   ratios[ratios.size() * 3 / 4], ratios.size());
    }
  }
  return any_wrong;
}
