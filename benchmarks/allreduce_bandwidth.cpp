// Allreduce bandwidth through dtrain vs raw MPI_Allreduce, 4 KiB ... 64 MiB of float32.
//
// Strategies, interleaved round by round (Note [Benchmark method] in bench_common.hpp):
//   dtrain        dtrain::allreduce (sync) of one tensor, ReduceOp::Sum
//   dtrain avg    the same with ReduceOp::Average (Note [Scaled allreduce])
//   raw           one MPI_Allreduce(MPI_IN_PLACE) of the whole buffer
//   raw-chunked   the same buffer as MPI_Allreduce calls of DTRAIN_MPI_CHUNK_BYTES each, i.e. what
//                 dtrain hands MPI; shows how much of dtrain's lead on large messages is chunking
//   raw avg       MPI_Allreduce(MPI_SUM) then a 1/n loop: an average written by hand
//   raw thread    the raw call made by a helper thread that the caller hands it to and waits
//                 for, with the engine's hand-off pieces (handoff_thread.hpp): what running the
//                 collective off the caller's thread costs by itself
// Every buffer is allocated and touched once, before the first round.
//
// Usage: mpiexec -n <ranks> bench_allreduce_bandwidth [--rounds=10] [--min-bytes=4096]
//        [--max-bytes=67108864] [--reps=N: ops per sample; default 8 MiB worth, 1 to 50]
#include <algorithm>
#include <vector>

#include <dtrain/dtrain.hpp>

#include "bench_common.hpp"
#include "handoff_thread.hpp"

int main(int argc, char** argv) {
  bench::MpiProcess mpi(argc, argv);
  const bench::Args args(argc, argv);
  const int rounds = static_cast<int>(args.get_int("rounds", 10));
  const std::int64_t min_bytes = args.get_int("min-bytes", 4096);
  const std::int64_t max_bytes = args.get_int("max-bytes", 64 << 20);
  const std::int64_t fixed_reps = args.get_int("reps", 0);

  dtrain::init(dtrain::Config::from_env());
  const std::int64_t chunk_bytes = dtrain::config().mpi_chunk_bytes;

  std::vector<std::int64_t> sizes;
  for (std::int64_t b = min_bytes; b <= max_bytes; b *= 4) {
    sizes.push_back(b);
    if (b == (16 << 20) && max_bytes >= (32 << 20)) sizes.push_back(32 << 20);  // MPICH's cliff
  }
  std::vector<std::vector<float>> mine(sizes.size()), theirs(sizes.size());
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    mine[i].assign(static_cast<std::size_t>(sizes[i] / 4), 0.0f);
    theirs[i].assign(static_cast<std::size_t>(sizes[i] / 4), 0.0f);
  }

  // Repeat small ops so one sample lasts long enough for the clock, and large ones once.
  auto reps_for = [&](std::int64_t bytes) {
    if (fixed_reps > 0) return static_cast<int>(fixed_reps);
    return static_cast<int>(std::clamp<std::int64_t>((8 << 20) / bytes, 1, 50));
  };
  auto time_reps = [&](int reps, auto&& op) {
    mpi.barrier();
    const auto t0 = bench::Clock::now();
    for (int r = 0; r < reps; ++r) op();
    return mpi.max_over_ranks(bench::seconds_since(t0) / reps);
  };

  bench::HandoffThread helper;
  MPI_Comm helper_comm;  // the helper's own: the caller's barriers never meet its allreduces
  MPI_Comm_dup(mpi.comm(), &helper_comm);

  bench::Samples samples;
  for (int round = -1; round < rounds; ++round) {  // round -1 warms up (cache ids, MPI paths)
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      const std::int64_t bytes = sizes[i];
      const int reps = round < 0 ? 1 : reps_for(bytes);
      const std::string name = fmt::format("bw.{}", bytes);
      auto run_dtrain = [&] {
        return time_reps(reps, [&] {
          dtrain::allreduce(mine[i], {.op = dtrain::ReduceOp::Sum, .name = name});
        });
      };
      auto run_raw = [&] {
        return time_reps(reps, [&] {
          MPI_Allreduce(MPI_IN_PLACE, theirs[i].data(), static_cast<int>(theirs[i].size()),
                        MPI_FLOAT, MPI_SUM, mpi.comm());
        });
      };
      auto run_dtrain_avg = [&] {
        return time_reps(reps, [&] {
          dtrain::allreduce(mine[i], {.op = dtrain::ReduceOp::Average, .name = name + ".avg"});
        });
      };
      auto run_raw_avg = [&] {
        const float s = 1.0f / static_cast<float>(mpi.size());
        return time_reps(reps, [&] {
          MPI_Allreduce(MPI_IN_PLACE, theirs[i].data(), static_cast<int>(theirs[i].size()),
                        MPI_FLOAT, MPI_SUM, mpi.comm());
          for (float& v : theirs[i]) v *= s;
        });
      };
      auto run_raw_chunked = [&] {
        const std::int64_t n = static_cast<std::int64_t>(theirs[i].size()), c = chunk_bytes / 4;
        return time_reps(reps, [&] {
          for (std::int64_t off = 0; off < n; off += c)
            MPI_Allreduce(MPI_IN_PLACE, theirs[i].data() + off, static_cast<int>(std::min(c, n - off)),
                          MPI_FLOAT, MPI_SUM, mpi.comm());
        });
      };
      auto run_raw_thread = [&] {
        return time_reps(reps, [&] {
          helper.run([&] {
            MPI_Allreduce(MPI_IN_PLACE, theirs[i].data(), static_cast<int>(theirs[i].size()),
                          MPI_FLOAT, MPI_SUM, helper_comm);
          });
        });
      };
      // Alternate the order so neither strategy always runs on a cache warmed by the other.
      double d = 0, r = 0, rc = 0, da = 0, ra = 0, rt = 0;
      if (round % 2 == 0) {
        d = run_dtrain();
        r = run_raw();
        rt = run_raw_thread();
        da = run_dtrain_avg();
        ra = run_raw_avg();
        rc = run_raw_chunked();
      } else {
        rc = run_raw_chunked();
        ra = run_raw_avg();
        da = run_dtrain_avg();
        rt = run_raw_thread();
        r = run_raw();
        d = run_dtrain();
      }
      if (round < 0) continue;
      samples.add(fmt::format("dtrain/{}", bytes), d);
      samples.add(fmt::format("raw/{}", bytes), r);
      samples.add(fmt::format("rawchunk/{}", bytes), rc);
      samples.add(fmt::format("dtrainavg/{}", bytes), da);
      samples.add(fmt::format("rawavg/{}", bytes), ra);
      samples.add(fmt::format("rawthread/{}", bytes), rt);
    }
  }
  MPI_Comm_free(&helper_comm);

  if (mpi.rank() == 0) {
    const int n = mpi.size();
    fmt::print("# allreduce bandwidth, float32 Sum (and Average), {} rounds (median / min over rounds)\n", rounds);
    fmt::print("# {}\n", bench::machine_line(n));
    fmt::print("# DTRAIN_MPI_CHUNK_BYTES = {}\n", chunk_bytes);
    fmt::print("| size | dtrain time | dtrain busbw GB/s | raw time | raw busbw GB/s | dtrain/raw "
               "busbw (median) | (best) | raw chunked busbw GB/s |\n");
    fmt::print("|---|---|---|---|---|---|---|---|\n");
    for (auto bytes : sizes) {
      auto d = samples.get(fmt::format("dtrain/{}", bytes));
      auto r = samples.get(fmt::format("raw/{}", bytes));
      auto rc = samples.get(fmt::format("rawchunk/{}", bytes));
      const double b = static_cast<double>(bytes);
      fmt::print("| {} | {} | {:.3f} | {} | {:.3f} | {:.2f} | {:.2f} | {:.3f} |\n",
                 bench::human_bytes(bytes), bench::human_time(d.median),
                 bench::allreduce_busbw_gbps(b, d.median, n), bench::human_time(r.median),
                 bench::allreduce_busbw_gbps(b, r.median, n), r.median / d.median, r.min / d.min,
                 bench::allreduce_busbw_gbps(b, rc.median, n));
    }
    fmt::print("\n# The raw call on a helper thread (medians): an engine thread without dtrain\n");
    fmt::print("| size | raw | raw thread | raw thread / raw time | dtrain | dtrain / raw thread time |\n");
    fmt::print("|---|---|---|---|---|---|\n");
    for (auto bytes : sizes) {
      auto d = samples.get(fmt::format("dtrain/{}", bytes));
      auto r = samples.get(fmt::format("raw/{}", bytes));
      auto rt = samples.get(fmt::format("rawthread/{}", bytes));
      fmt::print("| {} | {} | {} | {:.2f} | {} | {:.2f} |\n", bench::human_bytes(bytes),
                 bench::human_time(r.median), bench::human_time(rt.median), rt.median / r.median,
                 bench::human_time(d.median), d.median / rt.median);
    }
    fmt::print("\n# Average: dtrain (ReduceOp::Average) vs MPI_SUM then a 1/n loop (medians)\n");
    fmt::print("| size | dtrain Average | dtrain Sum | dtrain Avg / Sum | raw Sum + 1/n loop | "
               "raw Sum | dtrain Avg / raw Sum + loop | dtrain Avg / raw Sum |\n");
    fmt::print("|---|---|---|---|---|---|---|---|\n");
    for (auto bytes : sizes) {
      auto d = samples.get(fmt::format("dtrain/{}", bytes));
      auto r = samples.get(fmt::format("raw/{}", bytes));
      auto da = samples.get(fmt::format("dtrainavg/{}", bytes));
      auto ra = samples.get(fmt::format("rawavg/{}", bytes));
      fmt::print("| {} | {} | {} | {:.2f} | {} | {} | {:.2f} | {:.2f} |\n", bench::human_bytes(bytes),
                 bench::human_time(da.median), bench::human_time(d.median), da.median / d.median,
                 bench::human_time(ra.median), bench::human_time(r.median), da.median / ra.median,
                 da.median / r.median);
    }
  }
  dtrain::shutdown();
  return 0;
}
