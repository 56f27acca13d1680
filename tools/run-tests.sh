#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine and runs every dtrain test: installs the missing apt packages
# and the tested libtorch (PyPI's torch wheel, into .venv/), configures against MPICH and that
# libtorch, builds, runs ctest. A libtorch that cannot be used fails the configure: the libtorch
# tests are never skipped here, nor are the tests of what it installs (Chromium, pycocotools, and
# as root SLURM and network namespaces). Then the Open MPI configuration (tools/run-openmpi-tests.sh): a
# second build against Open MPI and its multi-process subset, in <build>-openmpi.
#
#   tools/run-tests.sh            (build directory: build/, or $DTRAIN_BUILD_DIR)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${DTRAIN_BUILD_DIR:-$root/build}
jobs=$(nproc)

# --slurm: the tests of tests/slurm run dtrain jobs through a private SLURM cluster.
"$root/tools/install-deps.sh" --torch --browser --slurm --openmpi
torch_prefix=$("$root/tools/setup-libtorch.sh")
# pycocotools, for the test that scores the Mask R-CNN example's output with the reference COCO API.
venv=${DTRAIN_TORCH_VENV:-$root/.venv}
# Read by the set-up scripts only: the tests' dtrain programs would warn about an unknown DTRAIN_ name.
unset DTRAIN_TORCH_VENV DTRAIN_BUILD_DIR
"$venv/bin/python" -c 'import pycocotools' 2>/dev/null ||
  "$venv/bin/python" -m pip install --progress-bar off pycocotools >&2

# What this command installs, its tests must use: a test that cannot is a failure, never a skip.
# Chromium (--browser) and pycocotools always; SLURM (--slurm) and network namespaces (iproute2)
# need root as well, so they are required where the tests run as root.
as_root=OFF
if ((EUID == 0)); then
  as_root=ON
fi

# MPICH is the reference MPI; pin it by its suffixed wrappers so an Open MPI installed next to it
# cannot sneak into the build or the test launcher. -g1: line tables, enough for a failing test's
# backtrace; full debug information makes every compile (the packaging tests' too) a third slower.
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" -DDTRAIN_MPI=mpich -DDTRAIN_WITH_GLOO=ON \
  -DCMAKE_PREFIX_PATH="$torch_prefix" -DDTRAIN_REQUIRE_TORCH=ON -DMASK_RCNN_PYTHON="$venv/bin/python" \
  -DDTRAIN_TEST_REQUIRE_BROWSER=ON -DDTRAIN_TEST_REQUIRE_PYCOCOTOOLS=ON \
  -DDTRAIN_TEST_REQUIRE_SLURM="$as_root" \
  -DDTRAIN_TEST_REQUIRE_NETNS="$as_root"
cmake --build "$build" -j "$jobs"
status=0
(cd "$build" && ctest --output-on-failure -j "$jobs") || status=$?
DTRAIN_OPENMPI_BUILD_DIR="$build-openmpi" "$root/tools/run-openmpi-tests.sh" || status=$?
exit "$status"
