#!/usr/bin/env python3
"""Test program: writes a known set of lines to stdout and stderr, including an empty line, a
long line, bytes that are not UTF-8 and a last line without a newline."""
import os
import sys

rank = os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "-1"))
out, err = sys.stdout.buffer, sys.stderr.buffer
out.write(f"hello from {rank}\n".encode())
out.write(b"\n")
out.write(b"x" * 100000 + b"\n")
out.write(b"bytes \xff\xfe end\n")
out.flush()
err.write(f"warning from {rank}\n".encode())
err.flush()
out.write(b"two parts ")
out.flush()
out.write(f"of one line from {rank}\n".encode())
out.write(f"no newline from {rank}".encode())
out.flush()
