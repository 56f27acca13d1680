// Small-op latency: the round trip of one allreduce through dtrain's engine vs one raw
// MPI_Allreduce of the same size, and where dtrain's extra time goes.
//
//   lone          barrier, then one op, timed alone: the engine is otherwise idle (its thread is
//                 blocked when the op arrives), the case Horovod pays a full cycle for
//   back-to-back  ops in a row, each waited before the next is submitted, time per op
// Samples of dtrain and raw MPI alternate (Note [Benchmark method] in bench_common.hpp). Sizes:
// 4 B and 4 KiB (latency), 1 MiB and 4 MiB (where the fixed cost shows as lost bandwidth).
//
// The breakdown times, in the same run, the parts an op goes through besides the collective
// itself, each with the engine's own pieces but without the engine:
//   hand-off      a caller thread enqueues under a mutex and notifies a condition variable; a
//                 thread blocked on it (as an idle engine is) wakes and completes an OpState; the
//                 caller, blocked in OpState::wait(), wakes. Two futex wake-ups, the fixed cost
//                 of running collectives on a thread of their own.
//   negotiation   the control round trip of a cached op: every rank sends a RequestMessage with
//                 one cache id to rank 0 over a ControlChannel, rank 0 answers every rank with a
//                 ResponseMessage of one response, each side polling as the engine's hot poll
//                 does. What a negotiated op costs beyond its collective.
// "dtrain - raw - hand-off - negotiation" is what the engine itself adds (its loop, the
// coordinator's bookkeeping, encoding, the backend's dispatch).
//
// Usage: mpiexec -n <ranks> bench_small_op_latency [--samples=300]
#include <algorithm>
#include <vector>

#include <dtrain/dtrain.hpp>
#include <dtrain/runtime/engine/control_channel.hpp>
#include <dtrain/runtime/negotiation/messages.hpp>

#include "bench_common.hpp"
#include "handoff_thread.hpp"

int main(int argc, char** argv) {
  bench::MpiProcess mpi(argc, argv);
  const bench::Args args(argc, argv);
  const int samples_per = static_cast<int>(args.get_int("samples", 300));
  const int burst = 100;

  dtrain::init(dtrain::Config::from_env());
  const std::vector<std::int64_t> sizes = {4, 4096, 1 << 20, 4 << 20};
  bench::Samples samples;
  for (auto bytes : sizes) {
    const bool large = bytes >= (1 << 20);
    const int lone_samples = large ? std::max(samples_per / 5, 10) : samples_per;
    const int burst_len = large ? 10 : burst;
    std::vector<float> a(static_cast<std::size_t>(bytes / 4), 0.0f), b(a.size(), 0.0f);
    const std::string name = fmt::format("lat.{}", bytes);
    auto via_dtrain = [&] { dtrain::allreduce(a, {.op = dtrain::ReduceOp::Sum, .name = name}); };
    auto via_mpi = [&] {
      MPI_Allreduce(MPI_IN_PLACE, b.data(), static_cast<int>(b.size()), MPI_FLOAT, MPI_SUM,
                    mpi.comm());
    };
    auto lone = [&](auto&& op) {
      mpi.barrier();
      const auto t0 = bench::Clock::now();
      op();
      return mpi.max_over_ranks(bench::seconds_since(t0));
    };
    auto burst_of = [&](auto&& op) {
      mpi.barrier();
      const auto t0 = bench::Clock::now();
      for (int i = 0; i < burst_len; ++i) op();
      return mpi.max_over_ranks(bench::seconds_since(t0) / burst_len);
    };
    for (int i = 0; i < 20; ++i) {  // warm-up: cache id, MPI connections
      via_dtrain();
      via_mpi();
    }
    for (int s = 0; s < lone_samples; ++s) {
      const bool dtrain_first = s % 2 == 0;
      if (dtrain_first) samples.add(fmt::format("dtrain lone/{}", bytes), lone(via_dtrain));
      samples.add(fmt::format("raw lone/{}", bytes), lone(via_mpi));
      if (!dtrain_first) samples.add(fmt::format("dtrain lone/{}", bytes), lone(via_dtrain));
    }
    for (int s = 0; s < lone_samples / 20 + 3; ++s) {
      samples.add(fmt::format("dtrain burst/{}", bytes), burst_of(via_dtrain));
      samples.add(fmt::format("raw burst/{}", bytes), burst_of(via_mpi));
    }
  }

  // Hand-off: the engine's enqueue/notify and the OpState completion, between two threads.
  {
    bench::HandoffThread engine;
    auto handoff = [&] {
      const auto t0 = bench::Clock::now();
      engine.run([] {});
      return bench::seconds_since(t0);
    };
    for (int i = 0; i < 20; ++i) handoff();
    for (int s = 0; s < samples_per; ++s) {
      mpi.barrier();  // as in "lone": the other thread has been blocked a while
      samples.add("hand-off", mpi.max_over_ranks(handoff()));
    }
  }
  // Negotiation: one cached op's request to rank 0 and response back, on a ControlChannel.
  {
    MPI_Comm control;
    MPI_Comm_dup(mpi.comm(), &control);
    {
      dtrain::detail::ControlChannel channel(control);
      dtrain::detail::RequestMessage request;
      request.rank = mpi.rank();
      request.cached.push_back(7);
      dtrain::detail::ResponseMessage response;
      dtrain::detail::Response r;
      r.names.push_back("lat.4096");
      r.numels.push_back(1024);
      r.active_ranks = mpi.size();
      response.responses.push_back(r);
      auto round_trip = [&] {
        const auto t0 = bench::Clock::now();
        if (mpi.rank() == 0) {
          for (int got = 1; got < mpi.size();)
            if (auto m = channel.receive_request()) ++got;
          ++response.seq;
          channel.send_response(response, mpi.size());
          while (channel.sending()) channel.progress();
        } else {
          ++request.responses_applied;
          channel.send_request(request);
          while (!channel.receive_response()) channel.progress();
          while (channel.sending()) channel.progress();
        }
        return bench::seconds_since(t0);
      };
      for (int i = 0; i < 20; ++i) {
        mpi.barrier();
        round_trip();
      }
      for (int s = 0; s < samples_per; ++s) {
        mpi.barrier();
        samples.add("negotiation", mpi.max_over_ranks(round_trip()));
      }
    }
    MPI_Comm_free(&control);
  }

  if (mpi.rank() == 0) {
    fmt::print("# small-op allreduce latency, float32 Sum (median / min over samples)\n");
    fmt::print("# {}\n", bench::machine_line(mpi.size()));
    fmt::print("| size | mode | dtrain median | dtrain min | raw median | raw min | ratio "
               "(median) | ratio (min) |\n");
    fmt::print("|---|---|---|---|---|---|---|---|\n");
    for (auto bytes : sizes) {
      for (std::string mode : {"lone", "burst"}) {
        auto d = samples.get(fmt::format("dtrain {}/{}", mode, bytes));
        auto r = samples.get(fmt::format("raw {}/{}", mode, bytes));
        fmt::print("| {} | {} | {} | {} | {} | {} | {:.2f} | {:.2f} |\n", bench::human_bytes(bytes),
                   mode == "lone" ? "lone" : "back-to-back", bench::human_time(d.median),
                   bench::human_time(d.min), bench::human_time(r.median), bench::human_time(r.min),
                   d.median / r.median, d.min / r.min);
      }
    }
    const auto h = samples.get("hand-off"), n = samples.get("negotiation");
    fmt::print("\n# where a lone op's extra time goes (medians)\n");
    fmt::print("| size | dtrain - raw | hand-off | negotiation | rest (engine loop, dispatch) | "
               "raw / dtrain (busbw ratio) |\n");
    fmt::print("|---|---|---|---|---|---|\n");
    for (auto bytes : sizes) {
      const auto d = samples.get(fmt::format("dtrain lone/{}", bytes));
      const auto r = samples.get(fmt::format("raw lone/{}", bytes));
      const double extra = d.median - r.median;
      fmt::print("| {} | {} | {} | {} | {} | {:.2f} |\n", bench::human_bytes(bytes),
                 bench::human_time(extra), bench::human_time(h.median),
                 bench::human_time(n.median), bench::human_time(extra - h.median - n.median),
                 r.median / d.median);
    }
  }
  dtrain::shutdown();
  return 0;
}
