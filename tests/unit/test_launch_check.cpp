// Note [One-rank worlds under srun] (runtime/engine/launch_check.hpp).
#include "dtrain/runtime/engine/launch_check.hpp"

#include <doctest/doctest.h>

#include <string>

using dtrain::detail::MapEnv;
using dtrain::detail::srun_without_pmi;

TEST_CASE("a one-rank world in a step of several srun tasks is refused, naming the fix") {
  const MapEnv env{{"SLURM_STEP_ID", "0"}, {"SLURM_STEP_NUM_TASKS", "4"}, {"SLURM_PROCID", "2"}};
  const auto why = srun_without_pmi(1, env);
  REQUIRE(why);
  CHECK(why->find("task 2 of 4 (SLURM_STEP_NUM_TASKS=4)") != std::string::npos);
  CHECK(why->find("no process manager interface") != std::string::npos);
  CHECK(why->find("`srun --mpi=pmi2 -n 4 ...`") != std::string::npos);
  MapEnv with_type = env;
  with_type.set("SLURM_MPI_TYPE", "pmix");
  CHECK(srun_without_pmi(1, with_type)->find("--mpi=pmix, which this MPI cannot use") !=
        std::string::npos);
}

TEST_CASE("worlds that match their launch pass") {
  const MapEnv step{{"SLURM_STEP_ID", "0"}, {"SLURM_STEP_NUM_TASKS", "4"}};
  CHECK_FALSE(srun_without_pmi(4, step));                      // srun with a PMI
  CHECK_FALSE(srun_without_pmi(1, MapEnv{}));                  // no SLURM at all
  CHECK_FALSE(srun_without_pmi(1, MapEnv{{"SLURM_STEP_ID", "0"}, {"SLURM_STEP_NUM_TASKS", "1"}}));
  CHECK_FALSE(srun_without_pmi(1, MapEnv{{"SLURM_STEP_NUM_TASKS", "4"}}));  // in a batch script
  // An MPI launcher inside the step started a one-rank job on purpose.
  MapEnv mpiexec_one = step;
  mpiexec_one.set("PMI_SIZE", "1");
  CHECK_FALSE(srun_without_pmi(1, mpiexec_one));
  MapEnv mpirun_one = step;
  mpirun_one.set("OMPI_COMM_WORLD_SIZE", "1");
  CHECK_FALSE(srun_without_pmi(1, mpirun_one));
  // A garbled count is no evidence of several tasks.
  CHECK_FALSE(srun_without_pmi(1, MapEnv{{"SLURM_STEP_ID", "0"}, {"SLURM_STEP_NUM_TASKS", "4x"}}));
}
