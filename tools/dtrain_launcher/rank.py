"""The wrapper every rank runs in: `dtrainrun --rank-shim TOKEN -- program args...`.

It starts the program, prefixes each line the program prints with `[rank]<stdout>:` or
`[rank]<stderr>:`, and reports the program's start and end as records (Note [Rank records] in
records.py). It passes signals on to the program and ends the way the program ended.

Note [The wrapper keeps the PMI socket]
Hydra gives each rank a PMI socket (PMI_FD); the program inherits it (close_fds=False: Open MPI
and PMIx hand over descriptors too). The wrapper's own copy stays open until the wrapper has
written the exit record: when a rank dies before MPI_Finalize, Hydra kills every process of the
job (SIGKILL to each rank's process group, the wrapper's included) the moment that socket closes,
and with the wrapper's copy closed early that came before the record, so dtrainrun never learnt
the failing rank's code.
"""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
from typing import Dict, List, Optional

from . import records

_FORWARDED_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2")

_write_locks = {1: threading.Lock(), 2: threading.Lock()}


def rank_from_env(env) -> str:
    """This process's rank as the MPI launcher (or srun) announced it; '?' when none did."""
    for name in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID"):
        value = env.get(name)
        if value is not None and re.fullmatch(r"[0-9]{1,9}", value):
            return value
    return "?"


def _write(fd: int, data: bytes) -> None:
    with _write_locks[fd]:
        view = memoryview(data)
        while view:
            try:
                written = os.write(fd, view)
            except BrokenPipeError:
                return  # nobody reads any more; the program's exit status still matters
            view = view[written:]


def _relay(source: int, fd: int, rank: str, stream: str) -> None:
    """Copies the program's stream `source` to our `fd` as tagged pieces, one write each, so that
    the launcher never receives part of a piece (Note [Line pieces] in records.py)."""
    splitter = records.Splitter(rank, stream)
    while True:
        try:
            chunk = os.read(source, 1 << 16)
        except OSError:
            chunk = b""
        for piece in splitter.feed(chunk, final=not chunk):
            _write(fd, piece)
        if not chunk:
            return


def _signal_on_parent_death(number: int) -> None:
    """Linux: this process gets `number` when its parent dies (PR_SET_PDEATHSIG)."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, number)
    except (ImportError, OSError, AttributeError):
        pass


def _die_with_parent() -> None:
    """In the child: if this wrapper is killed outright, the program goes too."""
    _signal_on_parent_death(signal.SIGKILL)


def main(argv: List[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        sys.stderr.write("dtrain: dtrainrun --rank-shim is started by dtrainrun itself\n")
        return 2
    return run(argv[0], argv[2:])


def run(token: Optional[str], program: List[str]) -> int:
    """Runs the program as this rank. `token`: the job's, for the records; None where no
    dtrainrun reads them (srun started the ranks: Note [dtrainrun in a SLURM job] in
    slurm.py), and the exit status is the only report."""
    # If the launcher's process on this host (Hydra's proxy, Open MPI's orted) is killed outright,
    # the program is asked to stop (the SIGTERM is passed on below) instead of running orphaned.
    launcher_process = os.getppid()
    _signal_on_parent_death(signal.SIGTERM)
    if os.getppid() != launcher_process:
        return 128 + signal.SIGTERM
    rank = rank_from_env(os.environ)
    host = socket.gethostname()
    identity: Dict[str, object] = {"rank": None if rank == "?" else int(rank), "host": host}
    if token is not None:
        _write(2, records.encode(token, dict(identity, event="start", pid=os.getpid())))
    try:
        child = subprocess.Popen(program, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 close_fds=False, preexec_fn=_die_with_parent)
    except OSError as e:
        error = f"{program[0]}: {e.strerror}"
        _write(2, records.tag(rank, "stderr")
               + f"dtrain: rank {rank} on {host} cannot start {error}\n".encode("utf-8",
                                                                         "surrogateescape"))
        code = 126 if isinstance(e, PermissionError) else 127
        if token is not None:
            _write(2, records.encode(token, dict(identity, event="exit", code=code,
                                                 error=error)))
        return code

    def forward(number, _frame) -> None:
        try:
            child.send_signal(number)
        except OSError:
            pass
    for name in _FORWARDED_SIGNALS:
        signal.signal(getattr(signal, name), forward)

    relays = [threading.Thread(target=_relay, args=(child.stdout.fileno(), 1, rank, "stdout"),
                               daemon=True),
              threading.Thread(target=_relay, args=(child.stderr.fileno(), 2, rank, "stderr"),
                               daemon=True)]
    for relay in relays:
        relay.start()
    status = child.wait()
    for relay in relays:
        # A process the program left behind may still hold its streams open; its output after
        # the program ended is not waited for beyond this.
        relay.join(timeout=5)
    exit_signal: Optional[int] = -status if status < 0 else None
    payload = dict(identity, event="exit", code=status if status >= 0 else None,
                   signal=exit_signal)
    if token is not None:
        _write(2, records.encode(token, payload))
    return records.exit_code(payload)
