#!/usr/bin/env python3
"""Faults that end processes, driven around the MPI launcher (docs/reliability.md).

    run_faults.py --mpiexec MPIEXEC --program fault_program --np N SCENARIO

Scenarios where a rank leaves or freezes run with the launcher's automatic cleanup off (MPICH:
-disable-auto-cleanup), so the survivors live to report; each survivor must report the lost rank
and its host, the job must end, and its exit status must say it failed. `freeze` stops a rank
with SIGSTOP and no op timeout: only the heartbeats can tell the survivors. `kill-autocleanup`
and `kill-dtrainrun` show what the launchers do with a rank killed by a signal (they end the job
at once, naming the rank). `pause-all`, `pause-one` and `pause-one-no-timeout` stop ranks with
SIGSTOP for longer than the peer timeout and resume them (docs/reliability.md, "A pause is not a
death"): all ranks together must carry on; one rank alone is lost, unless the peer timeout is off.
Exit status 0 means the scenario behaved as documented.

With --mpi openmpi (Open MPI's mpirun) only the scenarios in which every rank stays alive until
the survivors have reported run: `stop`, `freeze`, `stop-timeout-of-rank0` and the pauses. A rank
that leaves the job (`kill`, `exit3`, `return0`, ...) makes mpirun end every other rank at once,
and it has no switch like Hydra's -disable-auto-cleanup to keep them (docs/running.md).
"""
import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

DEADLINE_S = 90  # the whole scenario; dtrain's own bound is documented as about 25 s
PAUSE_S = 8      # longer than PAUSE_PEER_TIMEOUT_S: silence that would end the job if counted
PAUSE_PEER_TIMEOUT_S = 3
# Every rank stays in the job until the survivors have reported (see the module's docstring).
OPENMPI_SCENARIOS = ("stop", "freeze", "stop-timeout-of-rank0", "pause-all", "pause-one",
                     "pause-one-no-timeout")


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


# How long the launcher may take to exit once the last rank has ended. Open MPI 4.1's mpirun, told
# not to end the job at the first rank that fails (orte_abort_on_non_zero_status 0), stays up
# after the last rank has gone when ranks left without MPI_Finalize, as survivors of a lost peer
# do (dtrain leaves MPI as it is then): it is ended after a few seconds, and the output says so.
launcher_exit_s = 30


def end_launcher(proc):
    """The rest of the launcher's output, once it has exited (or been ended)."""
    try:
        rest, _ = proc.communicate(timeout=launcher_exit_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        rest, _ = proc.communicate()
        rest += (f"(the launcher was still running {launcher_exit_s} s after the last rank "
                 f"ended: ended it)\n")
    return rest


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


def run_paused(cmd, env, cwd, np, paused_ranks):
    """Runs `cmd` (a `steps` job), stops `paused_ranks` with SIGSTOP for PAUSE_S once rank 0 is at
    step 100, resumes them, and returns (exit status, output). A rank still stopped when the job's
    survivors have finished is killed."""
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines, pids = [], {}
    start = time.monotonic()

    def signal_all(sig):
        for r in paused_ranks:
            try:
                os.kill(pids[r], sig)
            except ProcessLookupError:
                pass
    paused = False
    resume_at = 0.0
    for line in proc.stdout:
        lines.append(line)
        m = re.search(r"fault-report: rank (\d+) pid (\d+)", line)
        if m:
            pids[int(m.group(1))] = int(m.group(2))
        if "rank 0 at step 100" in line and not paused:
            if set(paused_ranks) - set(pids):
                fail(f"no pid reported by ranks {sorted(set(paused_ranks) - set(pids))}")
            signal_all(signal.SIGSTOP)
            paused = True
            print(f"stopped ranks {paused_ranks} for {PAUSE_S} s")
            # The survivors' reports arrive while the ranks are stopped; keep reading them.
            resume_at = time.monotonic() + PAUSE_S
            threading.Timer(PAUSE_S, signal_all, args=(signal.SIGCONT,)).start()
        if time.monotonic() - start > DEADLINE_S:
            signal_all(signal.SIGKILL)
            os.killpg(proc.pid, signal.SIGKILL)
            break
        if len(paused_ranks) < np and sum("saved and exits" in l for l in lines) == np - len(paused_ranks):
            time.sleep(max(0.0, resume_at - time.monotonic()) + 1)
            signal_all(signal.SIGKILL)
            break
    rest = end_launcher(proc)
    if not paused:
        fail("rank 0 never reached step 100")
    return proc.returncode, "".join(lines) + rest


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mpiexec", required=True)
    parser.add_argument("--program", required=True)
    parser.add_argument("--np", type=int, default=3)
    parser.add_argument("--dtrainrun", help="the dtrainrun script, for kill-dtrainrun")
    parser.add_argument("--mpi", choices=("mpich", "openmpi"), default="mpich",
                        help="the MPI of --mpiexec and --program")
    parser.add_argument("scenario")
    args = parser.parse_args()
    np, dead = args.np, args.np - 1
    env = dict(os.environ)
    host = os.uname().nodename
    global launcher_exit_s
    if args.mpi == "openmpi":
        launcher_exit_s = 5
        if args.scenario not in OPENMPI_SCENARIOS:
            fail(f"{args.scenario} needs MPICH's launcher: Open MPI's mpirun ends the whole job "
                 f"when a rank leaves it")
        # Root in a container, and more ranks than cores on a small machine.
        launch = [args.mpiexec, "--oversubscribe", "--allow-run-as-root", "--mca",
                  "orte_abort_on_non_zero_status", "0"]
    else:
        launch = [args.mpiexec, "-disable-auto-cleanup"]
    keep_survivors = launch + ["-n", str(np), args.program]
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
        elif s in ("stop", "freeze", "stop-timeout-of-rank0"):
            # stop: the op timeout ends the frozen collective. freeze: no op timeout, so the
            # survivors learn of the frozen rank from its missing heartbeats alone.
            # stop-timeout-of-rank0: only rank 0 sets the 2 s timeout, the others none; every
            # rank's watchdog must enforce rank 0's value (Note [Agreed settings]).
            env["DTRAIN_OP_TIMEOUT_SECONDS"] = "0" if s == "freeze" else "2"
            env["DTRAIN_PEER_TIMEOUT_SECONDS"] = "10"
            loop_args = [args.program, "loop", str(dead), "5", "stop"]
            command = launch + ["-n", str(np)] + loop_args
            if s == "stop-timeout-of-rank0":
                env["DTRAIN_PEER_TIMEOUT_SECONDS"] = "0"  # only the op timeout can end the wait
                # `env` sets one rank's variable the same way under either launcher.
                command = (launch + ["-n", "1", "env", "DTRAIN_OP_TIMEOUT_SECONDS=2"] +
                           loop_args + [":", "-n", str(np - 1), "env",
                                        "DTRAIN_OP_TIMEOUT_SECONDS=0"] + loop_args)
            proc_out = []
            # The frozen rank never exits on its own: run in the background and end it once the
            # survivors have reported.
            start = time.monotonic()
            proc = subprocess.Popen(command, env=env,
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
            rest = end_launcher(proc)
            out = "".join(proc_out) + rest
            print(out)
            if s != "freeze":
                check_survivors(out, np, dead, ["'big'", "DTRAIN_OP_TIMEOUT_SECONDS"],
                                "TimeoutError")
                print(f"measured: every survivor had its error, saved and exited {took:.1f} s "
                      "after the job started")
            else:
                check_survivors(out, np, dead, [f"rank {dead} on host {host} stopped responding"])
                print(f"measured: every survivor had its error, saved and exited {took:.1f} s "
                      "after the job started")
        elif s in ("pause-all", "pause-one", "pause-one-no-timeout"):
            env["DTRAIN_PEER_TIMEOUT_SECONDS"] = "0" if s == "pause-one-no-timeout" else str(PAUSE_PEER_TIMEOUT_S)
            paused = list(range(np)) if s == "pause-all" else [dead]
            cmd = launch + ["-n", str(np), args.program, "steps", "400"]
            rc, out = run_paused(cmd, env, work, np, paused)
            print(out)
            if s == "pause-one":
                check_survivors(out, np, dead, [f"rank {dead} on host {host} stopped responding",
                                                "DTRAIN_PEER_TIMEOUT_SECONDS"])
                if rc == 0:
                    fail("the launcher reported success for a job that lost a rank")
            else:
                for rank in range(np):
                    if f"rank {rank} finished 400 steps, results exact: true" not in out:
                        fail(f"rank {rank} did not finish every step with exact results")
                if rc != 0:
                    fail(f"the job carried on but exited with status {rc}")
            print(f"measured: {s} with a {PAUSE_S} s pause under a "
                  f"{env['DTRAIN_PEER_TIMEOUT_SECONDS']} s peer timeout: exit status {rc}")
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
