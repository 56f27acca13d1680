#!/usr/bin/env python3
"""run_unittest.py's verdicts, on test files written for the purpose: a skip is reported as a
skip (77) and never as a pass, a failure beats a skip, no test at all fails, and --exclude leaves
out what it names."""
import os
import subprocess
import sys
import tempfile
import unittest

RUNNER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "run_unittest.py")

FILES = {
    "t_pass.py": """
import unittest
class A(unittest.TestCase):
    def test_one(self): pass
""",
    "t_skip.py": """
import unittest
class A(unittest.TestCase):
    def test_runs(self): pass
    @unittest.skipIf(True, "the reason given")
    def test_skipped(self): pass
class B(unittest.TestCase):
    def test_runs_too(self): pass
""",
    "t_skip_test.py": """
import unittest
class A(unittest.TestCase):
    def test_skips_itself(self): self.skipTest("not here")
""",
    "t_fail.py": """
import unittest
class A(unittest.TestCase):
    def test_fails(self): self.fail("wrong")
    @unittest.skip("also skipped")
    def test_skipped(self): pass
""",
    "t_empty.py": "import unittest\n",
}


class Verdicts(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.folder = tempfile.TemporaryDirectory()
        for name, text in FILES.items():
            with open(os.path.join(cls.folder.name, name), "w") as f:
                f.write(text)

    @classmethod
    def tearDownClass(cls):
        cls.folder.cleanup()

    def run_on(self, *args):
        return subprocess.run([sys.executable, RUNNER, *args], cwd=self.folder.name,
                              capture_output=True, text=True, timeout=60,
                              env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"))

    def test_all_passed(self):
        self.assertEqual(self.run_on("t_pass").returncode, 0)

    def test_a_skipped_case_reports_the_file_skipped_with_the_reason(self):
        done = self.run_on("t_skip")
        self.assertEqual(done.returncode, 77, done.stdout + done.stderr)
        self.assertIn("SKIPPED: 1 of 3 tests did not run:\n  t_skip.A.test_skipped: the reason "
                      "given", done.stdout)
        self.assertEqual(self.run_on("t_skip_test").returncode, 77)

    def test_a_failure_wins_over_a_skip(self):
        self.assertEqual(self.run_on("t_fail").returncode, 1)

    def test_no_test_at_all_fails(self):
        self.assertEqual(self.run_on("t_empty").returncode, 1)
        self.assertEqual(self.run_on("t_no_such_module").returncode, 1)

    def test_exclude_and_names(self):
        self.assertEqual(self.run_on("t_skip", "--exclude", "t_skip.A").returncode, 0)
        self.assertEqual(self.run_on("t_skip.A.test_runs").returncode, 0)
        self.assertEqual(self.run_on("t_skip", "--exclude", "t_skip").returncode, 1)

    def test_discover(self):
        self.assertEqual(self.run_on("--start-dir", ".", "--pattern", "t_pass.py").returncode, 0)
        self.assertEqual(self.run_on("--start-dir", ".", "--pattern", "t_s*.py").returncode, 77)


if __name__ == "__main__":
    unittest.main()
