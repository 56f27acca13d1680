"""dtrain-report on a folder that holds several runs (Note [Profile layout] in
include/dtrain/profile/run_folder.hpp): <folder>/<run-id>/ and, under dtrainrun,
<folder>/<job-id>/attempt-<n>/. It reads one run, never a mix: the newest, or the one --run and
--attempt name, and says which it read and which others it found. Files that are not regular
files (a FIFO named like a profile) are skipped, never read: the report runs in a subprocess with
a timeout, so a read that blocks fails the test instead of hanging it."""

import os
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import synthetic  # noqa: E402

REPORT = Path(__file__).resolve().parents[2] / "tools" / "dtrain-report"
MINUTE_MS = 60e3


def report(*args, timeout: float = 60) -> tuple[int, str, str]:
    """dtrain-report in its own process; one that blocks past `timeout` fails the test."""
    try:
        done = subprocess.run([sys.executable, str(REPORT), *map(str, args)], capture_output=True,
                              text=True, timeout=timeout,
                              env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    except subprocess.TimeoutExpired:
        raise AssertionError(f"dtrain-report {' '.join(map(str, args))} did not finish within "
                             f"{timeout:g} s (blocked reading?)") from None
    return done.returncode, " ".join(done.stdout.split()), " ".join(done.stderr.split())


def write_run(folder: Path, run_id: str, started_min: float, steps: int, job=None,
              attempt=None, closed=True, ranks=2) -> Path:
    """A run as dtrain writes it; `started_min`: minutes after a fixed time."""
    def header(rank):
        h = {"start_unix_ms": 1.7e12 + started_min * MINUTE_MS}
        if job is not None:
            h.update(job_id=job, attempt=attempt)
        return h
    return synthetic.write_run(folder, ranks=ranks, steps=steps, run_id=run_id, header=header,
                               closed=closed)


class Runs(unittest.TestCase):
    def setUp(self):
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        self.tmp = Path(tmp.name)
        self.prof = self.tmp / "prof"
        self.out = self.tmp / "r.html"

    def test_two_runs_in_one_folder_are_never_mixed(self):
        write_run(self.prof / "18aa-1", "18aa-1", 0, steps=30, ranks=3)
        write_run(self.prof / "18bb-2", "18bb-2", 5, steps=40, ranks=2)
        code, out, err = report(self.prof, "-o", self.out)
        self.assertEqual(code, 0, err)
        self.assertIn("dtrain-report: 2 of 2 rank(s) on 1 host(s), steps 0-39 (40 recorded), "
                      "run 18bb-2", out)
        self.assertIn("note: the input holds 2 runs, which are never merged: this report is of "
                      "run 18bb-2, the newest. Not read: 18aa-1: 3 of 3 rank(s), in 18aa-1, "
                      "started 2023-11-14 22:13:20 UTC. Choose another with --run ID", out)
        html = self.out.read_text()
        self.assertIn("Read: 18bb-2/rank-0.jsonl, 18bb-2/rank-1.jsonl", html)
        self.assertIn("the input holds 2 runs", html)

        code, out, err = report(self.prof, "-o", self.out, "--run", "18aa-1")
        self.assertEqual(code, 0, err)
        self.assertIn("3 of 3 rank(s) on 1 host(s), steps 0-29 (30 recorded), run 18aa-1", out)
        self.assertIn("this report is of run 18aa-1, chosen with --run 18aa-1. Not read: 18bb-2",
                      out)

        code, out, err = report(self.prof, "-o", self.out, "--run", "nope")
        self.assertEqual(code, 1)
        self.assertIn("dtrain-report: no run 'nope' among the 2 run(s) found (newest first: "
                      "18bb-2 in 18bb-2; 18aa-1 in 18aa-1): give --run a run id", err)

        code, out, err = report(self.prof, "--list-runs")
        self.assertEqual(code, 0, err)
        self.assertRegex(out, r"^18bb-2: 2 of 2 rank\(s\), in 18bb-2, .* 18aa-1: 3 of 3 rank")

        # A run's own folder is a profile too.
        code, out, err = report(self.prof / "18aa-1", "-o", self.out)
        self.assertEqual(code, 0, err)
        self.assertIn("run 18aa-1", out)
        self.assertNotIn("the input holds", out)

    def test_a_single_run_in_the_old_layout_reads_as_before(self):
        write_run(self.prof, "old-run", 0, steps=20)
        code, out, err = report(self.prof, "-o", self.out)
        self.assertEqual(code, 0, err)
        self.assertIn("steps 0-19 (20 recorded), run old-run", out)
        self.assertNotIn("the input holds", out)
        self.assertIn("Read: rank-0.jsonl, rank-1.jsonl", self.out.read_text())

    def test_the_attempts_of_a_dtrainrun_job(self):
        job = self.prof / "job-7"
        write_run(job / "attempt-0", "18aa-1", 0, steps=30, job="job-7", attempt=0, closed=False)
        write_run(job / "attempt-1", "18bb-2", 3, steps=40, job="job-7", attempt=1)
        write_run(self.prof / "17ff-9", "17ff-9", -60, steps=10)  # an older run without dtrainrun

        code, out, err = report(self.prof, "-o", self.out)
        self.assertEqual(code, 0, err)
        self.assertIn("steps 0-39 (40 recorded), run 18bb-2 (job job-7, attempt 1)", out)
        self.assertIn("the input holds 3 runs, which are never merged: this report is of run "
                      "18bb-2 (job job-7, attempt 1), the newest. Not read: 18aa-1 (job job-7, "
                      "attempt 0): 2 of 2 rank(s), in job-7/attempt-0, started 2023-11-14 "
                      "22:13:20 UTC, did not end cleanly, last step 29; 17ff-9: 2 of 2 rank(s)",
                      out)
        self.assertNotIn("note: the job did not end cleanly", out)  # that was attempt 0

        for choice in (["--attempt", "0"], ["--run", "job-7", "--attempt", "0"],
                       ["--run", "job-7/attempt-0"], ["--run", "attempt-0"], ["--run", "18aa-1"]):
            with self.subTest(choice):
                code, out, err = report(self.prof, "-o", self.out, *choice)
                self.assertEqual(code, 0, err)
                self.assertIn("steps 0-29 (30 recorded), run 18aa-1 (job job-7, attempt 0)", out)
                self.assertIn("note: the job did not end cleanly", out)
        code, out, err = report(self.prof, "-o", self.out, "--run", "job-7")
        self.assertIn("run 18bb-2 (job job-7, attempt 1)", out)  # a job: its newest attempt

        code, out, err = report(self.prof, "-o", self.out, "--attempt", "5")
        self.assertEqual(code, 1)
        self.assertIn("dtrain-report: no attempt 5 of job job-7: it has attempt(s) 0, 1 here", err)
        code, out, err = report(self.prof, "-o", self.out, "--run", "17ff-9", "--attempt", "0")
        self.assertEqual(code, 1)
        self.assertIn("--attempt 0: run 17ff-9 was not started by dtrainrun and has no "
                      "attempts; name a job with --run JOB_ID", err)
        code, out, err = report(self.prof, "-o", self.out, "--attempt", "-1")
        self.assertEqual(code, 2)
        self.assertIn("attempts count from 0", err)

        code, out, err = report(job, "--list-runs")  # the job's folder
        self.assertEqual(code, 0, err)
        self.assertRegex(out, r"^18bb-2 \(job job-7, attempt 1\): 2 of 2 rank\(s\), in attempt-1, "
                              r".* 18aa-1 \(job job-7, attempt 0\): .* did not end cleanly, last "
                              r"step 29$")

    def test_the_newest_run_without_attempts_says_so(self):
        write_run(self.prof / "18aa-1", "18aa-1", 0, steps=5)
        code, out, err = report(self.prof, "-o", self.out, "--attempt", "0")
        self.assertEqual(code, 1)
        self.assertIn("--attempt 0: the newest run, 18aa-1, was not started by dtrainrun and has "
                      "no attempts", err)

    def test_a_header_with_a_bad_attempt_drops_it_with_a_note(self):
        write_run(self.prof, "r", 0, steps=5, job="j", attempt="first")
        code, out, err = report(self.prof, "-o", self.out)
        self.assertEqual(code, 0, err)
        self.assertIn("run r (job j)", out)
        self.assertIn("skipped: rank-0.jsonl: header field attempt is not valid and was ignored",
                      out)


@unittest.skipUnless(hasattr(os, "mkfifo"), "no named pipes here")
class NotRegularFiles(unittest.TestCase):
    def setUp(self):
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        self.tmp = Path(tmp.name)
        self.out = self.tmp / "r.html"

    def test_a_fifo_named_like_a_profile_is_skipped_not_read(self):
        prof = write_run(self.tmp / "prof", "run-1", 0, steps=10)
        (prof / "rank-1.jsonl").unlink()
        os.mkfifo(prof / "rank-1.jsonl")  # nobody writes it: opening it to read would block
        os.mkfifo(prof / "rank-2.jsonl")
        code, out, err = report(prof, "-o", self.out, timeout=30)
        self.assertEqual(code, 0, err)
        self.assertIn("skipped: rank-1.jsonl: a FIFO (named pipe), not a regular file; skipped "
                      "(reading it could wait forever)", out)
        self.assertIn("skipped: rank-2.jsonl: a FIFO (named pipe)", out)
        self.assertIn("no profile for rank(s) 1 of 2", out)
        code, out, err = report(prof, "--list-runs", timeout=30)
        self.assertEqual(code, 0, err)
        self.assertIn("run-1: 1 of 2 rank(s)", out)

    def test_a_fifo_in_a_run_folder_or_named_alone(self):
        prof = self.tmp / "prof"
        write_run(prof / "run-1", "run-1", 0, steps=10)
        os.mkfifo(prof / "run-1" / "rank-5.jsonl")
        code, out, err = report(prof, "-o", self.out, timeout=30)
        self.assertEqual(code, 0, err)
        self.assertIn("skipped: run-1/rank-5.jsonl: a FIFO (named pipe), not a regular file", out)
        code, out, err = report(prof / "run-1" / "rank-5.jsonl", "-o", self.out, timeout=30)
        self.assertEqual(code, 1)
        self.assertIn("dtrain-report: nothing to report from", err)
        self.assertIn("rank-5.jsonl: a FIFO (named pipe), not a regular file", err)

    def test_a_fifo_that_replaces_a_file_after_the_listing_is_not_read(self):
        """The reader checks what it opened, not only what the listing saw."""
        fifo = self.tmp / "rank-0.jsonl"
        os.mkfifo(fifo)
        code = ("import sys; from pathlib import Path; "
                "from dtrain_report.profile_reader import read_rank_file; skipped = []; "
                "assert read_rank_file(Path(sys.argv[1]), skipped) is None; print(skipped[0])")
        try:
            done = subprocess.run([sys.executable, "-c", code, str(fifo)], capture_output=True,
                                  text=True, timeout=30,
                                  env={**os.environ, "PYTHONPATH": str(REPORT.parent)})
        except subprocess.TimeoutExpired:
            raise AssertionError("read_rank_file blocked on a FIFO") from None
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertIn("rank-0.jsonl: a FIFO (named pipe), not a regular file", done.stdout)

if __name__ == "__main__":
    unittest.main()
