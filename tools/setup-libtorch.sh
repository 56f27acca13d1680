#!/usr/bin/env bash
# Installs the libtorch dtrain is tested with -- PyPI's torch wheel, which carries libtorch's C++
# headers, libraries (CUDA-enabled), NCCL and CMake package -- into a virtual environment of the
# project (never the system Python), and prints the CMake prefix of that libtorch on stdout:
#
#   cmake -S . -B build -DCMAKE_PREFIX_PATH="$(tools/setup-libtorch.sh)"
#
#   tools/setup-libtorch.sh        (environment: .venv/ in the repository, or $DTRAIN_TORCH_VENV;
#                                   interpreter: python3, or $PYTHON)
#
# Safe to run again: an environment that already has this torch is left as it is. Needs python3
# with venv (Debian: python3-venv, which tools/install-deps.sh --torch installs); pip downloads about
# 4 GB the first time (torch and the NVIDIA libraries it loads) unless its cache has them.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${DTRAIN_TORCH_VENV:-$root/.venv}
python=${PYTHON:-python3}
# The tested version; docs/performance.md and the README name it too.
torch_version=2.15.0

log() { echo "setup-libtorch.sh: $*" >&2; }

has_torch() {
  "$venv/bin/python" -W ignore - "$torch_version" 2>/dev/null <<'EOF'
import sys
import torch
sys.exit(0 if torch.__version__.split("+")[0] == sys.argv[1] else 1)
EOF
}

if [[ ! -x $venv/bin/python ]]; then
  log "creating the virtual environment $venv"
  if ! "$python" -m venv "$venv"; then
    log "'$python -m venv' failed: install python3-venv (tools/install-deps.sh --torch) or set" \
      "PYTHON to an interpreter with venv"
    exit 1
  fi
fi
if ! has_torch; then
  log "installing torch==$torch_version into $venv"
  # Output goes to stderr: stdout carries only the prefix.
  "$venv/bin/python" -m pip install --progress-bar off "torch==$torch_version" >&2
  if ! has_torch; then
    log "torch $torch_version did not import from $venv after installing it"
    exit 1
  fi
fi
# -W ignore: torch warns on import that NumPy, which it does not need here, is missing.
"$venv/bin/python" -W ignore -c 'import torch; print(torch.utils.cmake_prefix_path)'
