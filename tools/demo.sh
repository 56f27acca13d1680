#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine and runs the main demo: the ResNet example trained on
# Fashion-MNIST by 2 ranks with dtrain (a few minutes on two CPU cores).
#
#   tools/demo.sh [extra trainer flags...]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${DTRAIN_BUILD_DIR:-$root/build}

"$root/tools/install-deps.sh" --torch
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DDTRAIN_MPI=mpich
cmake --build "$build" -j "$(nproc)" --target resnet_train
mpiexec.mpich -n 2 "$build/examples/resnet/resnet_train" "$@"
