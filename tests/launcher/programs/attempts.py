#!/usr/bin/env python3
"""Test program for restarts: appends `rank=R attempt=A restart_count=C` to FILE, where A counts
the attempts found in FILE (as a program resuming from its own checkpoints would), then fails the
first FAILURES attempts with HOW (an exit code, or a signal name) on rank 1 while the other
ranks exit 0, and succeeds afterwards. With JOBS_FILE set, it also appends
`rank=R job=<DTRAINRUN_JOB_ID> attempt=<DTRAINRUN_ATTEMPT>` to that file.

    attempts.py FILE FAILURES HOW
"""
import fcntl
import os
import signal
import sys
import time

path, failures, how = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rank = int(os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "-1")))
with open(path, "a+") as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    f.seek(0)
    attempt = sum(1 for line in f if line.startswith(f"rank={rank} "))
    f.write(f"rank={rank} attempt={attempt} "
            f"restart_count={os.environ.get('DTRAINRUN_RESTART_COUNT')}\n")
if os.environ.get("JOBS_FILE"):
    with open(os.environ["JOBS_FILE"], "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.write(f"rank={rank} job={os.environ.get('DTRAINRUN_JOB_ID')} "
                f"attempt={os.environ.get('DTRAINRUN_ATTEMPT')}\n")
print(f"rank {rank} attempt {attempt}", flush=True)
if rank == 1 and attempt < failures:
    if how.startswith("SIG"):
        os.kill(os.getpid(), getattr(signal, how))
        time.sleep(10)
    sys.exit(int(how))
