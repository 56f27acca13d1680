"""Running the MPI launcher: its output, the ranks' records, the job's exit status, restarts."""
from __future__ import annotations

import os
import re
import selectors
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Mapping, Optional, Sequence

from . import records
from .errors import EXIT_NOT_STARTED, EXIT_RESTARTS_EXHAUSTED

# After the first rank fails, the launcher gets this long to end the job by itself (Hydra kills
# the other ranks of an MPI program at once) before dtrainrun stops it: ranks that failed before
# MPI_Init, or a program that is not an MPI program, would otherwise leave the others waiting.
FAILURE_GRACE_S = 10.0
# Between asking the launcher to stop (SIGTERM, which it passes to the ranks) and killing it.
TERMINATE_GRACE_S = 5.0
# After the launcher exits, how long processes it left behind may keep its output open.
DRAIN_AFTER_EXIT_S = 5.0

# Hydra's own report of a failed rank. It names the wrong exit code (that of the ranks it killed
# afterwards), so it is left out; dtrainrun reports the first failure itself. --verbose keeps it.
_HYDRA_BANNER = re.compile(
    rb"^(=+|=   (BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES|PID \d+ RUNNING AT .*|"
    rb"EXIT CODE: \d+|CLEANING UP REMAINING PROCESSES|YOU CAN IGNORE THE BELOW CLEANUP MESSAGES)"
    rb"|YOUR APPLICATION TERMINATED WITH THE EXIT STRING: .*"
    rb"|This typically refers to a problem with your application\."
    rb"|Please see the FAQ page for debugging suggestions)\s*$")


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except BrokenPipeError:
            return


def write_text(fd: int, text: str) -> None:
    """Text that may hold bytes that were not UTF-8 (program arguments, host names, values from
    the environment, all decoded with surrogateescape) written back as those bytes."""
    write_all(fd, text.encode("utf-8", "surrogateescape"))


class Output:
    """Where the job's lines go: this process's stdout and stderr. The cluster leader extends it
    to also send each line to the host its rank runs on."""

    def __init__(self, prefix: bool, verbose: bool):
        self.prefix = prefix
        self.verbose = verbose

    def head(self, rank: Optional[int], stream: str) -> bytes:
        """What goes before a rank's line: its tag, or nothing with --no-prefix."""
        return records.tag("?" if rank is None else str(rank), stream) if self.prefix else b""

    def rank_line(self, rank: Optional[int], stream: str, line: records.Line) -> None:
        """A rank's whole line (ending in a newline), written without anything between its
        parts."""
        fd = 1 if stream == "stdout" else 2
        head = self.head(rank, stream)
        for chunk in line.chunks():
            write_all(fd, head + chunk)
            head = b""

    def launcher_line(self, stream: str, line: bytes) -> None:
        if not self.verbose and (_HYDRA_BANNER.match(line) or not line.strip()):
            return
        write_all(1 if stream == "stdout" else 2, line)

    def note(self, text: str) -> None:
        """dtrainrun's own messages."""
        write_text(2, text + "\n")


@dataclass
class Attempt:
    code: int
    reason: str = ""
    interrupted: bool = False
    # For elastic mode's blame (elastic._blame): the first rank that reported a failure, and the
    # ranks that never started.
    failed_rank: Optional[int] = None
    never_started: List[int] = field(default_factory=list)


@dataclass
class _State:
    np: int
    token: str
    started: Dict[int, str] = field(default_factory=dict)
    ended: Dict[int, dict] = field(default_factory=dict)
    first_failure: Optional[dict] = None
    pieces: Dict[tuple, records.Line] = field(default_factory=dict)  # Note [Line pieces]
    failed_at: float = 0.0


def ranks_text(ranks: Sequence[int]) -> str:
    """Ascending ranks as runs: '1, 3-5'; a job of a million ranks that never started is one
    run, not a million numbers."""
    runs: List[List[int]] = []
    for r in ranks:
        if runs and r == runs[-1][1] + 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


class Interrupts:
    """SIGINT/SIGTERM/SIGHUP to dtrainrun: passed on to the launcher (which runs in its own
    process group, so it hears each signal once), and no restart afterwards. A second one kills
    the launcher's process group.

    SIGCONT is passed on to the launcher's process group, and is no interrupt: SLURM sends it
    before the SIGTERM of scancel and after `scontrol suspend`, to the processes it tracks; where
    it tracks the batch script's process group only (proctrack/pgid), the launcher's group hears
    it from dtrainrun, and a stopped launcher can then act on the SIGTERM passed on after it."""

    def __init__(self):
        self.signal: Optional[int] = None
        self.process: Optional[subprocess.Popen] = None

    def __enter__(self):
        self._old = {s: signal.signal(s, self._handle)
                     for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        self._old[signal.SIGCONT] = signal.signal(signal.SIGCONT, self._continue)
        return self

    def _continue(self, _number, _frame):
        if self.process is not None and self.process.poll() is None:
            _signal_group(self.process, signal.SIGCONT)

    def __exit__(self, *exc):
        for s, handler in self._old.items():
            signal.signal(s, handler)

    def _handle(self, number, _frame):
        again = self.signal is not None
        self.signal = number
        if self.process is not None and self.process.poll() is None:
            try:
                if again:  # a second Ctrl-C: the job did not stop when asked
                    os.killpg(self.process.pid, signal.SIGKILL)
                else:
                    self.process.send_signal(number)
            except OSError:
                pass


def _launcher_preexec() -> None:
    os.setpgid(0, 0)
    try:  # if dtrainrun is killed outright, the launcher is told to stop (Linux)
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (ImportError, OSError, AttributeError):
        pass


def run_attempt(argv: Sequence[str], env: Mapping[str, str], np: int, token: str,
                output: Output, start_timeout_s: float, interrupts: Interrupts,
                launcher_name: str) -> Attempt:
    """Runs the launcher once and decides the job's exit status (Note [Rank records])."""
    state = _State(np=np, token=token)
    # A terminal stays with dtrainrun: the launcher runs in its own process group, where reading
    # the terminal would stop it.
    stdin = subprocess.DEVNULL if sys.stdin is None or sys.stdin.isatty() else None
    process = subprocess.Popen(list(argv), env=dict(env), stdin=stdin, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, preexec_fn=_launcher_preexec)
    interrupts.process = process
    selector = selectors.DefaultSelector()
    pending = {"stdout": bytearray(), "stderr": bytearray()}
    selector.register(process.stdout, selectors.EVENT_READ, "stdout")
    selector.register(process.stderr, selectors.EVENT_READ, "stderr")

    began = time.monotonic()
    stop_reason: Optional[str] = None
    stop_sent_at: Optional[float] = None
    killed = False
    exited_at: Optional[float] = None
    try:
        while selector.get_map():
            for key, _ in selector.select(timeout=0.25):
                stream = key.data
                chunk = os.read(key.fd, 1 << 16)
                if not chunk:
                    selector.unregister(key.fileobj)
                pending[stream] += chunk
                for line in records.iter_lines(pending[stream], final=not chunk):
                    _take_line(line, stream, state, output)
            now = time.monotonic()
            if process.poll() is not None:
                exited_at = exited_at or now
                if now - exited_at > DRAIN_AFTER_EXIT_S:
                    break
            if stop_reason is None and process.poll() is None:
                if state.first_failure is not None and now - state.failed_at > FAILURE_GRACE_S:
                    stop_reason = "failure"
                elif len(state.started) < np and now - began > start_timeout_s:
                    stop_reason = "start"
                if stop_reason is not None:
                    stop_sent_at = now
                    _signal_group(process, signal.SIGTERM)
            elif (stop_sent_at is not None and not killed and process.poll() is None
                  and now - stop_sent_at > TERMINATE_GRACE_S):
                killed = True
                _signal_group(process, signal.SIGKILL)
        for stream, rest in pending.items():  # what processes left behind had not ended
            for line in records.iter_lines(rest, final=True):
                _take_line(line, stream, state, output)
        _end_unfinished_lines(state, output)
        rc = process.wait()
    finally:
        selector.close()
        process.stdout.close()
        process.stderr.close()
        interrupts.process = None
    return _verdict(state, rc, stop_reason, start_timeout_s, interrupts, launcher_name)


def _signal_group(process: subprocess.Popen, number: int) -> None:
    try:
        os.killpg(process.pid, number)
    except OSError:
        pass


def _take_line(line: bytes, stream: str, state: _State, output: Output) -> None:
    rest, found = records.split_records(line, state.token)
    for record in found:
        rank = record.get("rank")
        if not isinstance(rank, int):
            continue
        if record.get("event") == "start":
            state.started[rank] = str(record.get("host"))
        elif record.get("event") == "exit":
            state.started.setdefault(rank, str(record.get("host")))
            state.ended[rank] = record
            if records.exit_code(record) != 0 and state.first_failure is None:
                state.first_failure = record
                state.failed_at = time.monotonic()
    if found and rest.strip(b"\r\n") == b"":
        return
    rank, tagged_stream, continued, text = records.parse_tag(rest)
    if tagged_stream is None:
        output.launcher_line(stream, rest)
        return
    key = (rank, tagged_stream)
    line = state.pieces.pop(key, None) or records.Line()
    if continued:
        line.append(text[:-1])  # the newline ends the piece, not the line
        state.pieces[key] = line
        return
    line.append(text)
    try:
        output.rank_line(rank, tagged_stream, line)
    finally:
        line.close()


def _end_unfinished_lines(state: _State, output: Output) -> None:
    """Lines whose last piece never came (the wrapper was killed while passing a long line on):
    printed as they are, ended with a newline."""
    for (rank, stream), line in state.pieces.items():
        line.append(b"\n")
        try:
            output.rank_line(rank, stream, line)
        finally:
            line.close()
    state.pieces.clear()


def _verdict(state: _State, rc: int, stop_reason: Optional[str], start_timeout_s: float,
             interrupts: Interrupts, launcher_name: str) -> Attempt:
    if interrupts.signal is not None:
        name = records.signal_name(interrupts.signal)
        return Attempt(128 + interrupts.signal, f"interrupted by {name}", interrupted=True)
    if state.first_failure is not None:
        rank = state.first_failure.get("rank")
        return Attempt(records.exit_code(state.first_failure),
                       records.describe_exit(state.first_failure),
                       failed_rank=rank if isinstance(rank, int) else None)
    never_started = [r for r in range(state.np) if r not in state.started]
    if stop_reason == "start":
        return Attempt(EXIT_NOT_STARTED,
                       f"rank(s) {ranks_text(never_started)} did not start within "
                       f"{start_timeout_s:g} s; can {launcher_name} reach their hosts? "
                       f"(--verbose shows its command)", never_started=never_started)
    if rc != 0:
        how = (f"was killed by signal {-rc} ({records.signal_name(-rc)})" if rc < 0
               else f"exited with code {rc}")
        if never_started:
            return Attempt(EXIT_NOT_STARTED,
                           f"{launcher_name} {how} before rank(s) {ranks_text(never_started)} "
                           f"started", never_started=never_started)
        unreported = [r for r in range(state.np) if r not in state.ended]
        detail = (f"; rank(s) {ranks_text(unreported)} ended without reporting their status"
                  if unreported else "; every rank exited with 0")
        return Attempt(128 - rc if rc < 0 else rc, f"{launcher_name} {how}{detail}")
    return Attempt(0)


def run_with_restarts(attempt: Callable[[int], Attempt], restarts: int, output: Output) -> int:
    """Runs attempt(0), and after a failure attempt(1) ... up to attempt(restarts)."""
    for number in range(restarts + 1):
        result = attempt(number)
        if result.code == 0:
            if number > 0:
                output.note(f"dtrainrun: the job succeeded after {number} restart(s)")
            return 0
        if result.interrupted:
            output.note(f"dtrainrun: {result.reason}; exiting with {result.code}")
            return result.code
        if number < restarts:
            output.note(f"dtrainrun: restart {number + 1} of {restarts}: {result.reason}")
            continue
        if restarts > 0:
            output.note(f"dtrain: the job failed {restarts + 1} times, the last time because "
                        f"{result.reason}; no restarts left (--restarts {restarts}); exiting "
                        f"with {EXIT_RESTARTS_EXHAUSTED}")
            return EXIT_RESTARTS_EXHAUSTED
        output.note(f"dtrainrun: job failed: {result.reason}; exiting with {result.code}")
        return result.code
    return 0  # not reached: the last attempt always returns
