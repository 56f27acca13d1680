"""Helpers shared by the launcher's tests: where dtrainrun and the test programs are, running
dtrainrun, and a clean environment for it."""
import json
import os
import resource
import shutil
import socket
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PROGRAMS = os.path.join(HERE, "programs")
# The build tree's dtrainrun (the installed layout); ctest sets DTRAINRUN.
DTRAINRUN = os.environ.get("DTRAINRUN", os.path.join(HERE, "..", "..", "tools", "dtrainrun"))


def program(name):
    return os.path.join(PROGRAMS, name)


def clean_env(**extra):
    """This environment without variables that would change what dtrainrun does (a SLURM
    allocation, cluster host lists, dtrain settings), plus `extra`."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "SM_", "DTRAIN_", "HOROVOD_", "DTRAINRUN_"))}
    env.update(extra)
    return env


# Where a test feeds dtrainrun a count that once made it grow without bound, the process gets
# this much address space: a regression then fails with a MemoryError instead of taking the
# machine's memory.
MEMORY_BOUND_BYTES = 4 << 30


def bound_memory():
    """Limits this process (and what it starts) to MEMORY_BOUND_BYTES of address space."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY or soft > MEMORY_BOUND_BYTES:
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BOUND_BYTES, hard))


def dtrainrun(*args, env=None, timeout=120, stdin=subprocess.DEVNULL, bounded=False):
    """Runs dtrainrun; returns the CompletedProcess with text stdout and stderr. `bounded`: with
    bound_memory()."""
    return subprocess.run([DTRAINRUN, *args], env=clean_env() if env is None else env,
                          stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          timeout=timeout, check=False, text=True, errors="surrogateescape",
                          preexec_fn=bound_memory if bounded else None)


def built_mpi_flavor():
    """The MPI dtrainrun's build was configured with ("mpich" or "openmpi"), from its build.json."""
    entry = os.path.realpath(DTRAINRUN)
    build_json = os.path.join(os.path.dirname(os.path.dirname(entry)), "share", "dtrain",
                              "launcher", "build.json")
    with open(build_json) as f:
        return json.load(f)["mpi_flavor"]


def free_port():
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def package_path():
    """Makes `import dtrain_launcher` find the package dtrainrun runs with."""
    entry = os.path.realpath(DTRAINRUN)
    for root in (os.path.dirname(entry),
                 os.path.join(os.path.dirname(os.path.dirname(entry)), "share", "dtrain",
                              "launcher")):
        if os.path.isdir(os.path.join(root, "dtrain_launcher")):
            if root not in sys.path:
                sys.path.insert(0, root)
            return root
    raise RuntimeError(f"no dtrain_launcher package beside {entry}")


def make_install(root, build_config, build_info_output=None):
    """A dtrainrun laid out as installed under `root`, with `build_config` as its build.json and,
    given `build_info_output`, a dtrain-build-info that prints it. Returns the dtrainrun path."""
    package = package_path()
    os.makedirs(os.path.join(root, "bin"))
    launcher_dir = os.path.join(root, "share", "dtrain", "launcher")
    shutil.copytree(os.path.join(package, "dtrain_launcher"),
                    os.path.join(launcher_dir, "dtrain_launcher"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    with open(os.path.join(launcher_dir, "build.json"), "w") as f:
        json.dump(build_config, f)
    entry = os.path.join(root, "bin", "dtrainrun")
    shutil.copy(os.path.realpath(DTRAINRUN), entry)
    if build_info_output is not None:
        write_script(os.path.join(root, "bin", "dtrain-build-info"),
                     f"#!/bin/sh\nprintf '%s' '{build_info_output}'\n")
    return entry


def write_script(path, text):
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, 0o755)
    return path
