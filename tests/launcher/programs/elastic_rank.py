#!/usr/bin/env python3
"""Test program: a rank of an elastic job, without MPI. It plays the ranks' side of Note [Elastic
notification protocol] (tools/dtrain_launcher/elastic_notify.py) with the files in STATE:

    elastic_rank.py STATE [--deaf]

Every 0.1 s it takes a step; rank 0 then commits the step number (STATE/commit.G for generation
G, replaced atomically), as a trainer commits its state. At its start a rank resumes from the
newest commit of an earlier generation (a rank that starts late must not see what rank 0 of its
own world committed meanwhile) and appends `start gen=G rank=R size=S restart_count=K step=N
job=<DTRAINRUN_JOB_ID> attempt=<DTRAINRUN_ATTEMPT>` to STATE/log; at its end `exit gen=G rank=R code=C step=N`. After each step it asks dtrainrun's
notification server (`GEN`) and exits with 75 when the answer's generation is greater than its
own (--deaf: never asks, as a program without elastic support). The test steers it with files:
STATE/finish ends every rank with 0, STATE/exit.G.R ends rank R of generation G with the code in
the file (or the signal it names, e.g. SIGKILL)."""
import os
import signal
import socket
import sys
import time

state, deaf = sys.argv[1], "--deaf" in sys.argv[2:]
rank = int(os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "-1")))
size = int(os.environ.get("PMI_SIZE", os.environ.get("OMPI_COMM_WORLD_SIZE", "-1")))
generation = int(os.environ["DTRAIN_ELASTIC_GENERATION"])
notify = os.environ["DTRAIN_ELASTIC_NOTIFY"]
restart_count = os.environ.get("DTRAINRUN_RESTART_COUNT")


def log(text):
    with open(os.path.join(state, "log"), "a") as f:
        f.write(text + "\n")


def committed():
    for earlier in range(generation - 1, -1, -1):
        try:
            with open(os.path.join(state, f"commit.{earlier}")) as f:
                return int(f.read())
        except FileNotFoundError:
            continue
    return 0


def commit(step):
    path = os.path.join(state, f"commit.{generation}")
    with open(path + ".tmp", "w") as f:
        f.write(str(step))
    os.replace(path + ".tmp", path)


def ask():
    """(target generation, size), or None when dtrainrun cannot be reached."""
    address, _, port = notify.rpartition(":")
    try:
        with socket.create_connection((address, int(port)), timeout=2) as s:
            s.sendall(b"GEN\n")
            answer = s.makefile("rb").readline().decode()
    except OSError:
        return None
    words = answer.split()
    if len(words) != 3 or words[0] != "GEN":
        raise SystemExit(f"rank {rank}: unexpected answer {answer!r}")
    return int(words[1]), int(words[2])


def end(code, step):
    log(f"exit gen={generation} rank={rank} code={code} step={step}")
    sys.stdout.flush()
    if isinstance(code, str):
        os.kill(os.getpid(), getattr(signal, code))
        time.sleep(10)
    sys.exit(code)


step = committed()
log(f"start gen={generation} rank={rank} size={size} restart_count={restart_count} step={step} "
    f"job={os.environ.get('DTRAINRUN_JOB_ID')} attempt={os.environ.get('DTRAINRUN_ATTEMPT')}")
print(f"rank {rank} of {size} in generation {generation} from step {step}", flush=True)
while True:
    time.sleep(0.1)
    step += 1
    if rank == 0:
        commit(step)
    if os.path.exists(os.path.join(state, "finish")):
        end(0, step)
    order = os.path.join(state, f"exit.{generation}.{rank}")
    if os.path.exists(order):
        with open(order) as f:
            how = f.read().strip()
        end(how if how.startswith("SIG") else int(how), step)
    if not deaf:
        answer = ask()
        if answer is not None and answer[0] > generation:
            end(75, step)
