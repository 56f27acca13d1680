#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine and runs the main demo: the libtorch ResNet trainer
# (examples/resnet) on Fashion-MNIST, distributed over 2 ranks with dtrain — each rank trains on its
# half of every epoch, parameters are broadcast from rank 0, gradients averaged every step, metrics
# averaged across ranks. A few minutes on two CPU cores.
#
#   tools/demo.sh [extra trainer flags...]      (see: build/examples/resnet/resnet_train --help)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${DTRAIN_BUILD_DIR:-$root/build}

"$root/tools/install-deps.sh" --torch
torch_prefix=$("$root/tools/setup-libtorch.sh")  # PyPI's torch wheel in .venv/: libtorch for C++
# Settings of this script, not of dtrain: the ranks would warn about them.
unset DTRAIN_TORCH_VENV DTRAIN_BUILD_DIR
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DDTRAIN_MPI=mpich \
  -DCMAKE_PREFIX_PATH="$torch_prefix" -DDTRAIN_REQUIRE_TORCH=ON
cmake --build "$build" -j "$(nproc)" --target resnet_train
mpiexec.mpich -n 2 "$build/examples/resnet/resnet_train" --model resnet8 --epochs 3 --batch-size 64 "$@"
