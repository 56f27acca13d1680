"""`cmake --install` puts dtrainrun and dtrain-build-info in bin/ and the launcher's package in
share/dtrain/launcher/; the installed dtrainrun runs jobs and reports the build."""
import json
import os
import subprocess
import tempfile
import unittest

from launcher_test_support import clean_env, program

CMAKE = os.environ.get("DTRAIN_TEST_CMAKE")
BUILD = os.environ.get("DTRAIN_TEST_BINARY_DIR")


@unittest.skipUnless(CMAKE and BUILD, "DTRAIN_TEST_CMAKE and DTRAIN_TEST_BINARY_DIR are not set")
class Installed(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.folder = tempfile.TemporaryDirectory()
        cls.prefix = os.path.join(cls.folder.name, "prefix")
        done = subprocess.run([CMAKE, "--install", BUILD, "--prefix", cls.prefix],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              check=False)
        if done.returncode != 0:
            raise RuntimeError(f"cmake --install failed:\n{done.stdout}")
        cls.dtrainrun = os.path.join(cls.prefix, "bin", "dtrainrun")

    @classmethod
    def tearDownClass(cls):
        cls.folder.cleanup()

    def run_installed(self, *args, entry=None):
        return subprocess.run([entry or self.dtrainrun, *args], env=clean_env(),
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, timeout=120, check=False)

    def test_layout(self):
        for name in ("dtrainrun", "dtrain-build-info"):
            self.assertTrue(os.access(os.path.join(self.prefix, "bin", name), os.X_OK), name)
        launcher = os.path.join(self.prefix, "share", "dtrain", "launcher")
        self.assertTrue(os.path.isfile(os.path.join(launcher, "dtrain_launcher", "main.py")))
        with open(os.path.join(launcher, "build.json")) as f:
            build = json.load(f)
        self.assertIn(build["mpi_flavor"], ("mpich", "openmpi"))
        self.assertEqual(build["dtrain_version"], "0.1.0")

    def test_version_and_check_build(self):
        self.assertEqual(self.run_installed("--version").stdout, "dtrainrun (dtrain 0.1.0)\n")
        done = self.run_installed("--check-build")
        self.assertEqual(done.returncode, 0, done.stdout + done.stderr)
        self.assertRegex(done.stdout, r"^dtrain 0\.1\.0\n  MPI: (mpich|openmpi) \(")
        self.assertIn("  launcher: ", done.stdout)

    def test_a_job_through_a_link_to_the_installed_script(self):
        link = os.path.join(self.folder.name, "dtrainrun-link")
        if not os.path.islink(link):
            os.symlink(self.dtrainrun, link)
        done = self.run_installed("-np", "2", "--", program("exit_codes.py"), "1=4", entry=link)
        self.assertEqual(done.returncode, 4, done.stderr)
        self.assertEqual(sorted(done.stdout.splitlines()),
                         ["[0]<stdout>:rank 0 started", "[1]<stdout>:rank 1 started"])


if __name__ == "__main__":
    unittest.main()
