#!/usr/bin/env python3
"""Test program: each rank writes long lines whose every part says where it belongs, so that a
line cut into pieces, pieces joined in the wrong order or mixed with another rank's show:

    long_lines.py STDOUT_BYTES STDERR_BYTES LAST_BYTES

writes a line of STDOUT_BYTES to stdout (in writes of uneven sizes), a short line after it, a line
of STDERR_BYTES to stderr, and a last stdout line of LAST_BYTES without a newline. content() gives
each line's text; the tests import it."""
import os
import sys


def content(rank, stream, size):
    """`size` bytes: '<rank R stream offset NNNNNNNNNN>' repeated, each naming its own offset."""
    parts, length = [], 0
    while length < size:
        part = f"<rank {rank} {stream} offset {length:010d}>".encode()
        parts.append(part)
        length += len(part)
    return b"".join(parts)[:size]


def write_unevenly(stream, data):
    sizes = (1, 4095, 65537, 1000003)
    start, i = 0, 0
    while start < len(data):
        end = start + sizes[i % len(sizes)]
        stream.write(data[start:end])
        stream.flush()
        start, i = end, i + 1


if __name__ == "__main__":
    rank = os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "-1"))
    out_bytes, err_bytes, last_bytes = (int(a) for a in sys.argv[1:4])
    out, err = sys.stdout.buffer, sys.stderr.buffer
    write_unevenly(out, content(rank, "stdout", out_bytes) + b"\n")
    out.write(f"after the long line from {rank}\n".encode())
    out.flush()
    write_unevenly(err, content(rank, "stderr", err_bytes) + b"\n")
    write_unevenly(out, content(rank, "last", last_bytes))
