"""dtrainrun --restarts K: a failed job is started again, up to K times, with the reason printed;
when every attempt failed dtrainrun exits with 120. The test program keeps its own record of
attempts in a file, as a program resuming from its checkpoints would."""
import os
import signal
import socket
import subprocess
import tempfile
import unittest

from launcher_test_support import DTRAINRUN, clean_env, dtrainrun, program

HOST = socket.gethostname()
PROBE = os.environ.get("DTRAIN_TEST_PROBE")


class Restarts(unittest.TestCase):
    def setUp(self):
        folder = tempfile.TemporaryDirectory()
        self.addCleanup(folder.cleanup)
        self.record = os.path.join(folder.name, "attempts.txt")

    def attempts(self):
        with open(self.record) as f:
            return sorted(line.split() for line in f)

    def test_relaunched_until_it_succeeds(self):
        done = dtrainrun("--restarts", "3", "-np", "2", "--", program("attempts.py"),
                         self.record, "2", "3")
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertEqual(self.attempts(), [
            ["rank=0", f"attempt={a}", f"restart_count={a}"] for a in range(3)] + [
            ["rank=1", f"attempt={a}", f"restart_count={a}"] for a in range(3)])
        reason = f"rank 1 on {HOST} exited with code 3"
        self.assertIn(f"dtrainrun: restart 1 of 3: {reason}\n", done.stderr)
        self.assertIn(f"dtrainrun: restart 2 of 3: {reason}\n", done.stderr)
        self.assertNotIn("restart 3 of 3", done.stderr)
        self.assertIn("dtrainrun: the job succeeded after 2 restart(s)", done.stderr)

    def test_every_launch_knows_its_job_and_attempt(self):
        # DTRAINRUN_JOB_ID: one per dtrainrun, the same across its restarts; DTRAINRUN_ATTEMPT:
        # 0, then one more per restart (Note [Job identity] in tools/dtrain_launcher/mpi.py).
        jobs = os.path.join(os.path.dirname(self.record), "jobs.txt")
        for _ in range(2):
            if os.path.exists(self.record):
                os.remove(self.record)
            done = dtrainrun("--restarts", "3", "-np", "2", "--", program("attempts.py"),
                             self.record, "2", "3", env=clean_env(JOBS_FILE=jobs,
                                                                  DTRAINRUN_JOB_ID="outer",
                                                                  DTRAINRUN_ATTEMPT="9"))
            self.assertEqual(done.returncode, 0, done.stderr)
        with open(jobs) as f:
            lines = [dict(w.split("=", 1) for w in line.split()) for line in f]
        self.assertEqual(len(lines), 12)
        first, second = lines[:6], lines[6:]
        for launches in (first, second):
            self.assertEqual(sorted((e["rank"], e["attempt"]) for e in launches),
                             [(r, str(a)) for r in ("0", "1") for a in range(3)])
            self.assertEqual(len({e["job"] for e in launches}), 1, launches)
            self.assertRegex(launches[0]["job"], r"^[0-9]{8}-[0-9]{6}-[0-9]+-[0-9a-f]{8}$")
        self.assertNotEqual(first[0]["job"], second[0]["job"])

    def test_a_killed_rank_is_a_reason_to_restart(self):
        done = dtrainrun("--restarts", "1", "-np", "2", "--", program("attempts.py"),
                         self.record, "1", "SIGKILL")
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertIn(f"dtrainrun: restart 1 of 1: rank 1 on {HOST} was killed by signal 9 "
                      f"(SIGKILL)\n", done.stderr)
        self.assertEqual(len(self.attempts()), 4)

    def test_restarts_exhausted(self):
        done = dtrainrun("--restarts", "2", "-np", "2", "--", program("attempts.py"),
                         self.record, "99", "3")
        self.assertEqual(done.returncode, 120, done.stderr)
        self.assertEqual(len(self.attempts()), 6)
        self.assertIn(f"dtrain: the job failed 3 times, the last time because rank 1 on {HOST} "
                      f"exited with code 3; no restarts left (--restarts 2); exiting with 120",
                      done.stderr)

    def test_without_restarts_the_rank_code_is_kept(self):
        done = dtrainrun("-np", "2", "--", program("attempts.py"), self.record, "99", "3")
        self.assertEqual(done.returncode, 3, done.stderr)
        self.assertEqual(len(self.attempts()), 2)
        self.assertNotIn("restart", done.stderr)

    @unittest.skipUnless(PROBE, "DTRAIN_TEST_PROBE (the dtrain test program) is not set")
    def test_an_mpi_job(self):
        done = dtrainrun("--restarts", "1", "-np", "3", "--", PROBE, "--elements", "64",
                         "--exit-rank", "2", "--exit-code", "7")
        self.assertEqual(done.returncode, 120, done.stderr)
        self.assertIn(f"dtrainrun: restart 1 of 1: rank 2 on {HOST} exited with code 7",
                      done.stderr)

    def test_no_restart_after_an_interrupt(self):
        job = subprocess.Popen([DTRAINRUN, "--restarts", "3", "-np", "2", "--",
                                program("exit_codes.py"), "0=hang", "1=hang"],
                               env=clean_env(), stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            started = 0
            while started < 2:
                line = job.stdout.readline()
                self.assertNotEqual(line, "", "dtrainrun ended before both ranks started")
                started += "started" in line
            job.send_signal(signal.SIGTERM)
            out, err = job.communicate(timeout=60)
        finally:
            if job.poll() is None:
                job.kill()
                job.wait()
        self.assertEqual(job.returncode, 128 + signal.SIGTERM, err)
        self.assertIn("dtrainrun: interrupted by SIGTERM; exiting with 143", err)
        self.assertNotIn("restart 1", err)


if __name__ == "__main__":
    unittest.main()
