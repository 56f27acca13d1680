#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine and runs the main demo: the framework-free example trainer
# (examples/plain) distributed over 2 ranks with dtrain — sharded data, parameters broadcast from
# rank 0, gradients averaged by DistributedOptimizer, metrics averaged across ranks.
#
#   tools/demo.sh [extra trainer flags...]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${DTRAIN_BUILD_DIR:-$root/build}

"$root/tools/install-deps.sh"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DDTRAIN_MPI=mpich
cmake --build "$build" -j "$(nproc)" --target plain_train
mpiexec.mpich -n 2 "$build/examples/plain/plain_train" "$@"
