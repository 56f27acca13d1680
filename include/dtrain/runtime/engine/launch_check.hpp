#pragma once
// Note [One-rank worlds under srun]
// `srun -n 2 ./train` starts two processes; whether they form one MPI job depends on a process
// manager interface the MPI library speaks (srun --mpi=pmi2 for MPICH; Debian's srun defaults to
// --mpi=none). Without one, MPI_Init in each task finds no job to join and makes a one-rank world:
// two copies train alone on the same data, each believing it is the whole job, and nothing ever
// fails. SLURM knows better: each task has SLURM_STEP_NUM_TASKS and SLURM_PROCID. So a world of
// one rank in a step of several tasks is refused at init(), with the fix, unless an MPI launcher
// started this process as a one-rank job of its own (PMI_SIZE or OMPI_COMM_WORLD_SIZE say 1:
// `mpiexec -n 1` inside a larger step).
#include <charconv>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "dtrain/core/env.hpp"

namespace dtrain::detail {

// The error when SLURM started this process as one of several tasks but MPI made a one-rank world
// of it; nothing when they agree.
inline std::optional<std::string> srun_without_pmi(int world_size, const EnvSource& env) {
  const auto number = [&](const char* name) -> long {
    const auto text = env.get(name);
    long value = -1;
    if (!text || text->empty()) return -1;
    const auto [end, ec] = std::from_chars(text->data(), text->data() + text->size(), value);
    return ec == std::errc() && end == text->data() + text->size() ? value : -1;
  };
  const long tasks = number("SLURM_STEP_NUM_TASKS");
  if (world_size != 1 || tasks <= 1 || !env.get("SLURM_STEP_ID")) return std::nullopt;
  if (env.get("PMI_SIZE") == "1" || env.get("OMPI_COMM_WORLD_SIZE") == "1") return std::nullopt;
  const auto task = env.get("SLURM_PROCID");
  const auto given = env.get("SLURM_MPI_TYPE");
  return fmt::format(
      "dtrain::init(): srun started this program as task {} of {} (SLURM_STEP_NUM_TASKS={}), "
      "but MPI sees a job of 1 rank: srun gave the tasks {}, so each task would train alone. "
      "Start it with `srun --mpi=pmi2 -n {} ...` (MPICH; Open MPI: --mpi=pmix), or run "
      "dtrainrun once in the batch script or salloc, which starts the ranks itself",
      task.value_or("?"), tasks, tasks,
      given ? fmt::format("--mpi={}, which this MPI cannot use", *given)
            : std::string("no process manager interface"),
      tasks);
}

}  // namespace dtrain::detail
