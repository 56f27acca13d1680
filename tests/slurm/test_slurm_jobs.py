#!/usr/bin/env python3
"""dtrain jobs through a real SLURM of one node with 2 CPUs (local_slurm.py): dtrainrun in a
batch script and as salloc's command, without flags; srun starting the ranks directly, with and
without a process manager interface; a failing rank's exit code as the job's; scancel; and
--restarts inside an allocation. Run as a script: exit 77 where SLURM cannot start
(slurm_test_support.py)."""
import os
import shlex
import socket
import sys
import time
import uuid

from slurm_test_support import (DTRAINRUN, PROBE, SlurmTest, main, plain_json, processes_with,
                                program, rank_json)
import local_slurm

HOST = socket.gethostname()  # the one node is named like this machine
RUN = shlex.quote(os.path.abspath(DTRAINRUN))


class InTheAllocation(SlurmTest):
    """dtrainrun run once in a job: hosts and slots from SLURM_*, ranks started through srun."""

    def test_sbatch_two_tasks_without_flags(self):
        self.need(PROBE)
        job_id, out = self.submit(
            f"{RUN} --verbose -- {PROBE} --elements 4096\n"
            f"{RUN} -- {program('env_report.py')} SLURM_JOB_ID SLURM_STEP_ID\n", "-n", "2")
        state, code, text = self.finish(job_id, out)
        self.assertEqual((state, code), ("COMPLETED", "0:0"), text)
        self.assertIn("dtrainrun: 2 ranks on", text)
        self.assertIn("-launcher slurm", text)
        self.assertIn("the ranks start through srun (Hydra's slurm launcher)", text)
        topology = rank_json(text, "topology")
        self.assertEqual(sorted(topology), [0, 1], text)
        self.assertTrue(all(t["size"] == 2 and t["local_size"] == 2 for t in topology.values()))
        allreduce = rank_json(text, "allreduce")
        self.assertEqual([allreduce[r]["wrong"] for r in (0, 1)], [0, 0], text)
        # The ranks are part of the job, in a step of their own (not the batch step): SLURM
        # tracks, signals and cleans them up.
        reports = [line for line in text.splitlines() if '"env"' in line]
        self.assertEqual(len(reports), 2, text)
        for line in reports:
            self.assertIn(f'"SLURM_JOB_ID": "{job_id}"', line)
            self.assertRegex(line, r'"SLURM_STEP_ID": "\d+"')

    def test_salloc_two_tasks(self):
        self.need(PROBE)
        done = self.run_client(["salloc", "-n", "2", DTRAINRUN, "--", PROBE, "--elements", "64"])
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertEqual(sorted(rank_json(done.stdout, "topology")), [0, 1], done.stdout)

    def test_a_failing_rank_is_the_jobs_exit_code(self):
        self.need(PROBE)
        job_id, out = self.submit(f"{RUN} -- {PROBE} --elements 64 --exit-rank 1 --exit-code 7\n",
                                  "-n", "2")
        state, code, text = self.finish(job_id, out)
        self.assertEqual((state, code), ("FAILED", "7:0"), text)
        self.assertIn(f"dtrainrun: job failed: rank 1 on {HOST} exited with code 7; exiting "
                      f"with 7", text)
        done = self.run_client(["salloc", "-n", "2", DTRAINRUN, "--", PROBE, "--elements", "64",
                                "--exit-rank", "0", "--exit-code", "5"])
        self.assertEqual(done.returncode, 5, done.stderr)

    def test_scancel_ends_every_rank(self):
        marker = uuid.uuid4().hex
        # Rank 7 does not exist: its entry only marks this job's processes.
        job_id, out = self.submit(
            f"{RUN} -- {program('exit_codes.py')} 0=hang 1=hang 7={marker}\n", "-n", "2")
        deadline = time.monotonic() + 30
        while self.cluster.read(out).count("started") < 2:
            self.assertLess(time.monotonic(), deadline, self.cluster.read(out))
            time.sleep(0.1)
        self.assertTrue(processes_with(marker))
        done = self.run_client(["scancel", job_id])
        self.assertEqual(done.returncode, 0, done.stderr)
        state, _, text = self.finish(job_id, out)
        self.assertEqual(state, "CANCELLED", text)
        # scancel's SIGTERM reaches dtrainrun, which reports it; SIGKILL follows KillWait later.
        deadline = time.monotonic() + local_slurm.KILL_WAIT_S + 10
        while processes_with(marker) and time.monotonic() < deadline:
            time.sleep(0.1)
        self.assertEqual(processes_with(marker), [], "processes of the job outlived scancel")
        text = self.cluster.read(out)
        self.assertIn("dtrainrun: interrupted by SIGTERM; exiting with 143", text)

    def test_restarts_inside_the_allocation(self):
        record = os.path.join(self.cluster.jobs_folder, f"attempts-{uuid.uuid4().hex[:8]}")
        job_id, out = self.submit(
            f"{RUN} --restarts 2 -- {program('attempts.py')} {record} 1 3\n", "-n", "2")
        state, code, text = self.finish(job_id, out)
        self.assertEqual((state, code), ("COMPLETED", "0:0"), text)
        self.assertIn(f"dtrainrun: restart 1 of 2: rank 1 on {HOST} exited with code 3", text)
        self.assertIn("dtrainrun: the job succeeded after 1 restart(s)", text)
        with open(record) as f:
            attempts = sorted(line.split()[:2] for line in f)
        self.assertEqual(attempts, [["rank=0", "attempt=0"], ["rank=0", "attempt=1"],
                                    ["rank=1", "attempt=0"], ["rank=1", "attempt=1"]])


class SrunStartsTheRanks(SlurmTest):
    """srun -n 2 with no dtrainrun in between, and srun -n 2 dtrainrun."""

    def test_srun_offers_pmi2(self):
        done = self.run_client(["srun", "--mpi=list"])
        self.assertIn("pmi2", done.stdout + done.stderr)

    def test_without_pmi_init_names_the_fix(self):
        # Debian's srun defaults to --mpi=none: MPICH then makes each task a one-rank job, and
        # dtrain::init() says so instead of letting both train alone (Note [One-rank worlds
        # under srun] in include/dtrain/runtime/engine/launch_check.hpp).
        self.need(PROBE)
        done = self.run_client(["srun", "-n", "2", PROBE, "--elements", "4096"])
        self.assertNotEqual(done.returncode, 0, done.stdout + done.stderr)
        self.assertEqual([r for r in plain_json(done.stdout) if r.get("probe") == "allreduce"],
                         [])
        self.assertIn("but MPI sees a job of 1 rank: srun gave the tasks no process manager "
                      "interface", done.stderr)
        self.assertIn("`srun --mpi=pmi2 -n 2 ...`", done.stderr)

    def test_with_pmi2_mpich_makes_one_job(self):
        self.need(PROBE)
        done = self.run_client(["srun", "--mpi=pmi2", "-n", "2", PROBE, "--elements", "4096"])
        self.assertEqual(done.returncode, 0, done.stderr)
        records = [r for r in plain_json(done.stdout) if r["probe"] == "allreduce"]
        self.assertEqual(sorted((r["rank"], r["wrong"]) for r in records), [(0, 0), (1, 0)])

    def test_srun_dtrainrun_without_pmi_is_refused(self):
        self.need(PROBE)
        began = time.monotonic()
        done = self.run_client(["srun", "-n", "2", DTRAINRUN, "--", PROBE])
        self.assertEqual(done.returncode, 2, done.stdout + done.stderr)
        self.assertLess(time.monotonic() - began, 30)
        self.assertEqual(done.stderr.count("dtrain: dtrainrun was started by srun"), 1,
                         done.stderr)
        self.assertIn("task 0 of 2", done.stderr)
        self.assertIn("srun --mpi=pmi2 -n 2 dtrainrun", done.stderr)
        self.assertEqual(done.stdout, "")

    def test_srun_dtrainrun_with_pmi2_runs_each_task_as_a_rank(self):
        self.need(PROBE)
        done = self.run_client(["srun", "--mpi=pmi2", "-n", "2", DTRAINRUN, "--", PROBE,
                                "--elements", "4096"])
        self.assertEqual(done.returncode, 0, done.stderr)
        topology = rank_json(done.stdout, "topology")
        self.assertEqual(sorted(topology), [0, 1], done.stdout)
        self.assertTrue(all(t["size"] == 2 for t in topology.values()), done.stdout)


if __name__ == "__main__":
    sys.exit(main(nodes=1))
