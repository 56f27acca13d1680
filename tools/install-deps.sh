#!/usr/bin/env bash
# Installs what dtrain needs to build and test on Debian 12 (bookworm), skipping every package
# that is already installed. Safe to run again: with nothing missing it changes nothing (not even
# the apt package lists).
#
#   tools/install-deps.sh [--torch] [--browser] [--openmpi] [--slurm] [--dry-run]
#
# Runs as root, or through sudo when started by another user.
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: tools/install-deps.sh [--torch] [--browser] [--openmpi] [--slurm] [--dry-run]

Installs with apt what dtrain needs and is not installed yet:
  always      build-essential cmake pkg-config mpich libmpich-dev libfmt-dev doctest-dev python3
              nlohmann-json3-dev (the tests read JSON with it; dtrain itself does not need it)
              iproute2 (the launcher's two-host test across network namespaces)
              libgloo-dev (the Gloo host path, DTRAIN_CPU_OPERATIONS=gloo)
              libcli11-dev (the example trainers' command lines)
  --torch     python3-venv dataset-fashion-mnist zlib1g-dev libstb-dev
              (the libtorch integration, its tests, the Fashion-MNIST and Mask R-CNN examples;
              libtorch itself comes from PyPI's torch wheel, installed by tools/setup-libtorch.sh
              into a virtual environment of the project, never the system Python)
  --browser   chromium (the test that opens a dtrain-report page in a headless browser)
  --openmpi   openmpi-bin libopenmpi-dev (to build and test against Open MPI as well)
  --slurm     slurmctld slurmd slurm-client munge (the tests that run jobs through a private
              SLURM cluster, tests/slurm; installing them starts no daemon)
  --dry-run   only print what would be installed

MPICH stays the default MPI: if installing Open MPI moves the mpicc/mpicxx/mpiexec
alternatives, they are set back to what they were. Build against Open MPI with
-DDTRAIN_MPI=openmpi.
EOF
}

base_packages=(build-essential cmake pkg-config mpich libmpich-dev libfmt-dev doctest-dev python3
  nlohmann-json3-dev iproute2 libgloo-dev libcli11-dev)
torch_packages=(python3-venv dataset-fashion-mnist zlib1g-dev libstb-dev)
browser_packages=(chromium)
openmpi_packages=(openmpi-bin libopenmpi-dev)
slurm_packages=(slurmctld slurmd slurm-client munge)

with_torch=0
with_browser=0
with_openmpi=0
with_slurm=0
dry_run=0
for arg in "$@"; do
  case "$arg" in
    --torch) with_torch=1 ;;
    --browser) with_browser=1 ;;
    --openmpi) with_openmpi=1 ;;
    --slurm) with_slurm=1 ;;
    --dry-run) dry_run=1 ;;
    -h | --help)
      usage
      exit 0
      ;;
    *)
      echo "install-deps.sh: unknown option '$arg'" >&2
      usage >&2
      exit 2
      ;;
  esac
done

for tool in apt-get dpkg-query; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "install-deps.sh: '$tool' not found; this script is for Debian 12 (bookworm)." >&2
    exit 1
  fi
done

is_installed() {
  local status
  # ${Status} is a dpkg-query format field, not a shell expansion.
  # shellcheck disable=SC2016
  status=$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null) || return 1
  [[ "$status" == *" ok installed" ]]  # "install ok installed", or "hold ok installed"
}

# Prints the packages among "$@" that are not installed, one per line.
missing_of() {
  local package
  for package in "$@"; do
    if ! is_installed "$package"; then
      echo "$package"
    fi
  done
}

wanted=("${base_packages[@]}")
if ((with_torch)); then
  wanted+=("${torch_packages[@]}")
fi
if ((with_browser)); then
  wanted+=("${browser_packages[@]}")
fi
mapfile -t missing < <(missing_of "${wanted[@]}")
missing_openmpi=()
if ((with_openmpi)); then
  mapfile -t missing_openmpi < <(missing_of "${openmpi_packages[@]}")
fi
missing_slurm=()
if ((with_slurm)); then
  mapfile -t missing_slurm < <(missing_of "${slurm_packages[@]}")
fi

all_missing=("${missing[@]}" "${missing_openmpi[@]}" "${missing_slurm[@]}")
if ((${#all_missing[@]} == 0)); then
  echo "install-deps.sh: all required packages are already installed; nothing to do."
  exit 0
fi
if ((dry_run)); then
  echo "install-deps.sh: would install: ${all_missing[*]}"
  exit 0
fi

as_root=()
if ((EUID != 0)); then
  if ! command -v sudo >/dev/null 2>&1; then
    echo "install-deps.sh: must install ${all_missing[*]} but is not root and sudo is not" \
      "available; run it as root." >&2
    exit 1
  fi
  as_root=(sudo)
fi
# `env` rather than a sudo VAR=value argument, which sudo's policy may refuse.
run_as_root() {
  ${as_root[@]+"${as_root[@]}"} env DEBIAN_FRONTEND=noninteractive "$@"
}

apt_install() {
  echo "install-deps.sh: installing: $*"
  run_as_root apt-get install -y --no-install-recommends "$@"
}

run_as_root apt-get update
if ((${#missing[@]} > 0)); then
  apt_install "${missing[@]}"
fi

if ((${#missing_openmpi[@]} > 0)); then
  # Debian's Open MPI packages register the mpi/mpirun alternatives with a higher priority than
  # MPICH's, so installing them silently turns /usr/bin/mpicxx and mpiexec into Open MPI. Record
  # the selections first and put back any that the installation moved.
  declare -A before=()
  if command -v update-alternatives >/dev/null 2>&1; then
    while read -r name _ value; do
      if [[ "$name" == mpi* ]]; then
        before[$name]=$value
      fi
    done < <(update-alternatives --get-selections)
  fi
  apt_install "${missing_openmpi[@]}"
  if command -v update-alternatives >/dev/null 2>&1; then
    while read -r name _ value; do
      if [[ -n "${before[$name]+set}" && "${before[$name]}" != "$value" ]]; then
        echo "install-deps.sh: keeping alternative '$name' at ${before[$name]}" \
          "(installing Open MPI had moved it to $value)"
        run_as_root update-alternatives --set "$name" "${before[$name]}"
      fi
    done < <(update-alternatives --get-selections)
  fi
fi

if ((${#missing_slurm[@]} > 0)); then
  # munge's postinst starts the machine's munged (with a key it makes in /etc/munge), and
  # slurmctld's and slurmd's would start theirs once /etc/slurm/slurm.conf exists: the tests run
  # a private cluster with its own key, socket and configuration, and want none of them. A
  # policy-rc.d that says 101 makes invoke-rc.d (and deb-systemd-invoke) start nothing; one the
  # machine already has (as container images do) is left as it is.
  policy=/usr/sbin/policy-rc.d
  if [[ -e "$policy" ]]; then
    apt_install "${missing_slurm[@]}"
  else
    run_as_root sh -c "printf '#!/bin/sh\nexit 101\n' > $policy && chmod 755 $policy"
    trap 'run_as_root rm -f "$policy"' EXIT
    apt_install "${missing_slurm[@]}"
    run_as_root rm -f "$policy"
    trap - EXIT
  fi
fi

echo "install-deps.sh: done."
