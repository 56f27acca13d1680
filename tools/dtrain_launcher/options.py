"""The command line, on argparse. Each option is declared once, in _declare(): its spellings,
its value and how that is checked, its default and its help; the parser, the help text and the
Options it fills all come from there.

Note [argparse for a launcher]
A launcher's command line ends in another program's, which argparse keeps apart with a single
REMAINDER positional: from the first word that is not one of dtrainrun's options (or after `--`),
everything is the program's, options included. argparse's own reactions are replaced where they
would fall short of a 'dtrain:' message: error() raises UsageError instead of printing usage and
exiting; a valued option takes its value as nargs='?' with a marker for "none given", so that a
missing value is named with the spelling the user typed; values are converted in the action, which
also knows that spelling; abbreviations (--verb for --verbose) are off. What argparse adds over
the parser it replaced: `-np=4` like `--num-proc=4`, a value joined to a one-letter option (`-n4`,
`-xNAME=V`), flags grouped with it (`-vn 4` is `-v -n 4`). A value that starts with '-' must be
joined with '=' (`--launcher-agent=-x`), as argparse would read it as an option.
"""
from __future__ import annotations

import argparse
import math
import os
import re
import shutil
import textwrap
from typing import Callable, List, Optional, Tuple

from .elastic import EXIT_ELASTIC_TIMEOUT, RESIZE_EXIT_STATUS
from .errors import (EXIT_LEADER_LOST, EXIT_NOT_STARTED, EXIT_RESTARTS_EXHAUSTED, EXIT_USAGE,
                     UsageError, shown)
from .hosts import parse_host_list
from .limits import MAX_RANKS, MAX_RANKS_WHY, MAX_RESTARTS, parse_count, whole_number

DEFAULT_CLUSTER_PORT = 29517
DEFAULT_CLUSTER_TIMEOUT_S = 300.0
DEFAULT_START_TIMEOUT_S = 120.0
# Horovod's default for its --elastic-timeout.
DEFAULT_ELASTIC_TIMEOUT_S = 600.0
DEFAULT_BLACKLIST_COOLDOWN_S = 60.0
# A job that has waited a week for hosts needs a person, not more waiting.
MAX_ELASTIC_TIMEOUT_S = 7 * 24 * 3600.0
# A day; Note [Blacklist cooldown] doubles it up to 32 times for a host that keeps failing.
MAX_BLACKLIST_COOLDOWN_S = 24 * 3600.0
# The options that only elastic mode reads.
ELASTIC_ONLY = ("--min-np", "--max-np", "--elastic-timeout", "--blacklist-cooldown",
                "--elastic-port")

USAGE = "usage: dtrainrun [options] [--] program [args...]"
SEE_HELP = "see dtrainrun --help"

_DESCRIPTION = """\
Starts `program` as the ranks of one dtrain job through the MPI launcher the program was built
with (MPICH's mpiexec.hydra or Open MPI's mpirun)."""

_EPILOG = textwrap.fill(
    f"dtrainrun exits with the exit code of the first rank that failed (128 + N for a rank "
    f"killed by signal N), {EXIT_USAGE} for bad arguments, {EXIT_NOT_STARTED} when the job could "
    f"not be started, {EXIT_RESTARTS_EXHAUSTED} when --restarts were used up, "
    f"{EXIT_LEADER_LOST} when a --cluster follower lost its leader, {EXIT_ELASTIC_TIMEOUT} when "
    f"elastic mode had fewer than --min-np slots for --elastic-timeout. In elastic mode a world "
    f"whose ranks exit with {RESIZE_EXIT_STATUS} after a resize was requested is started again "
    f"on the current hosts.", 100) + """

docs/running.md in dtrain's sources has examples for one host, many hosts, SLURM, managed
clusters and elastic jobs."""

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_NO_VALUE = object()  # the const of a valued option: it was given without a value


class Options(argparse.Namespace):
    """The parsed command line: an attribute per option (its dest in _declare()), `program` (the
    program and its arguments) and `given` (the options given, by their first spelling)."""


# Value checks: (the option as typed, its text) -> the value, or UsageError.

def _ranks(option: str, text: str) -> int:
    return whole_number(option, text, 1, MAX_RANKS, MAX_RANKS_WHY)


def _restarts(option: str, text: str) -> int:
    return whole_number(option, text, 0, MAX_RESTARTS)


def _port(option: str, text: str) -> int:
    if (parse_count(text, 65535) or 0) > 65535:
        raise UsageError(f"dtrain: {option} {shown(text, quote='')}: ports go up to 65535")
    return whole_number(option, text, 1, 65535)


def _seconds(option: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"dtrain: {option} expects seconds, got {shown(text)}") from None
    if not value > 0:
        raise UsageError(f"dtrain: {option} {shown(text, quote='')}: must be more than 0 seconds")
    return value


def _seconds_up_to(maximum: float, zero: bool = False) -> Callable[[str, str], float]:
    """A check for a finite number of seconds, at most `maximum`, and more than 0 (or at least 0
    with `zero`)."""
    def check(option: str, text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value):
            raise UsageError(f"dtrain: {option} expects seconds, got {shown(text)}")
        if value < 0 or (value == 0 and not zero):
            raise UsageError(f"dtrain: {option} {shown(text, quote='')}: must be "
                             + ("0 or more seconds" if zero else "more than 0 seconds"))
        if value > maximum:
            raise UsageError(f"dtrain: {option} {shown(text, quote='')}: at most {maximum:g} "
                             f"seconds")
        return value
    return check


def _port_or_any(option: str, text: str) -> int:
    if (parse_count(text, 65535) or 0) > 65535:
        raise UsageError(f"dtrain: {option} {shown(text, quote='')}: ports go up to 65535")
    return whole_number(option, text, 0, 65535)


def _script(option: str, text: str) -> str:
    """An executable file, by path or on PATH; the value is its path."""
    found = text if os.sep in text else shutil.which(text)
    if found is None:
        raise UsageError(f"dtrain: {option} {shown(text)}: not found on PATH; give its path "
                         f"(./{text} if it is in this folder)")
    if not os.path.exists(found):
        raise UsageError(f"dtrain: {option} {shown(text)}: no such file")
    if not os.path.isfile(found) or not os.access(found, os.X_OK):
        raise UsageError(f"dtrain: {option} {shown(text)}: not an executable file")
    return found


def _env_assignment(option: str, text: str) -> Tuple[str, Optional[str]]:
    name, sep, value = text.partition("=")
    if not _ENV_NAME.match(name):
        raise UsageError(f"dtrain: {option} {shown(text)}: {shown(name)} is not an environment "
                         f"variable name (letters, digits and '_', not starting with a digit)")
    return name, (value if sep else None)


def _mpi(option: str, text: str) -> str:
    if text not in ("mpich", "openmpi"):
        raise UsageError(f"dtrain: {option} {shown(text)}: expected mpich or openmpi")
    return text


def _host_list(option: str, text: str):
    return parse_host_list(text, option)


def _text(option: str, text: str) -> str:
    return text


class _Value(argparse.Action):
    """An option with a value, checked by `check`. `repeat`: every value is kept, in order;
    `once`: a second one is refused with that message."""

    def __init__(self, option_strings, dest, check: Callable[[str, str], object] = _text,
                 repeat: bool = False, once: Optional[str] = None, **kwargs):
        super().__init__(option_strings, dest, nargs="?", const=_NO_VALUE, **kwargs)
        self.check, self.repeat, self.once = check, repeat, once

    def __call__(self, parser, namespace, value, option_string=None):
        typed = option_string or self.option_strings[0]
        if value is _NO_VALUE:
            raise UsageError(f"dtrain: {typed} needs a value; {SEE_HELP}")
        if self.once and self.option_strings[0] in namespace.given:
            raise UsageError(f"dtrain: {self.once}")
        value = self.check(typed, value)
        if self.repeat:
            value = getattr(namespace, self.dest) + [value]
        setattr(namespace, self.dest, value)
        namespace.given.append(self.option_strings[0])


class _Flag(argparse.Action):
    """An option without a value: sets its dest to `value`."""

    def __init__(self, option_strings, dest, value: bool = True, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=not value, **kwargs)
        self.value = value

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, self.value)
        namespace.given.append(self.option_strings[0])


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        # argparse's own findings (a flag given a value, ...): ours are UsageErrors already.
        raise UsageError(f"dtrain: {message}; {SEE_HELP}")

    def format_help(self) -> str:
        return help_text()


_GROUPS: List[Tuple[str, List[argparse.Action]]] = []  # the help's sections, in order


def _declare() -> _Parser:
    parser = _Parser(prog="dtrainrun", add_help=False, allow_abbrev=False)

    def group(title: str):
        actions: List[argparse.Action] = []
        _GROUPS.append((title, actions))

        def option(*spellings, **kwargs):
            actions.append(parser.add_argument(*spellings, **kwargs))
        return option

    option = group("Where the ranks run")
    option("-np", "-n", "--num-proc", dest="np", action=_Value, check=_ranks, metavar="N",
           help="number of ranks (default: every slot of the hosts; needed without hosts)")
    option("-H", "--hosts", dest="hosts", action=_Value, check=_host_list, metavar="LIST",
           once="-H given twice; list every host in one -H host:slots,...",
           help="hosts and slots: host:slots,host:slots,... (a bare host has 1 slot)")
    option("--hostfile", dest="hostfile", action=_Value, metavar="FILE",
           help="one host per line: `host slots=N`, `host:N` or `host` (without -H or "
                "--hostfile: this machine, or the SLURM allocation that dtrainrun runs in)")
    option("--launcher-agent", dest="launcher_agent", action=_Value, metavar="CMD",
           help="start processes on other hosts with `CMD host command...` instead of ssh")

    option = group("Environment")
    option("-x", dest="env", action=_Value, check=_env_assignment, repeat=True, default=[],
           metavar="NAME[=VALUE]",
           help="give every rank NAME (with VALUE, or its value here); repeatable. DTRAIN_* and "
                "HOROVOD_* variables are always passed on.")

    option = group("Output")
    option("--no-prefix", dest="prefix", action=_Flag, value=False,
           help="print the ranks' lines as they are, without `[rank]<stdout>:`")
    option("--verbose", "-v", dest="verbose", action=_Flag,
           help="say which MPI launcher is used and why, and the command it runs")

    option = group("Failures")
    option("--restarts", dest="restarts", action=_Value, check=_restarts, default=0,
           metavar="K",
           help="relaunch a failed job (a rank exited non-zero or died) up to K times; the "
                "program resumes from its own checkpoints (DTRAINRUN_RESTART_COUNT tells it "
                "which attempt it is). In elastic mode resizes do not count, only failures")
    option("--start-timeout", dest="start_timeout_s", action=_Value, check=_seconds,
           default=DEFAULT_START_TIMEOUT_S, metavar="S",
           help=f"give up when some rank has not started after S seconds (default "
                f"{DEFAULT_START_TIMEOUT_S:g})")

    option = group("Elastic mode (hosts may come and go; docs/elastic.md)")
    option("--host-discovery-script", dest="host_discovery_script", action=_Value,
           check=_script, metavar="S",
           help="turns elastic mode on: S prints the hosts on offer, a `host:slots` line each, "
                "and is run again every second; the job is restarted on the hosts it offers when "
                "they change (at a commit of the program's) or when it fails")
    option("--min-np", dest="min_np", action=_Value, check=_ranks, metavar="N",
           help="the fewest ranks the job runs with (default: -np); with fewer slots on offer, "
                "dtrainrun waits")
    option("--max-np", dest="max_np", action=_Value, check=_ranks, metavar="M",
           help="the most ranks the job runs with (default: every slot on offer)")
    option("--elastic-timeout", dest="elastic_timeout_s", action=_Value,
           check=_seconds_up_to(MAX_ELASTIC_TIMEOUT_S), default=DEFAULT_ELASTIC_TIMEOUT_S,
           metavar="S",
           help=f"give up after waiting S seconds for --min-np slots (default "
                f"{DEFAULT_ELASTIC_TIMEOUT_S:g}), exiting with {EXIT_ELASTIC_TIMEOUT}")
    option("--blacklist-cooldown", dest="blacklist_cooldown_s", action=_Value,
           check=_seconds_up_to(MAX_BLACKLIST_COOLDOWN_S, zero=True),
           default=DEFAULT_BLACKLIST_COOLDOWN_S, metavar="S",
           help=f"keep a host that failed out of new worlds for S seconds, twice as long for "
                f"each failure in a row, up to 32 S (default {DEFAULT_BLACKLIST_COOLDOWN_S:g}; 0: "
                f"never)")
    option("--elastic-port", dest="elastic_port", action=_Value, check=_port_or_any, default=0,
           metavar="P",
           help="TCP port on which dtrainrun tells the ranks about resizes (default 0: any free "
                "port)")

    option = group("Managed clusters (every host runs the same `dtrainrun --cluster -- program`)")
    option("--cluster", dest="cluster", action=_Flag,
           help="hosts from DTRAIN_HOSTS + DTRAIN_CURRENT_HOST, or SM_HOSTS (JSON) + "
                "SM_CURRENT_HOST; the first host in sorted order starts the job, the others wait "
                "for it and exit with its status")
    option("--slots", dest="slots", action=_Value, check=_ranks, metavar="N",
           help="ranks per host (default: SM_NUM_GPUS, else the host's cores)")
    option("--cluster-port", dest="cluster_port", action=_Value, check=_port,
           default=DEFAULT_CLUSTER_PORT, metavar="P",
           help=f"TCP port of the leader's status channel (default {DEFAULT_CLUSTER_PORT})")
    option("--cluster-timeout", dest="cluster_timeout_s", action=_Value, check=_seconds,
           default=DEFAULT_CLUSTER_TIMEOUT_S, metavar="S",
           help=f"how long the hosts wait for each other (default "
                f"{DEFAULT_CLUSTER_TIMEOUT_S:g})")

    option = group("MPI")
    option("--mpi", dest="mpi", action=_Value, check=_mpi, metavar="mpich|openmpi",
           help="the MPI the program uses, when ldd cannot tell (a script, a static program; "
                "default: the one dtrain was built with); its launcher starts the job")
    option("--launcher", dest="launcher", action=_Value, metavar="PATH",
           help="the MPI launcher program itself (mpiexec.hydra, mpirun, ...); one of another "
                "MPI than the program's is refused")

    option = group("Other")
    option("--check-build", dest="check_build", action=_Flag,
           help="print what dtrain was built with, the program's MPI and the launcher that would "
                "start it; exit with 2 where a job would be refused")
    option("--dry-run", dest="dry_run", action=_Flag, help="print the launcher command and exit")
    option("--version", dest="version", action=_Flag, help="print dtrainrun's version")
    option("-h", "--help", dest="help", action=_Flag, help="this text")

    parser.add_argument("program", nargs=argparse.REMAINDER, default=[])
    return parser


_PARSER = _declare()


def spellings() -> List[str]:
    """Every spelling of every option."""
    return [s for _, actions in _GROUPS for action in actions for s in action.option_strings]


def help_text(width: int = 100, column: int = 25) -> str:
    """--help, laid out from the declarations."""
    lines = [USAGE, "", _DESCRIPTION, ""]
    for title, actions in _GROUPS:
        lines.append(f"{title}:")
        for action in actions:
            invocation = "  " + ", ".join(action.option_strings)
            if action.metavar:
                invocation += f" {action.metavar}"
            body = textwrap.wrap(action.help, width - column)
            if len(invocation) <= column - 2:
                lines.append(invocation.ljust(column) + body[0])
                body = body[1:]
            else:
                lines.append(invocation)
            lines.extend(" " * column + text for text in body)
        lines.append("")
    return "\n".join(lines) + "\n" + _EPILOG + "\n"


def parse(argv: List[str]) -> Options:
    """Parses dtrainrun's arguments (without the program name). Raises UsageError."""
    o, unknown = _PARSER.parse_known_args(argv, Options(given=[]))
    # REMAINDER keeps the `--` that ends dtrainrun's options (Note [argparse for a launcher]).
    after_dashes = o.program[:1] == ["--"]
    if after_dashes:
        o.program = o.program[1:]
    first = o.program[0] if o.program else ""
    if not unknown and not after_dashes and first.startswith("-") and first != "-":
        unknown = [first]  # argparse leaves '-5' and words with spaces to the program
    if unknown:
        raise UsageError(f"dtrain: unknown option {shown(unknown[0])}; {SEE_HELP} (the program "
                         f"and its own options come after '--')")
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
    _check_elastic(o)
    if not o.program and not o.check_build:
        raise UsageError(f"dtrain: no program to run; {USAGE}")


def _check_elastic(o: Options) -> None:
    if o.host_discovery_script is None:
        for elastic_only in ELASTIC_ONLY:
            if elastic_only in o.given:
                raise UsageError(f"dtrain: {elastic_only} applies to elastic mode only, which "
                                 f"--host-discovery-script S turns on")
        return
    if o.hosts is not None or o.hostfile is not None:
        raise UsageError("dtrain: in elastic mode the hosts come from --host-discovery-script; "
                         "drop -H/--hostfile")
    if o.min_np is None and o.np is None:
        raise UsageError("dtrain: elastic mode needs --min-np N, the fewest ranks the job runs "
                         "with (or -np N, which --min-np then defaults to)")
    min_np = o.min_np if o.min_np is not None else o.np
    max_np = o.max_np if o.max_np is not None else MAX_RANKS
    if min_np > max_np:
        given = "--min-np" if o.min_np is not None else "-np"
        raise UsageError(f"dtrain: {given} {min_np} is more than --max-np {max_np}")
    if o.np is not None and not min_np <= o.np <= max_np:
        raise UsageError(f"dtrain: -np {o.np} is outside --min-np {min_np} to --max-np "
                         f"{max_np}; in elastic mode -np is the size the first world waits for")
