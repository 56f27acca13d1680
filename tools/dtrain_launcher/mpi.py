"""Which MPI launcher starts the job, and the command line for it.

Note [Which MPI launches]
A program built against MPICH must be started by MPICH's launcher (Hydra) and one built against
Open MPI by mpirun from the same Open MPI: the other one starts N singletons that never meet. On
Debian both may be installed, and the unsuffixed `mpiexec` is an alternative that can point at
either. So dtrainrun first decides which MPI the program needs, and only then its launcher:
  1. the MPI library the program links (ldd), when the program is a dynamic executable: nothing
     overrides this, since any other launcher would start singletons (--mpi saying otherwise is
     refused);
  2. --mpi FLAVOUR, for a program whose MPI ldd cannot see (a script, a static program);
  3. the MPI dtrain was built with (build.json, written by the build and the install);
  4. the only flavour whose launcher is installed.
The launcher is --launcher PATH, or the first of that flavour's launchers (by their suffixed
names, then mpiexec and mpirun) whose `--version` says it is of that flavour. A --launcher of the
other flavour is refused, as is a job for which no launcher of its flavour exists; the message
says which launchers were found, what they are, and how to choose (--launcher, --mpi).
A program that links the other MPI than the one dtrain was built with was built with another
dtrain; it still gets its own MPI's launcher (--check-build notes it).
"""
from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from .errors import UsageError
from .hosts import Host

FLAVORS = ("mpich", "openmpi")
_CANDIDATES = {
    "mpich": ("mpiexec.mpich", "mpiexec.hydra", "mpirun.mpich", "mpiexec", "mpirun"),
    "openmpi": ("mpirun.openmpi", "mpiexec.openmpi", "mpirun", "mpiexec"),
}
_FLAVOR_NAMES = {"mpich": "MPICH (Hydra)", "openmpi": "Open MPI"}
_MPI_NAMES = {"mpich": "MPICH", "openmpi": "Open MPI"}

# Variables that exist only for dtrainrun itself and are not passed to the ranks (dtrain would
# warn about DTRAIN_ names that are not settings).
LAUNCHER_ONLY_VARIABLES = ("DTRAIN_HOSTS", "DTRAIN_CURRENT_HOST")
# Variables that dtrainrun sets for the ranks of an elastic job (Note [Elastic notification
# protocol] in elastic_notify.py). Values in dtrainrun's own environment (a dtrainrun started by a
# rank of another elastic job) would point the ranks at that job's launcher, so they are dropped.
ELASTIC_VARIABLES = ("DTRAIN_ELASTIC", "DTRAIN_ELASTIC_NOTIFY", "DTRAIN_ELASTIC_GENERATION")
# Note [Job identity]
# Every rank of a job that dtrainrun starts gets DTRAINRUN_JOB_ID, the same for all ranks of
# every world of one dtrainrun invocation and different for every invocation (its start time in
# UTC, its process id and 32 random bits), and DTRAINRUN_ATTEMPT, which launch of that job this
# is: 0 for the first world, one more for each relaunch (a --restarts restart; in elastic mode a
# restart or a resize, where it equals DTRAIN_ELASTIC_GENERATION). A program tells its own state
# from that of an earlier job with the id (elastic commits do), and keeps per-launch output apart
# with both. Values inherited from dtrainrun's own environment (a dtrainrun started by a rank of
# another job) are replaced, never passed on. Where srun starts each rank as a dtrainrun task of
# its own (slurm.py), the tasks agree on "slurm-<job id>.<step id>" instead, attempt 0.
JOB_ID_VARIABLE = "DTRAINRUN_JOB_ID"
ATTEMPT_VARIABLE = "DTRAINRUN_ATTEMPT"
# Always passed to the ranks, besides -x names: settings (DTRAIN_*, HOROVOD_*), dtrainrun's own
# (DTRAINRUN_*), and what finds programs and libraries on the other hosts.
FORWARDED_PREFIXES = ("DTRAIN_", "HOROVOD_", "DTRAINRUN_")
FORWARDED_NAMES = ("PATH", "LD_LIBRARY_PATH")


@dataclass
class Launcher:
    flavor: str
    path: str
    version: str  # the line of `--version` that names the MPI
    reason: str   # why this flavour: shown by --verbose and --check-build

    def describe(self) -> str:
        return f"{_FLAVOR_NAMES[self.flavor]} launcher {self.path} ({self.version})"


Runner = Callable[[Sequence[str]], Tuple[int, str]]


def run_quietly(argv: Sequence[str]) -> Tuple[int, str]:
    try:
        done = subprocess.run(list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return 127, str(e)
    return done.returncode, done.stdout.decode("utf-8", "replace")


def flavor_of_launcher(path: str, run: Runner = run_quietly) -> Tuple[Optional[str], str]:
    """(flavour, version) from `path --version`; flavour None when it is neither. The version
    names Open MPI's runtime: ORTE up to Open MPI 4, PRRTE from 5."""
    _, text = run([path, "--version"])
    if "HYDRA" in text:
        m = re.search(r"Version:\s*(\S+)", text)
        return "mpich", f"HYDRA {m.group(1)}" if m else "HYDRA"
    m = re.search(r"^.*\((Open MPI|OpenRTE|PRRTE)\)\s*(\S+).*$", text, re.MULTILINE)
    if m:
        kind, version = m.group(1), m.group(2)
        if kind == "PRRTE":
            return "openmpi", f"PRRTE {version}"
        major = re.match(r"[0-9]+", version)
        runtime = "PRRTE" if major and int(major.group(0)) >= 5 else "ORTE"
        return "openmpi", f"Open MPI {version}, {runtime}"
    first = text.strip().splitlines()[0] if text.strip() else "no output"
    return None, first


def flavor_of_program(program: str, run: Runner = run_quietly) -> Tuple[Optional[str], str]:
    """The MPI the program links, from ldd: (flavour, the library that says so)."""
    if shutil.which("ldd") is None:
        return None, "ldd is not available"
    rc, text = run(["ldd", program])
    if rc != 0:
        return None, "not a dynamic executable"
    for line in text.splitlines():
        line = line.strip()
        library = line.split()[0] if line else ""
        if library.startswith("libmpich"):
            return "mpich", library
        if library.startswith(("libopen-pal", "libopen-rte")) or (
                library.startswith("libmpi.so") and "openmpi" in line):
            return "openmpi", library
    return None, "links no MPI library"


def read_build_config(path: Optional[str]) -> Optional[Dict[str, object]]:
    if not path or not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def needed_flavor(program: Optional[str], mpi: Optional[str],
                  build_config: Optional[Mapping[str, object]],
                  run: Runner = run_quietly) -> Tuple[Optional[str], str]:
    """The MPI the program needs and why (steps 1-3 of Note [Which MPI launches]), or
    (None, '') when nothing tells. Raises UsageError when --mpi contradicts the program."""
    built = build_config.get("mpi_flavor") if build_config else None
    built = built if built in FLAVORS else None
    linked, evidence = flavor_of_program(program, run) if program else (None, "")
    if linked is not None and mpi is not None and mpi != linked:
        raise UsageError(f"dtrain: --mpi {mpi}, but the program links {evidence} "
                         f"({_MPI_NAMES[linked]}); {_SINGLETONS}; drop --mpi")
    if linked is not None:
        return linked, f"the program links {evidence}"
    if mpi is not None:
        return mpi, "given with --mpi"
    if built is not None:
        return built, "the MPI dtrain was built with"
    return None, ""


def choose(program: Optional[str], mpi: Optional[str], launcher: Optional[str],
           build_config: Optional[Mapping[str, object]], run: Runner = run_quietly,
           which: Callable[[str], Optional[str]] = shutil.which) -> Launcher:
    """See Note [Which MPI launches]. Raises UsageError when the launcher would not fit the
    program or no fitting launcher exists."""
    needed, reason = needed_flavor(program, mpi, build_config, run)

    if launcher is not None:
        path = which(launcher) if os.sep not in launcher else launcher
        if path is None or not os.access(path, os.X_OK):
            raise UsageError(f"dtrain: --launcher {launcher}: not an executable program")
        flavor, version = flavor_of_launcher(path, run)
        if flavor is None:
            raise UsageError(f"dtrain: --launcher {launcher}: `{launcher} --version` names neither "
                             f"MPICH's Hydra nor Open MPI ({version})")
        if needed is not None and flavor != needed:
            raise UsageError(
                f"dtrain: --launcher {launcher} is {_MPI_NAMES[flavor]}'s launcher ({version}), "
                f"but the job needs {_MPI_NAMES[needed]}'s ({reason}); {_SINGLETONS}. "
                + _how_to_choose(needed, flavor, reason, build_config, run, which))
        return Launcher(flavor, path, version, "given with --launcher"
                        + (f"; it fits: {reason}" if needed is not None else ""))

    if needed is None:
        found = [f for f in FLAVORS if _find_launcher(f, None, run, which)[0][0] is not None]
        if len(found) != 1:
            raise UsageError(
                "dtrain: cannot tell which MPI to launch with: "
                + ("no MPICH or Open MPI launcher is installed" if not found else
                   "both MPICH and Open MPI are installed") + "; pass --mpi mpich|openmpi")
        needed, reason = found[0], "the only MPI installed"
    built = build_config.get("mpi_flavor") if build_config else None
    preferred = build_config.get("mpiexec") if build_config and built == needed else None
    (path, version), others = _find_launcher(needed, preferred, run, which)
    if path is None:
        seen = "; ".join(f"{p} is {_MPI_NAMES[f]}'s ({v})" if f else
                         f"{p} is no MPI launcher ({v})" for p, f, v in others)
        raise UsageError(
            f"dtrain: the job needs {_MPI_NAMES[needed]}'s launcher ({reason}), but "
            + (f"the launchers found are not: {seen}" if others else
               f"none of {', '.join(_CANDIDATES[needed])} is on PATH")
            + f". Install {_MPI_NAMES[needed]}'s launcher, or name it with --launcher PATH"
            + _if_program_uses_other(needed, reason))
    return Launcher(needed, path, version, reason)


_SINGLETONS = "a launcher of another MPI starts each rank as a separate one-rank job"


def _if_program_uses_other(needed: str, reason: str) -> str:
    """When the MPI was only assumed (from --mpi or the build), the way to say otherwise."""
    if reason.startswith("the program links"):
        return ""
    other = next(f for f in FLAVORS if f != needed)
    return (f"; if the program uses {_MPI_NAMES[other]} (ldd cannot tell for a script or a "
            f"static program), pass --mpi {other}")


def _how_to_choose(needed: str, given: str, reason: str,
                   build_config: Optional[Mapping[str, object]], run: Runner,
                   which: Callable[[str], Optional[str]]) -> str:
    built = build_config.get("mpi_flavor") if build_config else None
    preferred = build_config.get("mpiexec") if build_config and built == needed else None
    path, _ = _find_launcher(needed, preferred, run, which)[0]
    advice = (f"Leave --launcher out to use {path}, or pass that MPI's launcher" if path else
              f"Pass {_MPI_NAMES[needed]}'s launcher")
    if reason.startswith("the program links"):
        return advice + " with --launcher"
    return (advice + f" with --launcher; if the program uses {_MPI_NAMES[given]} (ldd cannot "
            f"tell for a script or a static program), say so with --mpi {given}")


def _find_launcher(flavor: str, preferred: Optional[object], run: Runner,
                   which: Callable[[str], Optional[str]]
                   ) -> Tuple[Tuple[Optional[str], str], List[Tuple[str, Optional[str], str]]]:
    """((path, version) of the first launcher of `flavor`, or (None, "")), and the launchers
    looked at before it that were not: (path, their flavour or None, version)."""
    candidates: List[str] = []
    if isinstance(preferred, str) and preferred:
        candidates.append(preferred)
    for name in _CANDIDATES[flavor]:
        path = which(name)
        if path is not None and path not in candidates:
            candidates.append(path)
    others: List[Tuple[str, Optional[str], str]] = []
    for path in candidates:
        if not os.access(path, os.X_OK):
            continue
        got, version = flavor_of_launcher(path, run)
        if got == flavor:
            return (path, version), others
        others.append((path, got, version))
    return (None, ""), others


def new_job_id() -> str:
    """An id no other dtrainrun invocation has: its start time, its process id and random bits
    (Note [Job identity]). Letters, digits and '-' only, so it fits a file name."""
    return (f"{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{os.getpid()}-"
            f"{secrets.token_hex(4)}")


def launch_environment(base: Mapping[str, str], assignments: Sequence[Tuple[str, Optional[str]]],
                       restart_count: int, job_id: Optional[str] = None,
                       attempt: int = 0) -> Dict[str, str]:
    """The environment the MPI launcher starts with; what the ranks see comes from it.
    `job_id` and `attempt` become DTRAINRUN_JOB_ID and DTRAINRUN_ATTEMPT (Note [Job identity]);
    without a job id (a check of the -x names only) neither is set."""
    env = {k: v for k, v in base.items()
           if k not in LAUNCHER_ONLY_VARIABLES and k not in ELASTIC_VARIABLES
           and k not in (JOB_ID_VARIABLE, ATTEMPT_VARIABLE)}
    if base.get("SLURM_STEP_ID") and base.get("SLURM_JOB_ID"):
        # dtrainrun runs in a job step (srun -n 1 dtrainrun -H ...), which holds the CPUs that
        # the launcher's own srun step needs; without overlapping it, that step waits forever.
        env["SLURM_OVERLAP"] = "1"
    for name, value in assignments:
        if value is not None:
            env[name] = value
        elif name not in env:
            raise UsageError(f"dtrain: -x {name}: {name} is not set here; give it a value with "
                             f"-x {name}=VALUE")
    env["DTRAINRUN_RESTART_COUNT"] = str(restart_count)
    if job_id is not None:
        env[JOB_ID_VARIABLE] = job_id
        env[ATTEMPT_VARIABLE] = str(attempt)
    return env


def forwarded_names(env: Mapping[str, str],
                    assignments: Sequence[Tuple[str, Optional[str]]]) -> List[str]:
    names = {k for k in env if k.startswith(FORWARDED_PREFIXES) or k in FORWARDED_NAMES}
    names.update(name for name, _ in assignments)
    return sorted(names)


def command(launcher: Launcher, layout: Sequence[Host], rank_command: Sequence[str],
            env: Mapping[str, str], assignments: Sequence[Tuple[str, Optional[str]]],
            agent: Optional[str], as_root: bool, bootstrap: Optional[str] = None) -> List[str]:
    """The launcher's command line for `layout` (hosts with their rank counts, in rank order).
    `bootstrap`: how Hydra reaches the hosts, 'slurm' or 'ssh' (slurm.bootstrap()); None leaves
    it to Hydra. An agent overrides it."""
    np = sum(h.slots for h in layout)
    hosts = ",".join(f"{h.name}:{h.slots}" for h in layout)
    if launcher.flavor == "mpich":
        # -genvall is Hydra's default, stated so that HYDRA_ENV cannot turn it off: every rank,
        # on every host, gets the launcher's environment, which holds the -x values.
        argv = [launcher.path, "-genvall", "-hosts", hosts, "-n", str(np)]
        if agent:
            # rsh calls the agent as `agent host command...`, like Open MPI's plm_rsh_agent.
            argv += ["-launcher", "rsh", "-launcher-exec", agent]
        elif bootstrap:
            # Stated, not left to Hydra's guess, which HYDRA_LAUNCHER or a site's Hydra
            # configuration can change (Note [dtrainrun in a SLURM job] in slurm.py).
            argv += ["-launcher", bootstrap]
    else:
        # Open MPI passes only the variables named with -x. Slot mapping and no binding match
        # Hydra's placement (rank r on the host whose slots hold r) and its default of no binding.
        argv = [launcher.path, "-np", str(np), "-H", hosts, "--map-by", "slot",
                "--bind-to", "none"]
        if as_root:
            argv.append("--allow-run-as-root")
        for name in forwarded_names(env, assignments):
            argv += ["-x", name]
        if agent:
            argv += ["--mca", "plm_rsh_agent", agent]
    return argv + list(rank_command)
