"""What a rank's wrapper tells dtrainrun through the rank's output streams.

Note [Rank records]
The MPI launchers cannot say which rank failed first or with which code: Hydra answers a rank
that exits with 3 by killing the others and exiting with 9 (their SIGKILL). So every rank runs
inside a small wrapper (rank.py) that starts the program, tags each line it prints, and writes
one record line when the program starts and one when it ends, on the rank's stderr. The
launcher carries those lines to dtrainrun like any output, from every host, so dtrainrun learns
each rank's fate without any channel of its own. A record is
    \\x1edtrainrun:<job token> {"event": "exit", "rank": 1, "host": "node2", "code": 3}
where the token is fresh for every attempt, so program output cannot be mistaken for a record.
"""
from __future__ import annotations

import json
import re
import secrets
import signal
import tempfile
from typing import Dict, Iterator, Optional, Tuple

MARK = "\x1edtrainrun:"
_RECORD = re.compile(rb"\x1edtrainrun:([0-9a-f]+) (\{[^\n]*?\})(?=\n|$)")
_TAG = re.compile(rb"^\[([0-9]{1,9}|\?)\]<(stdout|stderr)>(\+?):")

# Note [Line pieces]
# The launchers pass a rank's output on in chunks of what they happened to read, and a chunk of
# one rank can land between two chunks of another. A write of at most PIPE_BUF (4096) bytes into
# a pipe is never split, so the wrapper writes every line as pieces of at most PIECE_BYTES: a long
# line becomes `[r]<stdout>+:piece` lines ("more follows") and a final `[r]<stdout>:piece`, which
# dtrainrun joins again per rank and stream. The wrapper passes a long line on piece by piece as
# the program writes it (Splitter), so it holds no more than a read and a piece of it; dtrainrun
# holds the pieces of an unfinished line until its last piece arrives, in memory up to
# SPILL_BYTES and in an anonymous temporary file beyond that (Line), and then prints the line
# whole, with one tag. Lines are never cut, however long; a line that never ends (a program that
# writes megabytes without a newline) costs dtrainrun temporary file space, not memory.
PIECE_BYTES = 4000
SPILL_BYTES = 1 << 20

def new_token() -> str:
    return secrets.token_hex(8)


def encode(token: str, payload: Dict[str, object]) -> bytes:
    return f"{MARK}{token} {json.dumps(payload, sort_keys=True)}\n".encode()


def tag(rank: str, stream: str, continued: bool = False) -> bytes:
    return f"[{rank}]<{stream}>{'+' if continued else ''}:".encode()


def pieces(rank: str, stream: str, line: bytes) -> Iterator[bytes]:
    """A line (ending in a newline) as tagged pieces (Note [Line pieces])."""
    body = line[:-1] if line.endswith(b"\n") else line
    head = tag(rank, stream)
    if len(head) + len(body) < PIECE_BYTES:
        yield head + body + b"\n"
        return
    more = tag(rank, stream, continued=True)
    size = PIECE_BYTES - len(more) - 1
    starts = range(0, len(body), size)
    for start in starts:
        last = start + size >= len(body)
        yield (head if last else more) + body[start:start + size] + b"\n"


class Splitter:
    """The wrapper's side of Note [Line pieces]: a program's stream in, tagged pieces out. What
    it keeps between calls is less than one piece of the line being written."""

    def __init__(self, rank: str, stream: str):
        self.rank, self.stream = rank, stream
        self.more = tag(rank, stream, continued=True)
        self.size = PIECE_BYTES - len(self.more) - 1
        self.pending = bytearray()
        self.open = False  # pieces of the current line went out already

    def feed(self, data: bytes, final: bool = False) -> Iterator[bytes]:
        """Pieces for `data`; with `final` (the stream ended), the last line's as well, ended
        with a newline if the program left it without one."""
        self.pending += data
        for line in iter_lines(self.pending, final=False):
            yield from pieces(self.rank, self.stream, line)
            self.open = False
        while len(self.pending) >= self.size:
            yield self.more + bytes(self.pending[:self.size]) + b"\n"
            del self.pending[:self.size]
            self.open = True
        if final and (self.pending or self.open):
            yield from pieces(self.rank, self.stream, bytes(self.pending) + b"\n")
            self.pending.clear()
            self.open = False


class Line:
    """dtrainrun's side of Note [Line pieces]: one rank's line joined from its pieces, held in
    memory up to `spill_bytes` and in an anonymous temporary file beyond that. If no temporary
    file can be written (no space, no $TMPDIR), the rest stays in memory: the line is never cut."""

    def __init__(self, spill_bytes: int = SPILL_BYTES):
        self.spill_bytes = spill_bytes
        self.memory = bytearray()
        self.file = None     # the temporary file: its first file_bytes come before `memory`
        self.file_bytes = 0

    def append(self, data: bytes) -> None:
        self.memory += data
        if len(self.memory) > self.spill_bytes:
            self._spill()

    def _spill(self) -> None:
        view = memoryview(self.memory)
        try:
            if self.file is None:
                self.file = tempfile.TemporaryFile(prefix="dtrainrun-line-", buffering=0)
            # After a failed write the file may hold part of `memory`; file_bytes ends the part
            # that counts.
            self.file.seek(self.file_bytes)
            while view:
                view = view[self.file.write(view):]
        except OSError:
            return  # kept in memory; the next append tries again
        finally:
            view.release()
        self.file_bytes += len(self.memory)
        self.memory = bytearray()

    def chunks(self, chunk_bytes: int = 1 << 20) -> Iterator[bytes]:
        """The line's bytes in order, in chunks of at most `chunk_bytes`; again from the start
        on every call."""
        if self.file is not None:
            self.file.seek(0)
            left = self.file_bytes
            while left > 0:
                block = self.file.read(min(chunk_bytes, left))
                if not block:  # the file is this process's own and unnamed: not reached
                    break
                left -= len(block)
                yield block
        if self.memory:
            yield bytes(self.memory)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None


def split_records(line: bytes, token: str) -> Tuple[bytes, list]:
    """Removes this job's records from a line; returns what is left and the records. A record
    can share a line with a partial output line that the launcher delivered just before it."""
    found = []

    def keep(match) -> bytes:
        if match.group(1).decode() != token:
            return match.group(0)
        try:
            found.append(json.loads(match.group(2)))
        except ValueError:
            return match.group(0)
        return b""
    rest = _RECORD.sub(keep, line)
    return rest, found


def parse_tag(line: bytes) -> Tuple[Optional[int], Optional[str], bool, bytes]:
    """(rank, stream, whether more pieces follow, text without the tag) of a tagged line;
    (None, None, False, line) otherwise."""
    m = _TAG.match(line)
    if not m:
        return None, None, False, line
    rank = None if m.group(1) == b"?" else int(m.group(1))
    return rank, m.group(2).decode(), m.group(3) == b"+", line[m.end():]


def exit_code(payload: Dict[str, object]) -> int:
    """The shell's convention: the exit code, or 128 + N for a process killed by signal N."""
    if payload.get("signal") is not None:
        return 128 + int(payload["signal"])  # type: ignore[arg-type]
    return int(payload.get("code", 1))  # type: ignore[arg-type]


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def describe_exit(payload: Dict[str, object]) -> str:
    where = f"rank {payload.get('rank')} on {payload.get('host')}"
    if payload.get("error"):
        return f"{where} could not start the program: {payload['error']}"
    if payload.get("signal") is not None:
        number = int(payload["signal"])  # type: ignore[arg-type]
        return f"{where} was killed by signal {number} ({signal_name(number)})"
    return f"{where} exited with code {payload.get('code')}"


def iter_lines(buffer: bytearray, final: bool) -> Iterator[bytes]:
    """Takes complete lines (with their newline) off the front of `buffer`; with `final`, also
    the unterminated rest."""
    while True:
        end = buffer.find(b"\n")
        if end < 0:
            break
        line = bytes(buffer[:end + 1])
        del buffer[:end + 1]
        yield line
    if final and buffer:
        line = bytes(buffer) + b"\n"
        buffer.clear()
        yield line
