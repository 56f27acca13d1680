"""Which MPI launcher dtrainrun picks, and the command line it gives MPICH's Hydra and Open MPI's
mpirun. Open MPI is checked at the level of its arguments (it need not be installed)."""
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import unittest

from launcher_test_support import (clean_env, dtrainrun, make_install, package_path, program,
                                   write_script)

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
        self.assertEqual(got.version, "Open MPI 4.1.4, ORTE")

    def test_unsuffixed_mpiexec_is_not_trusted_by_name(self):
        # mpiexec is Open MPI's here; a program built with MPICH must not get it.
        system = FakeSystem({"mpiexec": OPENMPI_VERSION, "mpiexec.hydra": HYDRA_VERSION},
                            ldd=LDD_MPICH)
        self.assertEqual(os.path.basename(choose(system).path), "mpiexec.hydra")
        with self.assertRaises(UsageError) as caught:
            choose(FakeSystem({"mpiexec": OPENMPI_VERSION}, ldd=LDD_MPICH))
        self.assertRegex(str(caught.exception),
                         r"^dtrain: the job needs MPICH's launcher \(the program links "
                         r"libmpich.so.12\), but the launchers found are not: \S+/mpiexec is "
                         r"Open MPI's \(Open MPI 4.1.4, ORTE\)\. Install MPICH's launcher, or "
                         r"name it with --launcher PATH$")

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
        got = choose(FakeSystem(self.both), mpi="openmpi")
        self.assertEqual((got.flavor, got.reason), ("openmpi", "given with --mpi"))
        system = FakeSystem(self.both)
        got = choose(system, launcher=system.paths["mpiexec.mpich"])
        self.assertEqual((got.flavor, got.reason), ("mpich", "given with --launcher"))
        with self.assertRaisesRegex(UsageError, "^dtrain: --launcher \\S+ is MPICH's launcher "
                                                "\\(HYDRA 4.0.2\\), but the job needs Open "
                                                "MPI's \\(given with --mpi\\)"):
            choose(system, launcher=system.paths["mpiexec.mpich"], mpi="openmpi")

    def test_what_the_program_links_cannot_be_overridden(self):
        # Any other launcher would start each rank as a one-rank job of its own.
        with self.assertRaisesRegex(UsageError, "^dtrain: --mpi openmpi, but the program links "
                                                "libmpich.so.12 \\(MPICH\\); a launcher of "
                                                "another MPI starts each rank as a separate "
                                                "one-rank job; drop --mpi$"):
            choose(FakeSystem(self.both, ldd=LDD_MPICH), mpi="openmpi")
        system = FakeSystem(self.both, ldd=LDD_MPICH)
        with self.assertRaises(UsageError) as caught:
            choose(system, launcher=system.paths["mpirun.openmpi"])
        self.assertEqual(str(caught.exception),
                         f"dtrain: --launcher {system.paths['mpirun.openmpi']} is Open MPI's "
                         f"launcher (Open MPI 4.1.4, ORTE), but the job needs MPICH's (the "
                         f"program links libmpich.so.12); a launcher of another MPI starts each "
                         f"rank as a separate one-rank job. Leave --launcher out to use "
                         f"{system.paths['mpiexec.mpich']}, or pass that MPI's launcher with "
                         f"--launcher")

    def test_a_launcher_of_the_other_mpi_than_the_build(self):
        # A script: ldd sees no MPI, so the build's MPI stands for the program's, and --mpi can
        # say otherwise.
        system = FakeSystem(self.both)
        build = {"mpi_flavor": "mpich"}
        with self.assertRaises(UsageError) as caught:
            choose(system, launcher=system.paths["mpirun.openmpi"], build_config=build)
        self.assertIn("but the job needs MPICH's (the MPI dtrain was built with)",
                      str(caught.exception))
        self.assertIn(f"Leave --launcher out to use {system.paths['mpiexec.mpich']}, or pass "
                      f"that MPI's launcher with --launcher; if the program uses Open MPI (ldd "
                      f"cannot tell for a script or a static program), say so with --mpi "
                      f"openmpi", str(caught.exception))
        got = choose(system, launcher=system.paths["mpirun.openmpi"], build_config=build,
                     mpi="openmpi")
        self.assertEqual((got.flavor, got.reason), ("openmpi", "given with --launcher; it fits: "
                                                               "given with --mpi"))

    def test_a_program_of_another_dtrain_gets_its_own_launcher(self):
        got = choose(FakeSystem(self.both, ldd=LDD_OPENMPI), build_config={"mpi_flavor": "mpich"})
        self.assertEqual(os.path.basename(got.path), "mpirun.openmpi")

    def test_the_build_launcher_that_became_another_mpi(self):
        # build.json names the launcher the build was configured with; since then it has become
        # Open MPI's (Debian's alternatives), and no MPICH launcher is left.
        system = FakeSystem({"mpiexec": OPENMPI_VERSION, "mpirun.openmpi": OPENMPI_VERSION})
        build = {"mpi_flavor": "mpich", "mpiexec": system.paths["mpiexec"]}
        with self.assertRaises(UsageError) as caught:
            choose(system, build_config=build)
        self.assertEqual(str(caught.exception),
                         f"dtrain: the job needs MPICH's launcher (the MPI dtrain was built "
                         f"with), but the launchers found are not: {system.paths['mpiexec']} is "
                         f"Open MPI's (Open MPI 4.1.4, ORTE). Install MPICH's launcher, or name "
                         f"it with --launcher PATH; if the program uses Open MPI (ldd cannot "
                         f"tell for a script or a static program), pass --mpi openmpi")

    def test_launcher_versions(self):
        cases = {
            HYDRA_VERSION: ("mpich", "HYDRA 4.0.2"),
            "mpirun.openmpi (OpenRTE) 4.1.4\n\nReport bugs to ...\n": ("openmpi",
                                                                    "Open MPI 4.1.4, ORTE"),
            "mpirun (Open MPI) 5.0.3\n": ("openmpi", "Open MPI 5.0.3, PRRTE"),
            "prterun (PRRTE) 3.0.5\n": ("openmpi", "PRRTE 3.0.5"),
            "lamexec 7.1\n": (None, "lamexec 7.1"),
        }
        for text, expected in cases.items():
            with self.subTest(text=text):
                self.assertEqual(mpi.flavor_of_launcher("x", run=lambda argv: (0, text)),
                                 expected)


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

    def test_job_identity(self):
        # Values an outer job left in dtrainrun's environment are replaced, never passed on.
        base = {"DTRAINRUN_JOB_ID": "outer", "DTRAINRUN_ATTEMPT": "7", "KEEP": "1"}
        env = mpi.launch_environment(base, [], 1, "job-a", 3)
        self.assertEqual(env, {"KEEP": "1", "DTRAINRUN_RESTART_COUNT": "1",
                               "DTRAINRUN_JOB_ID": "job-a", "DTRAINRUN_ATTEMPT": "3"})
        self.assertEqual(mpi.launch_environment(base, [], 0),
                         {"KEEP": "1", "DTRAINRUN_RESTART_COUNT": "0"})
        ids = {mpi.new_job_id() for _ in range(100)}
        self.assertEqual(len(ids), 100)
        for job_id in ids:
            self.assertRegex(job_id, r"^[0-9]{8}-[0-9]{6}-[0-9]+-[0-9a-f]{8}$")
            self.assertIn(f"-{os.getpid()}-", job_id)


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
        # The program is a script (ldd sees no MPI): --mpi says it uses Open MPI, as this
        # dtrainrun was built with MPICH.
        done = dtrainrun("--dry-run", "--mpi", "openmpi", "--launcher", fake, "-H", "a:1,b:1",
                         "-x", "EXTRA=1", "--", program("env_report.py"),
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


class TheOtherMpi(unittest.TestCase):
    """A dtrainrun built with MPICH whose only launcher is a fake `mpiexec` that says it is Open
    MPI's: the job is refused before anything starts, and --check-build says so."""

    def setUp(self):
        folder = tempfile.TemporaryDirectory()
        self.addCleanup(folder.cleanup)
        self.root = folder.name
        self.bin = os.path.join(self.root, "fakebin")
        os.makedirs(self.bin)
        os.symlink(sys.executable, os.path.join(self.bin, "python3"))
        self.calls = os.path.join(self.root, "calls")
        self.fake = write_script(os.path.join(self.bin, "mpiexec"), f"""#!/bin/sh
echo "$@" >> {self.calls}
if [ "$1" = --version ]; then printf '%s' '{OPENMPI_VERSION}'; exit 0; fi
exit 0
""")
        self.dtrainrun = make_install(
            os.path.join(self.root, "prefix"),
            # The launcher the build recorded is this fake: it has become Open MPI's since.
            {"dtrain_version": "0.1.0", "mpi_flavor": "mpich", "mpiexec": self.fake},
            "dtrain 0.1.0\n  MPI: mpich (MPICH Version: 4.0.2)\n")
        self.marker = os.path.join(self.root, "ran")

    def run_installed(self, *args):
        # Only the fake launcher on PATH: no real MPI, no ldd.
        return subprocess.run([self.dtrainrun, *args], env=clean_env(PATH=self.bin),
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, timeout=60, check=False)

    def launcher_calls(self):
        if not os.path.exists(self.calls):
            return []
        with open(self.calls) as f:
            return f.read().splitlines()

    def test_a_job_is_refused(self):
        done = self.run_installed("-np", "2", "--", program("touch_file.py"), self.marker)
        self.assertEqual((done.returncode, done.stdout), (2, ""), done.stderr)
        self.assertEqual(done.stderr,
                         f"dtrain: the job needs MPICH's launcher (the MPI dtrain was built "
                         f"with), but the launchers found are not: {self.fake} is Open MPI's "
                         f"(Open MPI 4.1.4, ORTE). Install MPICH's launcher, or name it with "
                         f"--launcher PATH; if the program uses Open MPI (ldd cannot tell for a "
                         f"script or a static program), pass --mpi openmpi\n")
        self.assertEqual(set(self.launcher_calls()), {"--version"})  # asked, never started
        self.assertFalse(os.path.exists(self.marker))

    def test_the_other_launcher_given_is_refused(self):
        done = self.run_installed("--launcher", self.fake, "-np", "2", "--",
                                  program("touch_file.py"), self.marker)
        self.assertEqual(done.returncode, 2, done.stderr)
        self.assertIn(f"dtrain: --launcher {self.fake} is Open MPI's launcher (Open MPI 4.1.4, "
                      f"ORTE), but the job needs MPICH's (the MPI dtrain was built with)",
                      done.stderr)
        self.assertIn("say so with --mpi openmpi", done.stderr)
        self.assertEqual(set(self.launcher_calls()), {"--version"})

    def test_check_build_reports_and_refuses(self):
        done = self.run_installed("--check-build", "--", program("touch_file.py"))
        self.assertEqual(done.returncode, 2, done.stdout + done.stderr)
        self.assertEqual(done.stdout.splitlines()[:3], [
            "dtrain 0.1.0", "  MPI: mpich (MPICH Version: 4.0.2)",
            f"  program {program('touch_file.py')}: no MPI found (ldd is not available)"])
        self.assertEqual(done.stdout.splitlines()[3],
                         f"  launcher: refused: dtrain: the job needs MPICH's launcher (the MPI "
                         f"dtrain was built with), but the launchers found are not: {self.fake} "
                         f"is Open MPI's (Open MPI 4.1.4, ORTE). Install MPICH's launcher, or "
                         f"name it with --launcher PATH; if the program uses Open MPI (ldd cannot "
                         f"tell for a script or a static program), pass --mpi openmpi")
        self.assertEqual(set(self.launcher_calls()), {"--version"})

    def test_saying_the_program_uses_it(self):
        done = self.run_installed("--mpi", "openmpi", "--dry-run", "-np", "2", "--",
                                  program("touch_file.py"), self.marker)
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertEqual(shlex.split(done.stdout)[:3], [self.fake, "-np", "2"])
        done = self.run_installed("--check-build", "--mpi", "openmpi", "--",
                                  program("touch_file.py"))
        self.assertEqual(done.returncode, 0, done.stdout + done.stderr)
        self.assertIn(f"  launcher: Open MPI launcher {self.fake} (Open MPI 4.1.4, ORTE), because "
                      f"given with --mpi\n  note: dtrain here was built with mpich, the program "
                      f"uses openmpi", done.stdout)


PROBE = os.environ.get("DTRAIN_TEST_PROBE")
REAL_OPENMPI = shutil.which("mpirun.openmpi")


@unittest.skipUnless(PROBE and REAL_OPENMPI and shutil.which("mpiexec.mpich"),
                     "needs the MPICH test program (DTRAIN_TEST_PROBE) and both MPICH's and Open "
                     "MPI's launchers")
class BothMpisInstalled(unittest.TestCase):
    """The real thing: an MPICH program and Open MPI's mpirun."""

    def test_open_mpis_launcher_is_refused_for_an_mpich_program(self):
        done = dtrainrun("--launcher", REAL_OPENMPI, "-np", "2", "--", PROBE)
        self.assertEqual((done.returncode, done.stdout), (2, ""), done.stderr)
        self.assertRegex(done.stderr, f"^dtrain: --launcher {re.escape(REAL_OPENMPI)} is Open "
                                      f"MPI's launcher \\(Open MPI [0-9.]+, ORTE\\), but the job "
                                      f"needs MPICH's \\(the program links libmpich")
        done = dtrainrun("--check-build", "--launcher", REAL_OPENMPI, "--", PROBE)
        self.assertEqual(done.returncode, 2, done.stdout + done.stderr)
        self.assertIn(f"  program {PROBE}: links mpich (libmpich.so.12)\n  launcher: refused: "
                      f"dtrain: --launcher {REAL_OPENMPI} is Open MPI's launcher", done.stdout)

    def test_without_launcher_the_program_gets_mpich(self):
        done = dtrainrun("--check-build", "--", PROBE)
        self.assertEqual(done.returncode, 0, done.stdout + done.stderr)
        self.assertIn("  launcher: MPICH (Hydra) launcher ", done.stdout)
        self.assertIn("because the program links libmpich.so.12", done.stdout)


if __name__ == "__main__":
    unittest.main()
