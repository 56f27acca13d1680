"""Elastic mode's running part: the host discovery script, the loop over worlds, and the thread
that asks the script again while a world runs. The decisions are elastic.py's (Note [Elastic
model]); the ranks are told through elastic_notify.py (Note [Elastic notification protocol])."""
from __future__ import annotations

import errno
import os
import selectors
import signal
import subprocess
import threading
import time
from typing import Callable, Dict, List, Optional, Tuple

from . import job, records
from .elastic import (Continue, DiscoveryError, Elastic, Finish, Launch, Outcome, Settings,
                      Wait, counted, parse_discovery)
from .elastic_notify import NotifyServer, advertised_address
from .errors import EXIT_NOT_STARTED, LaunchError
from .hosts import Host, layout_text, total_slots
from .mpi import ELASTIC_VARIABLES

# How often the script is asked while a world runs or while the job waits for hosts (Horovod
# asks every second too); a script that hits a rate-limited API should cache its answer.
DISCOVERY_INTERVAL_S = 1.0
# A call that takes longer is a failed call: its process group is killed.
DISCOVERY_TIMEOUT_S = 30.0
# A host list is a few dozen bytes a host; more than this is not one.
MAX_DISCOVERY_BYTES = 16 << 20
_STDERR_TAIL_BYTES = 1000
# After the script exits, how long its streams may stay open before a process it started is taken
# to hold them: a child forked just before the exit holds them until it redirects its own output.
_LEFT_OPEN_GRACE_S = 0.2

# Note [Discovery output]
# A call of the script ends when the script exits, not when its output ends: a command it runs in
# the background (`refresh-cache &`, a `sleep 100 &` left behind) inherits the pipes and keeps
# them open long after the script printed its hosts and exited, so waiting for the end of the
# output would make every call wait for that command, and fail as "did not finish within 30 s"
# although the script did. Once the script has exited, what it printed is all in the pipes; the
# call reads on for at most _LEFT_OPEN_GRACE_S (a child forked just before the exit holds the
# pipes until it has redirected its own output) and then ends. What a leftover process prints
# later is not part of the answer. The leftover process is not killed (the script may have meant
# it to run on: a cache refresher), but dtrainrun says once that it found one and how to keep it
# off the script's output. A script that does not exit within the timeout is killed with its
# whole process group, children included.


def _collect(process: subprocess.Popen, out: bytearray, err: bytearray, deadline: float,
             timeout_s: float, cancel: Optional[threading.Event],
             max_bytes: int) -> Tuple[str, bool]:
    """Reads the script's output until the script exits (Note [Discovery output]). Returns
    (what went wrong, or ''; whether a process it started still held a stream open then)."""
    exited_at: Optional[float] = None
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ, out)
        selector.register(process.stderr, selectors.EVENT_READ, err)
        while selector.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                return f"it did not finish within {timeout_s:g} s", False
            if cancel is not None and cancel.is_set():
                return "cancelled", False
            now = time.monotonic()
            if exited_at is not None and now - exited_at > _LEFT_OPEN_GRACE_S:
                return "", True
            ready = selector.select(timeout=min(left, 0.1 if exited_at is None else 0.02))
            for key, _ in ready:
                chunk = os.read(key.fd, 1 << 16)
                if not chunk:
                    selector.unregister(key.fileobj)
                    continue
                key.data.extend(chunk)
                if len(out) > max_bytes:
                    return f"it printed more than {max_bytes >> 20} MiB", False
                del err[:-_STDERR_TAIL_BYTES]
            if exited_at is None and process.poll() is not None:
                exited_at = time.monotonic()
    return "", False


def run_script(path: str, timeout_s: float, cancel: Optional[threading.Event] = None,
               max_bytes: int = MAX_DISCOVERY_BYTES,
               left_open: Optional[Callable[[], None]] = None) -> str:
    """The script's standard output, when it exits with 0 within `timeout_s`. Raises
    DiscoveryError otherwise (or when `cancel` is set). The script runs in a session of its own,
    so that on a timeout its whole process group is killed: a child it started (a `sleep`, a
    `curl`) would otherwise keep running. `left_open` is called when the script exited while a
    process it started still held its output open (Note [Discovery output])."""
    try:
        process = subprocess.Popen([path], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, start_new_session=True)
    except OSError as e:
        hint = (" (a script needs a first line such as #!/bin/sh)"
                if e.errno == errno.ENOEXEC else "")
        raise DiscoveryError(f"cannot start it: {e.strerror}{hint}") from None
    deadline = time.monotonic() + timeout_s
    out, err = bytearray(), bytearray()
    problem = "interrupted"  # until the calls below return: the script must not outlive this
    held = False
    try:
        problem, held = _collect(process, out, err, deadline, timeout_s, cancel, max_bytes)
        if not problem:
            try:
                # It exited, or both streams ended, so it is ending too.
                rc = process.wait(timeout=max(0.0, deadline - time.monotonic()) + 1.0)
            except subprocess.TimeoutExpired:
                problem = f"it did not finish within {timeout_s:g} s"
    finally:
        if problem:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except OSError:
                pass
            process.wait()
        process.stdout.close()
        process.stderr.close()
    said = err.decode("utf-8", "replace").strip()
    said = f"; it said: {said.splitlines()[-1]}" if said else ""
    if problem:
        raise DiscoveryError(problem + ("" if problem == "cancelled" else said))
    if held and left_open is not None:
        left_open()
    if rc != 0:
        how = (f"it was killed by signal {-rc} ({records.signal_name(-rc)})" if rc < 0 else
               f"it exited with code {rc}")
        raise DiscoveryError(how + said)
    return out.decode("utf-8", "surrogateescape")


class Discovery:
    """The host discovery script (--host-discovery-script), asked with first() once and again()
    after that. A later call that fails keeps the last good answer in force: it is told once per
    run of failures (and again when the reason changes), and its recovery is told too."""

    def __init__(self, path: str, default_slots: int, note: Callable[[str], None],
                 timeout_s: float = DISCOVERY_TIMEOUT_S):
        self.path = path
        self.default_slots = default_slots
        self.note = note
        self.timeout_s = timeout_s
        self.failed_calls = 0
        self.last_problem = ""
        self.told_left_open = False

    def _left_open(self) -> None:
        if not self.told_left_open:
            self.told_left_open = True
            self.note(f"dtrainrun: elastic: the host discovery script {self.path} exited, but a "
                      f"process it started (a command run in the background with &) still holds "
                      f"its output open; dtrainrun takes what the script printed until it exited "
                      f"and does not wait for that process. Redirect the command's output "
                      f"(command >/dev/null 2>&1 &) to keep it off the script's answer")

    def _call(self, cancel: Optional[threading.Event] = None) -> List[Host]:
        return parse_discovery(run_script(self.path, self.timeout_s, cancel,
                                          left_open=self._left_open), self.default_slots)

    def first(self) -> List[Host]:
        try:
            return self._call()
        except DiscoveryError as e:
            raise LaunchError(f"dtrain: elastic: the host discovery script {self.path} failed "
                              f"on its first call: {e}; it must print host:slots lines and "
                              f"exit with 0", EXIT_NOT_STARTED) from None

    def again(self, cancel: Optional[threading.Event] = None) -> Optional[List[Host]]:
        """The hosts, or None when this call failed."""
        try:
            hosts = self._call(cancel)
        except DiscoveryError as e:
            if str(e) == "cancelled":
                return None
            self.failed_calls += 1
            if str(e) != self.last_problem:
                self.note(f"dtrainrun: elastic: the host discovery script failed: {e}; keeping "
                          f"the hosts it offered last, and asking again")
                self.last_problem = str(e)
            return None
        if self.failed_calls:
            self.note(f"dtrainrun: elastic: the host discovery script works again, after "
                      f"{self.failed_calls} failed call(s)")
            self.failed_calls, self.last_problem = 0, ""
        return hosts


class LockedOutput(job.Output):
    """An Output that the watcher thread's notes share with the launcher's lines: one lock, so
    that a note never lands inside a long line being written."""

    def __init__(self, inner: job.Output):
        super().__init__(inner.prefix, inner.verbose)
        self.inner = inner
        self.lock = threading.Lock()

    def head(self, rank, stream):
        return self.inner.head(rank, stream)

    def rank_line(self, rank, stream, line) -> None:
        with self.lock:
            self.inner.rank_line(rank, stream, line)

    def launcher_line(self, stream, line) -> None:
        with self.lock:
            self.inner.launcher_line(stream, line)

    def note(self, text: str) -> None:
        with self.lock:
            self.inner.note(text)


class _Watcher:
    """Asks the script every `interval_s` while a world runs, and tells the notification server
    when the world should stop for a resize."""

    def __init__(self, machine: Elastic, lock: threading.Lock, discovery: Discovery,
                 server: NotifyServer, output: job.Output, interval_s: float):
        self.machine, self.lock, self.discovery = machine, lock, discovery
        self.server, self.output, self.interval_s = server, output, interval_s
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        asked = False
        while not self.stopping.wait(self.interval_s):
            hosts = self.discovery.again(self.stopping)
            if hosts is None:
                continue
            with self.lock:
                if self.stopping.is_set():
                    return  # the world ended: this answer is the main loop's to take
                change = self.machine.discovered(hosts)
                target = self.machine.resize_target()
                generation = self.machine.generation
            if change:
                self.output.note(f"dtrainrun: elastic: hosts changed: {change}")
            if target is not None:
                self.server.request_resize(*target)
                if not asked:
                    self.output.note(f"dtrainrun: elastic: asking generation {generation} to "
                                     f"commit and stop for a resize; the next world would "
                                     f"have {counted(target[1], 'rank')}")
                    asked = True

    def stop(self) -> None:
        with self.lock:
            self.stopping.set()
        self.thread.join()


# What runs one world: (layout, variables for the ranks, failures restarted so far, where its
# output goes) -> Attempt.
AttemptRunner = Callable[[List[Host], Dict[str, str], int, job.Output], job.Attempt]


def _sleep(seconds: float, interrupts: job.Interrupts) -> None:
    end = time.monotonic() + seconds
    while interrupts.signal is None and time.monotonic() < end:
        time.sleep(min(0.1, max(0.0, end - time.monotonic())))


def _interrupted(interrupts: job.Interrupts) -> Finish:
    number = interrupts.signal or signal.SIGINT
    return Finish(128 + number, f"dtrainrun: interrupted by {records.signal_name(number)} while "
                                f"waiting for hosts; exiting with {128 + number}")


def rank_environment(generation: int, notify: str) -> Dict[str, str]:
    """The variables of Note [Elastic notification protocol] (mpi.ELASTIC_VARIABLES; besides
    DTRAINRUN_RESTART_COUNT, which every job's ranks get)."""
    return dict(zip(ELASTIC_VARIABLES, ("1", notify, str(generation))))


def run(settings: Settings, discovery: Discovery, run_world: AttemptRunner, output: job.Output,
        interrupts: job.Interrupts, port: int = 0,
        on_layout: Optional[Callable[[List[Host]], None]] = None,
        interval_s: float = DISCOVERY_INTERVAL_S) -> int:
    """The whole elastic job (Note [Elastic model]); returns dtrainrun's exit status."""
    output = LockedOutput(output)
    discovery.note = output.note
    machine = Elastic(settings, time.monotonic)
    lock = threading.Lock()
    machine.discovered(discovery.first())
    shown_wait = ""
    with NotifyServer(port) as server:
        while True:
            with lock:
                step = machine.next_world()
            if interrupts.signal is not None:
                step = _interrupted(interrupts)
            if isinstance(step, Finish):
                if step.message:
                    output.note(step.message)
                return step.code
            if isinstance(step, Wait):
                if step.message != shown_wait:
                    output.note(f"{step.message}; waiting up to {step.left_s:.0f} s more")
                    shown_wait = step.message
                _sleep(interval_s, interrupts)
                hosts = discovery.again()
                if hosts is not None:
                    with lock:
                        change = machine.discovered(hosts)
                    if change:
                        output.note(f"dtrainrun: elastic: hosts changed: {change}")
                continue
            assert isinstance(step, Launch)
            shown_wait = ""
            if step.note:
                output.note(step.note)
            size = total_slots(step.layout)
            output.note(f"dtrainrun: elastic: generation {step.generation}: "
                        f"{counted(size, 'rank')} on "
                        f"{layout_text(step.layout)}")
            if on_layout is not None:
                on_layout(step.layout)
            server.start_world(step.generation, size)
            notify = f"{advertised_address(h.name for h in step.layout)}:{server.port}"
            watcher = _Watcher(machine, lock, discovery, server, output, interval_s)
            try:
                attempt = run_world(step.layout, rank_environment(step.generation, notify),
                                    step.restart_count, output)
            finally:
                watcher.stop()
            if attempt.code != 0 and not attempt.interrupted:
                # A host that is gone now is what a failure is blamed on (elastic._blame).
                hosts = discovery.again()
                if hosts is not None:
                    with lock:
                        change = machine.discovered(hosts)
                    if change:
                        output.note(f"dtrainrun: elastic: hosts changed: {change}")
            with lock:
                verdict = machine.ended(Outcome(attempt.code, attempt.reason,
                                                attempt.interrupted, attempt.failed_rank,
                                                attempt.never_started))
            if isinstance(verdict, Finish):
                if verdict.message:
                    output.note(verdict.message)
                return verdict.code
            assert isinstance(verdict, Continue)
            output.note(verdict.message)

