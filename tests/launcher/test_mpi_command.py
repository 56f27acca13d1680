"""Which MPI launcher dtrainrun picks, and the command line it gives MPICH's Hydra and Open MPI's
mpirun. Open MPI is checked at the level of its arguments (it need not be installed)."""
import os
import shlex
import tempfile
import unittest

from launcher_test_support import clean_env, dtrainrun, package_path, program

package_path()
from dtrain_launcher import mpi  # noqa: E402
from dtrain_launcher.errors import UsageError  # noqa: E402
from dtrain_launcher.hosts import Host  # noqa: E402

HYDRA_VERSION = "HYDRA build details:\n    Version:                                 4.0.2\n"
OPENMPI_VERSION = "mpirun (Open MPI) 4.1.4\n\nReport bugs to http://www.open-mpi.org/\n"
LDD_MPICH = ("\tlinux-vdso.so.1 (0x00007ffc)\n"
             "\tlibmpich.so.12 => /lib/x86_64-linux-gnu/libmpich.so.12 (0x00007f3a)\n"
             "\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f3b)\n")
LDD_OPENMPI = ("\tlibmpi.so.40 => /usr/lib/x86_64-linux-gnu/openmpi/lib/libmpi.so.40 (0x7f)\n"
               "\tlibopen-pal.so.40 => /usr/lib/x86_64-linux-gnu/openmpi/lib/libopen-pal.so.40\n")


class FakeSystem:
    """Installed launchers and programs, as `which` and a command runner see them."""

    def __init__(self, launchers, ldd=None):
        self.launchers = launchers  # path -> --version text
        self.ldd = ldd
        self.dir = tempfile.TemporaryDirectory()
        self.paths = {}
        for path in launchers:
            real = os.path.join(self.dir.name, os.path.basename(path))
            with open(real, "w") as f:
                f.write("#!/bin/sh\n")
            os.chmod(real, 0o755)
            self.paths[os.path.basename(path)] = real

    def which(self, name):
        return self.paths.get(name)

    def run(self, argv):
        if argv[0] == "ldd":
            return (0, self.ldd) if self.ldd is not None else (1, "not a dynamic executable")
        for path, text in self.launchers.items():
            if os.path.basename(path) == os.path.basename(argv[0]):
                return 0, text
        return 127, "not found"


def choose(system, **kwargs):
    args = dict(program="/bin/prog", mpi=None, launcher=None, build_config=None)
    args.update(kwargs)
    return mpi.choose(args["program"], args["mpi"], args["launcher"], args["build_config"],
                      run=system.run, which=system.which)


class ChoosingTheLauncher(unittest.TestCase):
    both = {"mpiexec.mpich": HYDRA_VERSION, "mpirun.openmpi": OPENMPI_VERSION,
            "mpiexec": OPENMPI_VERSION}

    def test_the_program_decides(self):
        got = choose(FakeSystem(self.both, ldd=LDD_MPICH))
        self.assertEqual((got.flavor, os.path.basename(got.path)), ("mpich", "mpiexec.mpich"))
        self.assertEqual(got.reason, "the program links libmpich.so.12")
        self.assertEqual(got.version, "HYDRA 4.0.2")
        got = choose(FakeSystem(self.both, ldd=LDD_OPENMPI))
        self.assertEqual((got.flavor, os.path.basename(got.path)), ("openmpi", "mpirun.openmpi"))
        self.assertEqual(got.version, "Open MPI 4.1.4")

    def test_unsuffixed_mpiexec_is_not_trusted_by_name(self):
        # mpiexec is Open MPI's here; a program built with MPICH must not get it.
        system = FakeSystem({"mpiexec": OPENMPI_VERSION, "mpiexec.hydra": HYDRA_VERSION},
                            ldd=LDD_MPICH)
        self.assertEqual(os.path.basename(choose(system).path), "mpiexec.hydra")
        with self.assertRaisesRegex(UsageError, "the job needs MPICH \\(Hydra\\) \\(the program "
                                                "links libmpich.so.12\\) but none of"):
            choose(FakeSystem({"mpiexec": OPENMPI_VERSION}, ldd=LDD_MPICH))

    def test_build_description_when_the_program_says_nothing(self):
        got = choose(FakeSystem(self.both), build_config={"mpi_flavor": "openmpi"})
        self.assertEqual((got.flavor, got.reason), ("openmpi", "the MPI dtrain was built with"))

    def test_only_installed_flavour(self):
        got = choose(FakeSystem({"mpiexec.mpich": HYDRA_VERSION}))
        self.assertEqual((got.flavor, got.reason), ("mpich", "the only MPI installed"))
        with self.assertRaisesRegex(UsageError, "both MPICH and Open MPI are installed; pass "
                                                "--mpi mpich\\|openmpi"):
            choose(FakeSystem(self.both))

    def test_explicit_choices(self):
        got = choose(FakeSystem(self.both, ldd=LDD_MPICH), mpi="openmpi")
        self.assertEqual((got.flavor, got.reason), ("openmpi", "given with --mpi"))
        system = FakeSystem(self.both)
        got = choose(system, launcher=system.paths["mpiexec.mpich"])
        self.assertEqual((got.flavor, got.reason), ("mpich", "given with --launcher"))
        with self.assertRaisesRegex(UsageError, "is MPICH \\(Hydra\\) but --mpi says openmpi"):
            choose(system, launcher=system.paths["mpiexec.mpich"], mpi="openmpi")


LAYOUT = [Host("node1", 2), Host("node2", 2)]
SHIM = ["/opt/dtrain/bin/dtrainrun", "--rank-shim", "TOKEN", "--", "./train", "--lr", "0.1"]


class CommandLines(unittest.TestCase):
    def setUp(self):
        self.env = {"PATH": "/usr/bin", "HOME": "/root", "DTRAIN_FUSION_THRESHOLD": "1",
                    "HOROVOD_CYCLE_TIME": "2", "DTRAINRUN_RESTART_COUNT": "0", "MY_VAR": "x"}
        self.assignments = [("MY_VAR", "x")]

    def test_mpich(self):
        launcher = mpi.Launcher("mpich", "/usr/bin/mpiexec.mpich", "HYDRA 4.0.2", "test")
        argv = mpi.command(launcher, LAYOUT, SHIM, self.env, self.assignments, None, True)
        self.assertEqual(argv, ["/usr/bin/mpiexec.mpich", "-genvall", "-hosts",
                                "node1:2,node2:2", "-n", "4"] + SHIM)
        argv = mpi.command(launcher, LAYOUT, SHIM, self.env, self.assignments, "/bin/agent", True)
        self.assertEqual(argv[6:10], ["-launcher", "rsh", "-launcher-exec", "/bin/agent"])

    def test_openmpi(self):
        launcher = mpi.Launcher("openmpi", "/usr/bin/mpirun.openmpi", "Open MPI 4.1.4", "test")
        argv = mpi.command(launcher, LAYOUT, SHIM, self.env, self.assignments, "/bin/agent",
                           True)
        self.assertEqual(argv, ["/usr/bin/mpirun.openmpi", "-np", "4", "-H", "node1:2,node2:2",
                                "--map-by", "slot", "--bind-to", "none", "--allow-run-as-root",
                                "-x", "DTRAINRUN_RESTART_COUNT", "-x", "DTRAIN_FUSION_THRESHOLD",
                                "-x", "HOROVOD_CYCLE_TIME", "-x", "MY_VAR", "-x", "PATH",
                                "--mca", "plm_rsh_agent", "/bin/agent"] + SHIM)
        argv = mpi.command(launcher, LAYOUT, SHIM, self.env, [], None, False)
        self.assertNotIn("--allow-run-as-root", argv)
        self.assertNotIn("MY_VAR", argv)  # not a setting and not named with -x

    def test_launch_environment(self):
        base = {"DTRAIN_HOSTS": "a,b", "DTRAIN_CURRENT_HOST": "a", "KEEP": "1", "OVER": "old"}
        env = mpi.launch_environment(base, [("OVER", "new"), ("KEEP", None)], 2)
        self.assertEqual(env, {"KEEP": "1", "OVER": "new", "DTRAINRUN_RESTART_COUNT": "2"})


class DryRuns(unittest.TestCase):
    """The whole path through dtrainrun, up to the command it would run."""

    def fake_openmpi(self):
        folder = tempfile.TemporaryDirectory()
        self.addCleanup(folder.cleanup)
        path = os.path.join(folder.name, "mpirun")
        with open(path, "w") as f:
            f.write(f"#!/bin/sh\nprintf '%s' '{OPENMPI_VERSION}'\n")
        os.chmod(path, 0o755)
        return path

    def test_openmpi_through_dtrainrun(self):
        fake = self.fake_openmpi()
        done = dtrainrun("--dry-run", "--launcher", fake, "-H", "a:1,b:1", "-x", "EXTRA=1",
                         "--", program("env_report.py"),
                         env=clean_env(DTRAIN_CYCLE_TIME="3"))
        self.assertEqual(done.returncode, 0, done.stderr)
        argv = shlex.split(done.stdout)
        self.assertEqual(argv[:5], [fake, "-np", "2", "-H", "a:1,b:1"])
        for name in ("DTRAIN_CYCLE_TIME", "EXTRA", "DTRAINRUN_RESTART_COUNT"):
            self.assertIn(name, argv[argv.index("-x"):])
        self.assertEqual(argv[-4:], ["--rank-shim", "TOKEN", "--", program("env_report.py")])

    def test_slurm_allocation(self):
        done = dtrainrun("--dry-run", "--mpi", "mpich", "--", program("env_report.py"),
                         env=clean_env(SLURM_JOB_NODELIST="node[01-02],gpu-a1",
                                       SLURM_TASKS_PER_NODE="2(x2),1"))
        self.assertEqual(done.returncode, 0, done.stderr)
        argv = shlex.split(done.stdout)
        self.assertEqual(argv[1:6], ["-genvall", "-hosts", "node01:2,node02:2,gpu-a1:1", "-n",
                                     "5"])

    def test_slurm_allocation_smaller_job(self):
        done = dtrainrun("--dry-run", "--mpi", "mpich", "-np", "3", "--",
                         program("env_report.py"),
                         env=clean_env(SLURM_JOB_NODELIST="node[01-02]",
                                       SLURM_NTASKS_PER_NODE="2"))
        self.assertEqual(shlex.split(done.stdout)[3:6], ["node01:2,node02:1", "-n", "3"])
        done = dtrainrun("--dry-run", "--mpi", "mpich", "-np", "5", "--",
                         program("env_report.py"),
                         env=clean_env(SLURM_JOB_NODELIST="node[01-02]",
                                       SLURM_NTASKS_PER_NODE="2"))
        self.assertEqual(done.returncode, 2)
        self.assertIn("dtrain: -np 5 needs 5 slots but the SLURM allocation has 4 (node01:2, "
                      "node02:2)", done.stderr)


if __name__ == "__main__":
    unittest.main()
