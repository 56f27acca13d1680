"""dtrainrun's command line: what it accepts, and the message for each mistake. The mistakes are
also run through dtrainrun itself, which must exit 2 before starting anything."""
import os
import stat
import tempfile
import unittest

from launcher_test_support import dtrainrun, package_path, program

package_path()
from dtrain_launcher import options  # noqa: E402
from dtrain_launcher.errors import UsageError  # noqa: E402
from dtrain_launcher.hosts import Host  # noqa: E402


class GoodArguments(unittest.TestCase):
    def test_everything_at_once(self):
        o = options.parse(["-np", "4", "-H", "a:2,b:2", "-x", "A=1", "-x", "PATH", "--no-prefix",
                           "--restarts", "3", "--verbose", "--mpi", "mpich",
                           "--launcher-agent", "/bin/agent", "--start-timeout", "2.5",
                           "--", "./train", "--lr", "0.1"])
        self.assertEqual(o.np, 4)
        self.assertEqual(o.hosts, [Host("a", 2), Host("b", 2)])
        self.assertEqual(o.env, [("A", "1"), ("PATH", None)])
        self.assertFalse(o.prefix)
        self.assertTrue(o.verbose)
        self.assertEqual(o.restarts, 3)
        self.assertEqual(o.mpi, "mpich")
        self.assertEqual(o.launcher_agent, "/bin/agent")
        self.assertEqual(o.start_timeout_s, 2.5)
        self.assertEqual(o.program, ["./train", "--lr", "0.1"])

    def test_defaults(self):
        o = options.parse(["prog"])
        self.assertIsNone(o.np)
        self.assertTrue(o.prefix)
        self.assertEqual(o.restarts, 0)
        self.assertEqual(o.program, ["prog"])

    def test_spellings(self):
        for argv in (["-n", "3", "p"], ["--num-proc", "3", "p"], ["--num-proc=3", "p"]):
            self.assertEqual(options.parse(argv).np, 3, argv)
        self.assertEqual(options.parse(["--hosts=a:1", "p"]).hosts, [Host("a", 1)])

    def test_program_starts_at_first_word_and_keeps_its_options(self):
        o = options.parse(["-np", "2", "./train", "-np", "7", "--", "x"])
        self.assertEqual(o.program, ["./train", "-np", "7", "--", "x"])

    def test_bare_host_has_one_slot(self):
        self.assertEqual(options.parse(["-H", "a,b:3", "p"]).hosts, [Host("a", 1), Host("b", 3)])

    def test_cluster_options(self):
        o = options.parse(["--cluster", "--slots", "8", "--cluster-port", "4000",
                           "--cluster-timeout", "60", "--", "p"])
        self.assertTrue(o.cluster)
        self.assertEqual((o.slots, o.cluster_port, o.cluster_timeout_s), (8, 4000, 60.0))

    def test_check_build_needs_no_program(self):
        self.assertTrue(options.parse(["--check-build"]).check_build)


BAD_ARGUMENTS = [
    (["--frobnicate", "p"], "dtrain: unknown option '--frobnicate'; see dtrainrun --help"),
    (["-np"], "dtrain: -np needs a value; see dtrainrun --help"),
    (["-np", "x", "p"], "dtrain: -np expects a whole number, got 'x'"),
    (["-np", "0", "p"], "dtrain: -np 0: must be at least 1"),
    (["-H", "a:0", "p"], "dtrain: -H 'a:0': host 'a' has 0 slots; every host needs at least 1"),
    (["-H", "a:b", "p"],
     "dtrain: -H 'a:b': host 'a' has slots 'b'; slots must be a whole number of at least 1"),
    (["-H", "a b:2", "p"], "dtrain: -H 'a b:2': 'a b' is not a host name"),
    (["-H", "a:2,,b", "p"], "dtrain: -H 'a:2,,b': empty host entry"),
    (["-H", "a:2,a:3", "p"], "dtrain: -H 'a:2,a:3': host 'a' is listed twice"),
    (["-H", "fe80::1", "p"], "IPv6 addresses are not supported"),
    (["-H", "a", "-H", "b", "p"], "dtrain: -H given twice"),
    (["-H", "a", "--hostfile", "f", "p"], "dtrain: -H and --hostfile both given"),
    (["--cluster", "-H", "a", "p"], "dtrain: --cluster takes its hosts from DTRAIN_HOSTS"),
    (["--slots", "2", "p"], "dtrain: --slots applies to --cluster only"),
    (["--cluster", "--cluster-port", "70000", "p"], "dtrain: --cluster-port 70000: ports go up"),
    (["-np", "2"], "dtrain: no program to run; usage: dtrainrun"),
    (["-np", "2", "--"], "dtrain: no program to run"),
    (["-x", "1BAD=2", "p"], "dtrain: -x '1BAD=2': '1BAD' is not an environment variable name"),
    (["--mpi", "lam", "p"], "dtrain: --mpi 'lam': expected mpich or openmpi"),
    (["--restarts", "-1", "p"], "dtrain: --restarts expects a whole number, got '-1'"),
    (["--start-timeout", "0", "p"], "dtrain: --start-timeout 0: must be more than 0 seconds"),
    (["--start-timeout", "soon", "p"], "dtrain: --start-timeout expects seconds, got 'soon'"),
]


class BadArguments(unittest.TestCase):
    def test_each_message(self):
        for argv, message in BAD_ARGUMENTS:
            with self.subTest(argv=argv):
                with self.assertRaises(UsageError) as caught:
                    options.parse(argv)
                self.assertIn(message, str(caught.exception))
                self.assertTrue(str(caught.exception).startswith("dtrain: "))


class RefusedBeforeStarting(unittest.TestCase):
    """Through dtrainrun itself: exit 2, the message on stderr, and the program never ran."""

    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)
        self.marker = os.path.join(self.dir.name, "ran")

    def refused(self, args, message, **env):
        from launcher_test_support import clean_env
        done = dtrainrun(*args, env=clean_env(**env))
        self.assertEqual(done.returncode, 2, done.stderr)
        self.assertIn(message, done.stderr)
        self.assertEqual(done.stdout, "")
        self.assertFalse(os.path.exists(self.marker), "the program ran")

    def touch(self):
        return [program("touch_file.py"), self.marker]

    def hostfile(self, text):
        path = os.path.join(self.dir.name, "hosts")
        with open(path, "w") as f:
            f.write(text)
        return path

    def test_parse_errors(self):
        for argv, message in BAD_ARGUMENTS:
            if argv and argv[-1] == "p":
                with self.subTest(argv=argv):
                    self.refused(argv[:-1] + ["--"] + self.touch(), message)

    def test_more_ranks_than_slots(self):
        self.refused(["-np", "5", "-H", "a:2,b:2", "--"] + self.touch(),
                     "dtrain: -np 5 needs 5 slots but -H has 4 (a:2, b:2); lower -np or give "
                     "the hosts more slots")

    def test_ranks_needed_without_hosts(self):
        self.refused(["--"] + self.touch(), "dtrain: give the number of ranks with -np N")

    def test_missing_program(self):
        self.refused(["-np", "2", "--", os.path.join(self.dir.name, "nothing")],
                     f"dtrain: program '{os.path.join(self.dir.name, 'nothing')}': no such file")
        self.refused(["-np", "2", "--", "no-such-program-dtrain"],
                     "dtrain: program 'no-such-program-dtrain' is not on PATH")

    def test_program_not_executable(self):
        path = os.path.join(self.dir.name, "plain.txt")
        open(path, "w").close()
        os.chmod(path, stat.S_IRUSR | stat.S_IWUSR)
        self.refused(["-np", "2", "--", path], "not an executable file")

    def test_unset_forwarded_variable(self):
        self.refused(["-np", "1", "-x", "DTRAIN_TEST_SURELY_UNSET", "--"] + self.touch(),
                     "dtrain: -x DTRAIN_TEST_SURELY_UNSET: DTRAIN_TEST_SURELY_UNSET is not set "
                     "here; give it a value with -x DTRAIN_TEST_SURELY_UNSET=VALUE")

    def test_hostfile_errors(self):
        missing = os.path.join(self.dir.name, "no-hostfile")
        self.refused(["--hostfile", missing, "--"] + self.touch(),
                     f"dtrain: --hostfile {missing}: cannot read it: No such file or directory")
        bad = self.hostfile("a slots=2\nb slots=two\n")
        self.refused(["--hostfile", bad, "--"] + self.touch(),
                     f"dtrain: --hostfile {bad} line 2: host 'b' has slots 'two'")
        odd = self.hostfile("a max=2\n")
        self.refused(["--hostfile", odd, "--"] + self.touch(),
                     f"dtrain: --hostfile {odd} line 1: 'a max=2' is not 'host slots=N'")
        empty = self.hostfile("# nothing\n\n")
        self.refused(["--hostfile", empty, "--"] + self.touch(),
                     f"dtrain: --hostfile {empty} lists no hosts")

    def test_launcher_that_is_not_mpi(self):
        self.refused(["-np", "1", "--launcher", "/bin/true", "--"] + self.touch(),
                     "dtrain: --launcher /bin/true: `/bin/true --version` names neither")


class Help(unittest.TestCase):
    def test_help_lists_every_option(self):
        done = dtrainrun("--help")
        self.assertEqual(done.returncode, 0)
        for spelling in list(options._VALUED) + list(options._FLAGS):
            self.assertIn(spelling, done.stdout)


if __name__ == "__main__":
    unittest.main()
