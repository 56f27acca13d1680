"""What dtrainrun decides in a SLURM job, from the variables alone (no SLURM needed): Hydra's
launcher inside an allocation, a step task's place and PMI, srun tasks run as ranks or refused
with the fix named, the overlap of a launcher started inside a step, SIGCONT passed on (Note
[dtrainrun in a SLURM job] in tools/dtrain_launcher/slurm.py)."""
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "launcher"))
from launcher_test_support import clean_env, dtrainrun, package_path, program  # noqa: E402

package_path()
from dtrain_launcher import job, mpi, slurm  # noqa: E402
from dtrain_launcher.hosts import Host  # noqa: E402

MPICH = mpi.Launcher("mpich", "/usr/bin/mpiexec.hydra", "HYDRA 4.0.2", "test")
OPENMPI = mpi.Launcher("openmpi", "/usr/bin/mpirun.openmpi", "Open MPI 4.1.4, ORTE", "test")
ALLOCATION = {"SLURM_JOB_ID": "5", "SLURM_JOB_NODELIST": "node[1-2]",
              "SLURM_TASKS_PER_NODE": "2(x2)"}


def step(task, tasks, **extra):
    """The variables of task `task` of a step of `tasks` tasks in ALLOCATION."""
    return dict(ALLOCATION, SLURM_STEP_ID="0", SLURM_STEP_NUM_TASKS=str(tasks),
                SLURM_PROCID=str(task), SLURM_TASKS_PER_NODE="1", **extra)


class StepTasks(unittest.TestCase):
    def test_no_step_outside_srun(self):
        self.assertIsNone(slurm.step_task({}))
        # A batch script has SLURM_PROCID=0 but no step id: dtrainrun runs there once.
        self.assertIsNone(slurm.step_task(dict(ALLOCATION, SLURM_PROCID="0")))

    def test_place_and_pmi(self):
        self.assertEqual(slurm.step_task(step(1, 4)), slurm.StepTask("0", 1, 4, None))
        self.assertEqual(slurm.step_task(step(1, 4, PMI_FD="9", PMI_RANK="1")).pmi, "pmi2")
        self.assertEqual(slurm.step_task(step(0, 4, PMIX_RANK="0")).pmi, "pmix")

    def test_bootstrap(self):
        hosts = [Host("node1", 2), Host("node2", 2)]
        self.assertIsNone(slurm.bootstrap(hosts, {}))
        self.assertEqual(slurm.bootstrap(hosts, ALLOCATION), "slurm")
        self.assertEqual(slurm.bootstrap(hosts + [Host("login", 1)], ALLOCATION), "ssh")


class Commands(unittest.TestCase):
    layout = [Host("node1", 2), Host("node2", 2)]

    def test_hydra_is_told_its_launcher(self):
        argv = mpi.command(MPICH, self.layout, ["prog"], {}, [], None, False, "slurm")
        self.assertEqual(argv[:8], [MPICH.path, "-genvall", "-hosts", "node1:2,node2:2", "-n",
                                    "4", "-launcher", "slurm"])
        argv = mpi.command(MPICH, self.layout, ["prog"], {}, [], None, False, None)
        self.assertNotIn("-launcher", argv)

    def test_an_agent_wins(self):
        argv = mpi.command(MPICH, self.layout, ["prog"], {}, [], "agent.sh", False, "slurm")
        self.assertEqual(argv[6:10], ["-launcher", "rsh", "-launcher-exec", "agent.sh"])
        self.assertEqual(argv.count("-launcher"), 1)

    def test_open_mpi_finds_slurm_itself(self):
        argv = mpi.command(OPENMPI, self.layout, ["prog"], {}, [], None, False, "slurm")
        self.assertNotIn("slurm", argv)

    def test_a_launcher_inside_a_step_overlaps_it(self):
        self.assertEqual(mpi.launch_environment(step(0, 1), [], 0).get("SLURM_OVERLAP"), "1")
        self.assertNotIn("SLURM_OVERLAP", mpi.launch_environment(ALLOCATION, [], 0))

    def test_dry_run_in_an_allocation(self):
        done = dtrainrun("--dry-run", "--mpi", "mpich", "--", program("env_report.py"),
                         env=clean_env(**ALLOCATION))
        self.assertEqual(done.returncode, 0, done.stderr)
        argv = shlex.split(done.stdout)
        self.assertEqual(argv[3:8], ["node1:2,node2:2", "-n", "4", "-launcher", "slurm"])
        done = dtrainrun("--dry-run", "--mpi", "mpich", "-H", "login:1", "--",
                         program("env_report.py"), env=clean_env(**ALLOCATION))
        self.assertEqual(shlex.split(done.stdout)[6:8], ["-launcher", "ssh"])


class DtrainrunAsAStepTask(unittest.TestCase):
    """`srun dtrainrun prog`, with the variables srun would set."""

    def run_task(self, env, *args):
        return dtrainrun(*args, env=clean_env(**env), timeout=60)

    def test_without_pmi_the_first_task_says_why_and_the_others_are_quiet(self):
        done = self.run_task(step(0, 2), "--mpi", "mpich", "--", program("env_report.py"))
        self.assertEqual(done.returncode, 2)
        self.assertIn("dtrain: dtrainrun was started by srun as task 0 of 2 (SLURM_STEP_ID=0): "
                      "every task would start the whole job, and srun gave the tasks no MPI "
                      "process manager interface (no --mpi=pmi2). Run dtrainrun once, in the "
                      "batch script (sbatch -n 2) or as salloc's command", done.stderr)
        self.assertIn("`srun --mpi=pmi2 -n 2 dtrainrun", done.stderr)
        self.assertEqual(done.stdout, "")
        done = self.run_task(step(1, 2), "--mpi", "mpich", "--", program("env_report.py"))
        self.assertEqual((done.returncode, done.stderr), (2, ""))

    def test_a_pmi_the_mpi_cannot_use(self):
        done = self.run_task(step(0, 2, PMIX_RANK="0"), "--mpi", "mpich", "--",
                             program("env_report.py"))
        self.assertEqual(done.returncode, 2)
        self.assertIn("srun gave the tasks pmix, which the program's MPI cannot use",
                      done.stderr)

    def test_a_step_of_one_task_does_not_know_the_allocation(self):
        done = self.run_task(step(0, 1), "--mpi", "mpich", "--", program("env_report.py"))
        self.assertEqual(done.returncode, 2)
        self.assertIn("as the only task of job step 0", done.stderr)
        self.assertIn("or give the hosts with -H or --hostfile", done.stderr)
        done = self.run_task(step(0, 1), "--dry-run", "--mpi", "mpich", "-H", "node2:2", "--",
                             program("env_report.py"))
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertIn("-launcher slurm", done.stdout)

    def test_with_pmi2_each_task_is_a_rank(self):
        env = step(1, 2, PMI_FD="99", PMI_RANK="1", PMI_SIZE="2")
        done = self.run_task(env, "--mpi", "mpich", "-x", "MARK=yes", "--",
                             program("env_report.py"), "MARK", "DTRAINRUN_RESTART_COUNT")
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertEqual(done.stdout, '[1]<stdout>:{"rank": 1, "env": {"MARK": "yes", '
                                      '"DTRAINRUN_RESTART_COUNT": "0"}}\n')
        done = self.run_task(env, "--mpi", "mpich", "--no-prefix", "--",
                             program("env_report.py"))
        self.assertEqual(done.stdout, '{"rank": 1, "env": {}}\n')
        # Each task is a dtrainrun of its own: they agree on the step as the job's identity.
        done = self.run_task(env, "--mpi", "mpich", "--no-prefix", "--",
                             program("env_report.py"), "DTRAINRUN_JOB_ID", "DTRAINRUN_ATTEMPT")
        self.assertEqual(json.loads(done.stdout)["env"],
                         {"DTRAINRUN_JOB_ID": f"slurm-{ALLOCATION['SLURM_JOB_ID']}.0",
                          "DTRAINRUN_ATTEMPT": "0"})
        done = self.run_task(env, "--mpi", "mpich", "--", program("exit_codes.py"), "1=7")
        self.assertEqual(done.returncode, 7, done.stderr)

    def test_options_that_do_not_fit_srun_starting_the_ranks(self):
        env = step(0, 2, PMI_FD="99", PMI_RANK="0")
        done = self.run_task(env, "--mpi", "mpich", "-np", "3", "--", program("env_report.py"))
        self.assertEqual(done.returncode, 2)
        self.assertIn("dtrain: -np 3, but srun started 2 task(s), each one rank", done.stderr)
        done = self.run_task(env, "--mpi", "mpich", "--restarts", "1", "--",
                             program("env_report.py"))
        self.assertEqual(done.returncode, 2)
        self.assertIn("dtrain: --restarts: srun started the ranks", done.stderr)


class Signals(unittest.TestCase):
    def test_sigcont_reaches_the_launchers_group(self):
        with tempfile.TemporaryDirectory() as folder:
            mark = os.path.join(folder, "continued")
            ready = os.path.join(folder, "ready")
            script = (f"trap 'touch {mark}' CONT; touch {ready}; "
                      f"while [ ! -e {mark} ]; do sleep 0.05; done")
            with job.Interrupts() as interrupts:
                process = subprocess.Popen(["sh", "-c", script], start_new_session=True)
                interrupts.process = process
                try:
                    deadline = time.monotonic() + 30
                    while not os.path.exists(ready) and time.monotonic() < deadline:
                        time.sleep(0.05)
                    os.kill(os.getpid(), signal.SIGCONT)
                    process.wait(timeout=30)
                finally:
                    if process.poll() is None:
                        process.kill()
                        process.wait()
                self.assertIsNone(interrupts.signal, "SIGCONT is no interrupt")
            self.assertTrue(os.path.exists(mark))


if __name__ == "__main__":
    unittest.main()
