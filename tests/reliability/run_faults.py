#!/usr/bin/env python3
"""Faults that end processes, driven around the MPI launcher (docs/reliability.md).

    run_faults.py --mpiexec MPIEXEC --program fault_program --np N SCENARIO

Scenarios where a rank leaves or freezes run with the launcher's automatic cleanup off (MPICH:
-disable-auto-cleanup), so the survivors live to report; each survivor must report the lost rank
and its host, the job must end, and its exit status must say it failed. `freeze` stops a rank
with SIGSTOP and no op timeout: only the heartbeats can tell the survivors. `kill-autocleanup`
and `kill-dtrainrun` show what the launchers do with a rank killed by a signal (they end the job
at once, naming the rank). Exit status 0 means the scenario behaved as documented.
"""
import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

DEADLINE_S = 90  # the whole scenario; dtrain's own bound is documented as about 25 s


def run(cmd, env, cwd):
    start = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=DEADLINE_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        print(out)
        fail(f"the job did not end within {DEADLINE_S} s")
    return proc.returncode, out, time.monotonic() - start


def fail(message):
    print(f"FAILED: {message}")
    sys.exit(1)


def reports(out):
    return [line.split("fault-report:", 1)[1].strip() for line in out.splitlines()
            if "fault-report:" in line]


def check_survivors(out, np, dead, fragments, error_class="ShutdownError"):
    lines = reports(out)
    for rank in range(np):
        if rank == dead:
            continue
        caught = [l for l in lines if l.startswith(f"rank {rank} caught {error_class}:")]
        if not caught:
            fail(f"rank {rank} did not report a {error_class}; reports: {lines}")
        for f in fragments:
            if f not in caught[0]:
                fail(f"rank {rank}'s report lacks '{f}': {caught[0]}")
        if f"rank {rank} saved and exits" not in lines:
            fail(f"rank {rank} could not save and exit after the error")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mpiexec", required=True)
    parser.add_argument("--program", required=True)
    parser.add_argument("--np", type=int, default=3)
    parser.add_argument("--dtrainrun", help="the dtrainrun script, for kill-dtrainrun")
    parser.add_argument("scenario")
    args = parser.parse_args()
    np, dead = args.np, args.np - 1
    env = dict(os.environ)
    host = os.uname().nodename
    keep_survivors = [args.mpiexec, "-disable-auto-cleanup", "-n", str(np), args.program]
    with tempfile.TemporaryDirectory() as work:
        s = args.scenario
        if s in ("kill", "segv", "exit3", "return0"):
            rc, out, took = run(keep_survivors + ["loop", str(dead), "20", s], env, work)
            print(out)
            if s == "return0":
                fragments = [f"rank {dead} on host {host} left main() (exit status 0) without "
                             "calling dtrain::shutdown()"]
            elif s == "exit3":
                # Leaving main() through exit() looks the same to dtrain; the status is kept.
                fragments = [f"rank {dead} on host {host} left main() (exit status 3)"]
            else:
                fragments = [f"rank {dead} on host {host} stopped responding"]
            check_survivors(out, np, dead, fragments)
            if rc == 0:
                fail("the launcher reported success for a job that lost a rank")
            print(f"measured: job ended {took:.1f} s after it started (the rank died at step 20, "
                  f"about 0.1 s in); launcher exit status {rc}")
        elif s in ("stop", "freeze"):
            # stop: the op timeout ends the frozen collective. freeze: no op timeout, so the
            # survivors learn of the frozen rank from its missing heartbeats alone.
            env["DTRAIN_OP_TIMEOUT_SECONDS"] = "2" if s == "stop" else "0"
            proc_out = []
            # The frozen rank never exits on its own: run in the background and end it once the
            # survivors have reported.
            start = time.monotonic()
            proc = subprocess.Popen(keep_survivors + ["loop", str(dead), "5", "stop"], env=env,
                                    cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True, start_new_session=True)
            pid = None
            survivors_done = 0
            for line in proc.stdout:
                proc_out.append(line)
                m = re.search(rf"fault-report: rank {dead} pid (\d+)", line)
                if m:
                    pid = int(m.group(1))
                if "saved and exits" in line:
                    survivors_done += 1
                    if survivors_done == np - 1:
                        break
                if time.monotonic() - start > DEADLINE_S:
                    break
            took = time.monotonic() - start
            if pid:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                rest, _ = proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                rest, _ = proc.communicate()
            out = "".join(proc_out) + rest
            print(out)
            if s == "stop":
                check_survivors(out, np, dead, ["'big'", "DTRAIN_OP_TIMEOUT_SECONDS"],
                                "TimeoutError")
                print(f"measured: every survivor had its error, saved and exited {took:.1f} s "
                      "after the job started")
            else:
                check_survivors(out, np, dead, [f"rank {dead} on host {host} stopped responding"])
                print(f"measured: every survivor had its error, saved and exited {took:.1f} s "
                      "after the job started")
        elif s == "kill-autocleanup":
            rc, out, took = run([args.mpiexec, "-n", str(np), args.program, "loop", str(dead),
                                 "20", "kill"], env, work)
            print(out)
            if rc == 0:
                fail("the launcher reported success for a job that lost a rank")
            if "KILLED BY SIGNAL: 9" not in out and "signal 9" not in out:
                fail("the launcher did not name the killed process")
            print(f"measured: the launcher ended the job {took:.1f} s after it started; "
                  f"exit status {rc}")
        elif s == "kill-dtrainrun":
            if not args.dtrainrun:
                fail("kill-dtrainrun needs --dtrainrun")
            rc, out, took = run([sys.executable, args.dtrainrun, "-np", str(np), "--",
                                 args.program, "loop", str(dead), "20", "kill"], env, work)
            print(out)
            if rc != 128 + signal.SIGKILL:
                fail(f"dtrainrun exited with {rc}, not the killed rank's {128 + signal.SIGKILL}")
            if f"rank {dead} on {host} was killed by signal 9 (SIGKILL)" not in out:
                fail("dtrainrun did not name the killed rank and the signal")
            print(f"measured: dtrainrun ended the job {took:.1f} s after it started; "
                  f"exit status {rc}")
        else:
            fail(f"unknown scenario {s}")
    print("PASSED")


if __name__ == "__main__":
    main()
