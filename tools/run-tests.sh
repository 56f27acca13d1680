#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine and runs every dtrain test: installs the missing apt packages
# and the tested libtorch (PyPI's torch wheel, into .venv/), configures against MPICH and that
# libtorch, builds, runs ctest. A libtorch that cannot be used fails the configure: the libtorch
# tests are never skipped here.
#
#   tools/run-tests.sh            (build directory: build/, or $DTRAIN_BUILD_DIR)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${DTRAIN_BUILD_DIR:-$root/build}
jobs=$(nproc)

"$root/tools/install-deps.sh" --torch --browser
torch_prefix=$("$root/tools/setup-libtorch.sh")

# MPICH is the reference MPI; pin it by its suffixed wrappers so an Open MPI installed next to it
# cannot sneak into the build or the test launcher.
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDTRAIN_MPI=mpich \
  -DCMAKE_PREFIX_PATH="$torch_prefix" -DDTRAIN_REQUIRE_TORCH=ON
cmake --build "$build" -j "$jobs"
cd "$build"
ctest --output-on-failure -j "$jobs"
