#!/usr/bin/env python3
"""Test program: each rank ends as told by `RANK=HOW[@SECONDS]` arguments, after SECONDS (default
0): HOW is an exit code, a signal name (SIGKILL, SIGSEGV, ...) to kill itself with, or `hang` to
sleep until killed. Ranks not named exit 0. Every rank first prints `rank R started`."""
import os
import signal
import sys
import time

rank = int(os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "-1")))
print(f"rank {rank} started", flush=True)
plan = {}
for arg in sys.argv[1:]:
    who, how = arg.split("=", 1)
    how, _, delay = how.partition("@")
    plan[int(who)] = (how, float(delay or 0))
how, delay = plan.get(rank, ("0", 0.0))
time.sleep(delay)
if how == "hang":
    while True:
        time.sleep(3600)
if how.startswith("SIG"):
    os.kill(os.getpid(), getattr(signal, how))
    time.sleep(10)
sys.exit(int(how))
