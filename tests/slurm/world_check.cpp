// The check a dtrain program needs when srun starts it directly (`srun -n 2 ./train`), as a
// plain MPI program, so that the SLURM tests can show it working under a real srun.
//
// Without a process manager interface that the MPI library speaks (srun --mpi=pmi2 for MPICH;
// Debian's srun defaults to --mpi=none), MPI_Init in each task finds no job to join and starts
// a one-rank job: two tasks train alone, on the same data, each believing it is the whole job.
// SLURM knows better: each task has SLURM_STEP_NUM_TASKS (the step's task count) and
// SLURM_PROCID. A world of one rank in a step of several tasks is that mistake, unless an MPI
// launcher started this process as a one-rank job of its own (PMI_SIZE or
// OMPI_COMM_WORLD_SIZE say 1: mpiexec -n 1 inside a larger step). dtrain::init() needs the
// same test right after MPI is initialized, failing with this message (and finalizing MPI if it
// initialized it) before any collective: two "jobs" that each think they are whole never fail
// on their own.
//
//   world_check      prints {"rank", "size", "slurm_tasks", "slurm_task"} and exits 0; or
//                    prints the error on stderr and exits 3
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

// A whole decimal number, or -1.
long env_count(const char* name) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return -1;
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  return *end == '\0' && value >= 0 ? value : -1;
}

bool env_is(const char* name, const char* value) {
  const char* text = std::getenv(name);
  return text != nullptr && std::strcmp(text, value) == 0;
}

// The message when SLURM started this process as one of several tasks and MPI made a
// one-rank world of it; empty when the two agree.
std::string srun_without_pmi(int world_size) {
  const long tasks = env_count("SLURM_STEP_NUM_TASKS");
  if (world_size != 1 || tasks <= 1 || std::getenv("SLURM_STEP_ID") == nullptr) return "";
  if (env_is("PMI_SIZE", "1") || env_is("OMPI_COMM_WORLD_SIZE", "1")) return "";
  const char* task = std::getenv("SLURM_PROCID");
  const char* given = std::getenv("SLURM_MPI_TYPE");
  return "dtrain: srun started this program as task " + std::string(task ? task : "?") +
         " of " + std::to_string(tasks) + " (SLURM_STEP_NUM_TASKS=" + std::to_string(tasks) +
         "), but MPI sees a job of 1 rank: srun gave the tasks " +
         (given ? "--mpi=" + std::string(given) + ", which this MPI cannot use"
                : std::string("no process manager interface")) +
         ", so each task would train alone. Start it with `srun --mpi=pmi2 -n " +
         std::to_string(tasks) + " ...` (MPICH; Open MPI: --mpi=pmix), or run dtrainrun once "
         "in the batch script or salloc, which starts the ranks itself";
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const std::string error = srun_without_pmi(size);
  if (!error.empty()) {
    std::fprintf(stderr, "%s\n", error.c_str());
    MPI_Finalize();
    return 3;
  }
  std::printf("{\"rank\": %d, \"size\": %d, \"slurm_tasks\": %ld, \"slurm_task\": %ld}\n", rank,
              size, env_count("SLURM_STEP_NUM_TASKS"), env_count("SLURM_PROCID"));
  MPI_Finalize();
  return 0;
}
