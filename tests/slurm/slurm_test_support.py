"""What the SLURM tests share: the programs under test, one private cluster per test file
(local_slurm.py), and a main() that reports a machine where SLURM cannot start as skipped.

A test file runs as a script (`python3 test_slurm_jobs.py`): it exits 0 when every test passed,
1 when one failed, and 77 (ctest's SKIP_RETURN_CODE) when SLURM cannot start here or a test
skipped itself, saying why; with DTRAIN_TEST_REQUIRE_SLURM=1 that is a failure instead, for
machines set up to run SLURM (tools/run-tests.sh sets it where it runs as root).
"""
import json
import os
import re
import subprocess
import sys
import time
import unittest
import uuid
from typing import Dict, List, Optional, Tuple

import local_slurm

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "support"))
from run_unittest import verdict  # noqa: E402
LAUNCHER_PROGRAMS = os.path.join(HERE, "..", "launcher", "programs")
# ctest passes the build tree's dtrainrun and programs; run by hand, the source tree's dtrainrun.
DTRAINRUN = os.environ.get("DTRAINRUN", os.path.join(HERE, "..", "..", "tools", "dtrainrun"))
PROBE = os.environ.get("DTRAIN_TEST_PROBE")
PLAIN_TRAIN = os.environ.get("DTRAIN_TEST_PLAIN_TRAIN")
JOB_TIMEOUT_S = 60

cluster: Optional[local_slurm.LocalSlurm] = None


def program(name: str) -> str:
    """A test program of the launcher's tests (tests/launcher/programs)."""
    return os.path.abspath(os.path.join(LAUNCHER_PROGRAMS, name))


def rank_json(text: str, probe: str) -> Dict[int, dict]:
    """The probe's JSON lines of one kind, by rank, from dtrainrun's labelled output."""
    found = {}
    for line in text.splitlines():
        m = re.match(r"^\[(\d+)\]<stdout>:(\{.*\})$", line)
        if m:
            record = json.loads(m.group(2))
            if record.get("probe") == probe:
                found[int(m.group(1))] = record
    return found


def plain_json(text: str) -> List[dict]:
    """JSON lines printed without labels (programs started by srun directly)."""
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def processes_with(marker: str) -> List[int]:
    """Processes whose command line holds `marker`."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if marker.encode() in f.read():
                        found.append(int(entry))
            except OSError:
                pass
    return found


class SlurmTest(unittest.TestCase):
    """A test on this file's cluster."""

    @property
    def cluster(self) -> local_slurm.LocalSlurm:
        assert cluster is not None, "run this file as a script: it starts the cluster"
        return cluster

    def need(self, *programs: Optional[str]) -> None:
        if not all(programs):
            self.skipTest("a test program is not set (DTRAIN_TEST_PROBE, DTRAIN_TEST_PLAIN_TRAIN: "
                          "ctest sets them)")

    def submit(self, body: str, *sbatch_args: str) -> Tuple[str, str]:
        """Submits `body` as a batch script; returns (job id, name of its output file)."""
        name = f"job-{uuid.uuid4().hex[:8]}"
        script = self.cluster.script(f"{name}.sh", body)
        done = self.cluster.run(["sbatch", "--parsable", f"--output={name}.out",
                                 *sbatch_args, script], timeout=30)
        self.assertEqual(done.returncode, 0, f"sbatch: {done.stderr}")
        return done.stdout.strip().split(";")[0], f"{name}.out"

    def finish(self, job_id: str, output: str, timeout: float = JOB_TIMEOUT_S
               ) -> Tuple[str, str, str]:
        """Waits for the job to end: (JobState, ExitCode as `code:signal`, its output)."""
        state = self.cluster.wait_for_job(
            job_id, ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"),
            timeout)
        fields = self.cluster.job(job_id)
        # The batch step's last lines can land a moment after the job's end is recorded.
        time.sleep(0.2)
        return state, fields.get("ExitCode", ""), self.cluster.read(output)

    def run_client(self, argv: List[str], timeout: float = JOB_TIMEOUT_S
                   ) -> subprocess.CompletedProcess:
        return self.cluster.run(argv, timeout=timeout)


def main(nodes: int) -> int:
    """Starts the cluster, runs the tests of __main__ on it, stops it (module docstring)."""
    global cluster
    required = os.environ.get("DTRAIN_TEST_REQUIRE_SLURM") == "1"
    began = time.monotonic()
    try:
        with local_slurm.LocalSlurm(nodes=nodes) as started:
            cluster = started
            print(f"SLURM up in {time.monotonic() - began:.1f} s: nodes "
                  f"{', '.join(started.node_names)}", flush=True)
            result = unittest.main(module="__main__", exit=False, verbosity=2).result
    except local_slurm.Unavailable as e:
        print(f"{'FAILED' if required else 'SKIPPED'}: SLURM cannot run here: {e}")
        return 1 if required else local_slurm.SKIPPED
    finally:
        cluster = None
    print(f"{time.monotonic() - began:.1f} s with the cluster started and stopped")
    return verdict(result, required)


if __name__ == "__main__":
    sys.exit("run a test file (test_slurm_*.py), not this module")
