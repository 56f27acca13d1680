#!/usr/bin/env bash
# The Open MPI configuration of the test command: dtrain built against Open MPI
# (-DDTRAIN_MPI=openmpi, Debian's libopenmpi-dev) and the multi-process tests that exercise what
# differs between MPIs run under Open MPI's mpirun, on 2 and 3 ranks:
#   collectives, grouped collectives and error classes (tests/mpi), negotiation and process sets
#   (tests/engine), rank failures (tests/reliability), jobs through dtrainrun (tests/launcher), and
#   the add_subdirectory packaging consumer.
# The rest of the suite runs against MPICH only (tools/run-tests.sh): the subset keeps the whole
# test command inside its time budget on 2 cores. Needs tools/install-deps.sh --openmpi.
#
#   tools/run-openmpi-tests.sh     (build directory: build-openmpi/, or $DTRAIN_OPENMPI_BUILD_DIR)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${DTRAIN_OPENMPI_BUILD_DIR:-$root/build-openmpi}
jobs=$(nproc)
unset DTRAIN_OPENMPI_BUILD_DIR

targets=(mpi_allreduce_test mpi_collectives_test mpi_grouped_collectives_test mpi_errors_test
         engine_negotiation engine_process_sets reliability_faults
         launcher_topology_probe dtrain_build_info)
tests='^((mpi_allreduce_test|mpi_collectives_test|mpi_grouped_collectives_test|mpi_errors_test'
tests+='|engine_negotiation|engine_process_sets|reliability_faults)[.]np[23]'
tests+='|launcher_run|packaging[.]add_subdirectory)$'

# No libtorch, no device path and no debug information: this configuration is about the MPI.
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DDTRAIN_MPI=openmpi \
  -DDTRAIN_WITH_CUDA=OFF -DDTRAIN_BUILD_EXAMPLES=OFF -DDTRAIN_BUILD_BENCHMARKS=OFF
cmake --build "$build" -j "$jobs" --target "${targets[@]}"
cd "$build"
ctest --output-on-failure -j "$jobs" -R "$tests"
