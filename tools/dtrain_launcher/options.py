"""The command line: parsed by hand so that every mistake gets its own 'dtrain:' message and the
program's own arguments pass through untouched."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

from .errors import (EXIT_LEADER_LOST, EXIT_NOT_STARTED, EXIT_RESTARTS_EXHAUSTED, EXIT_USAGE,
                     UsageError)
from .hosts import Host, parse_host_list
from .limits import MAX_RANKS, MAX_RANKS_WHY, MAX_RESTARTS, parse_count, whole_number

DEFAULT_CLUSTER_PORT = 29517
DEFAULT_CLUSTER_TIMEOUT_S = 300.0
DEFAULT_START_TIMEOUT_S = 120.0

USAGE = "usage: dtrainrun [options] [--] program [args...]"

HELP = f"""{USAGE}

Starts `program` as the ranks of one dtrain job through the MPI launcher the program was built
with (MPICH's mpiexec.hydra or Open MPI's mpirun).

Where the ranks run:
  -np N, -n N, --num-proc N
                         number of ranks (default: every slot of the hosts; needed without hosts)
  -H, --hosts LIST       hosts and slots: host:slots,host:slots,... (a bare host has 1 slot)
  --hostfile FILE        one host per line: `host slots=N`, `host:N` or `host`
                         (without -H or --hostfile: this machine, or the SLURM allocation that
                         dtrainrun runs in)
  --launcher-agent CMD   start processes on other hosts with `CMD host command...` instead of ssh

Environment:
  -x NAME[=VALUE]        give every rank NAME (with VALUE, or its value here); repeatable.
                         DTRAIN_* and HOROVOD_* variables are always passed on.

Output and exit status:
  --no-prefix            print the ranks' lines as they are, without `[rank]<stdout>:`
  --verbose, -v          say which MPI launcher is used and why, and the command it runs
  dtrainrun exits with the exit code of the first rank that failed (128 + N for a rank killed by
  signal N), {EXIT_USAGE} for bad arguments, {EXIT_NOT_STARTED} when the job could not be started, \
{EXIT_RESTARTS_EXHAUSTED} when
  --restarts were used up, {EXIT_LEADER_LOST} when a --cluster follower lost its leader.

Failures:
  --restarts K           relaunch a failed job (a rank exited non-zero or died) up to K times;
                         the program resumes from its own checkpoints (DTRAINRUN_RESTART_COUNT
                         tells it which attempt it is)
  --start-timeout S      give up when some rank has not started after S seconds (default
                         {DEFAULT_START_TIMEOUT_S:g})

Managed clusters (every host runs the same `dtrainrun --cluster -- program`):
  --cluster              hosts from DTRAIN_HOSTS + DTRAIN_CURRENT_HOST, or SM_HOSTS (JSON) +
                         SM_CURRENT_HOST; the first host in sorted order starts the job, the
                         others wait for it and exit with its status
  --slots N              ranks per host (default: SM_NUM_GPUS, else the host's cores)
  --cluster-port P       TCP port of the leader's status channel (default {DEFAULT_CLUSTER_PORT})
  --cluster-timeout S    how long the hosts wait for each other (default
                         {DEFAULT_CLUSTER_TIMEOUT_S:g})

MPI:
  --mpi mpich|openmpi    which MPI to launch with (default: the one the program links, else the
                         one dtrain was built with)
  --launcher PATH        the MPI launcher program itself (mpiexec.hydra, mpirun, ...)

Other:
  --check-build          print what dtrain was built with and which launcher would run
  --dry-run              print the launcher command and exit
  --version              print dtrainrun's version
  -h, --help             this text

docs/running.md in dtrain's sources has examples for one host, many hosts, SLURM and managed
clusters.
"""


@dataclass
class Options:
    np: Optional[int] = None
    hosts: Optional[List[Host]] = None
    hostfile: Optional[str] = None
    env: List[Tuple[str, Optional[str]]] = field(default_factory=list)  # -x NAME[=VALUE]
    prefix: bool = True
    verbose: bool = False
    restarts: int = 0
    start_timeout_s: float = DEFAULT_START_TIMEOUT_S
    cluster: bool = False
    slots: Optional[int] = None
    cluster_port: int = DEFAULT_CLUSTER_PORT
    cluster_timeout_s: float = DEFAULT_CLUSTER_TIMEOUT_S
    mpi: Optional[str] = None
    launcher: Optional[str] = None
    launcher_agent: Optional[str] = None
    check_build: bool = False
    dry_run: bool = False
    help: bool = False
    version: bool = False
    program: List[str] = field(default_factory=list)
    given: List[str] = field(default_factory=list)  # option names as typed, for messages


_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

# Options that take a value, by every spelling, mapped to their canonical name.
_VALUED = {
    "-np": "-np", "-n": "-np", "--num-proc": "-np",
    "-H": "-H", "--hosts": "-H",
    "--hostfile": "--hostfile",
    "-x": "-x",
    "--restarts": "--restarts",
    "--start-timeout": "--start-timeout",
    "--slots": "--slots",
    "--cluster-port": "--cluster-port",
    "--cluster-timeout": "--cluster-timeout",
    "--mpi": "--mpi",
    "--launcher": "--launcher",
    "--launcher-agent": "--launcher-agent",
}
_FLAGS = {
    "--no-prefix": "prefix", "--verbose": "verbose", "-v": "verbose", "--cluster": "cluster",
    "--check-build": "check_build", "--dry-run": "dry_run", "-h": "help", "--help": "help",
    "--version": "version",
}


def _seconds(option: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"dtrain: {option} expects seconds, got '{text}'") from None
    if not value > 0:
        raise UsageError(f"dtrain: {option} {text}: must be more than 0 seconds")
    return value


def _env_assignment(text: str) -> Tuple[str, Optional[str]]:
    name, sep, value = text.partition("=")
    if not _ENV_NAME.match(name):
        raise UsageError(f"dtrain: -x '{text}': '{name}' is not an environment variable name "
                         f"(letters, digits and '_', not starting with a digit)")
    return name, (value if sep else None)


def parse(argv: List[str]) -> Options:
    """Parses dtrainrun's arguments (without the program name). Raises UsageError."""
    o = Options()
    i = 0
    while i < len(argv):
        token = argv[i]
        if token == "--":
            o.program = argv[i + 1:]
            break
        if not token.startswith("-") or token == "-":
            o.program = argv[i:]
            break
        name, has_inline, inline = token.partition("=")
        if name.startswith("--") and has_inline and name in _VALUED:
            value = inline
        elif token in _VALUED:
            name = token
            if i + 1 >= len(argv):
                raise UsageError(f"dtrain: {token} needs a value; see dtrainrun --help")
            i += 1
            value = argv[i]
        elif token in _FLAGS:
            attr = _FLAGS[token]
            setattr(o, attr, attr != "prefix")
            o.given.append(token)
            i += 1
            continue
        else:
            raise UsageError(f"dtrain: unknown option '{token}'; see dtrainrun --help (the "
                             f"program and its own options come after '--')")
        canonical = _VALUED[name]
        o.given.append(canonical)
        if canonical == "-np":
            o.np = whole_number(name, value, 1, MAX_RANKS, MAX_RANKS_WHY)
        elif canonical == "-H":
            if o.hosts is not None:
                raise UsageError("dtrain: -H given twice; list every host in one -H host:slots,...")
            o.hosts = parse_host_list(value, name)
        elif canonical == "--hostfile":
            o.hostfile = value
        elif canonical == "-x":
            o.env.append(_env_assignment(value))
        elif canonical == "--restarts":
            o.restarts = whole_number(name, value, 0, MAX_RESTARTS)
        elif canonical == "--start-timeout":
            o.start_timeout_s = _seconds(name, value)
        elif canonical == "--slots":
            o.slots = whole_number(name, value, 1, MAX_RANKS, MAX_RANKS_WHY)
        elif canonical == "--cluster-port":
            if (parse_count(value, 65535) or 0) > 65535:
                raise UsageError(f"dtrain: --cluster-port {value}: ports go up to 65535")
            o.cluster_port = whole_number(name, value, 1, 65535)
        elif canonical == "--cluster-timeout":
            o.cluster_timeout_s = _seconds(name, value)
        elif canonical == "--mpi":
            if value not in ("mpich", "openmpi"):
                raise UsageError(f"dtrain: --mpi '{value}': expected mpich or openmpi")
            o.mpi = value
        elif canonical == "--launcher":
            o.launcher = value
        elif canonical == "--launcher-agent":
            o.launcher_agent = value
        i += 1
    _check_combinations(o)
    return o


def _check_combinations(o: Options) -> None:
    if o.help or o.version:
        return
    if o.hosts is not None and o.hostfile is not None:
        raise UsageError("dtrain: -H and --hostfile both given; use one of them")
    if o.cluster and (o.hosts is not None or o.hostfile is not None):
        raise UsageError("dtrain: --cluster takes its hosts from DTRAIN_HOSTS or SM_HOSTS; "
                         "drop -H/--hostfile")
    if not o.cluster:
        for cluster_only in ("--slots", "--cluster-port", "--cluster-timeout"):
            if cluster_only in o.given:
                raise UsageError(f"dtrain: {cluster_only} applies to --cluster only"
                                 + ("; give slots per host with -H host:slots"
                                    if cluster_only == "--slots" else ""))
    if not o.program and not o.check_build:
        raise UsageError(f"dtrain: no program to run; {USAGE}")
