"""dtrainrun's command line: what it accepts, and the message for each mistake. The mistakes are
also run through dtrainrun itself, which must exit 2 before starting anything."""
import os
import re
import shlex
import stat
import tempfile
import unittest
from unittest import mock

from launcher_test_support import clean_env, dtrainrun, package_path, program

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

    def test_largest_counts(self):
        o = options.parse(["-np", "1048576", "--restarts", "10000", "p"])
        self.assertEqual((o.np, o.restarts), (1048576, 10000))
        self.assertEqual(options.parse(["-np", "0002", "p"]).np, 2)
        self.assertEqual(options.parse(["-H", "a:1048576", "p"]).hosts, [Host("a", 1048576)])

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
    # Counts are bounded (Note [Bounded counts]): a huge -np used to make dtrainrun build a list
    # of every rank, and more than 4300 digits stopped Python's int() with a traceback.
    (["-np", "99999999999999999999", "p"],
     "dtrain: -np 99999999999999999999: too large; -np accepts 1 to 1048576 (the most ranks one "
     "job can have)"),
    (["-np", "1048577", "p"], "dtrain: -np 1048577: too large; -np accepts 1 to 1048576"),
    (["-np", "9" * 5000, "p"], "dtrain: -np " + "9" * 80 + "... (5000 characters): too large"),
    (["-np", "\u00b2", "p"], "dtrain: -np expects a whole number, got '\u00b2'"),
    (["--restarts", "10001", "p"], "dtrain: --restarts 10001: too large; --restarts accepts 0 to "
                                   "10000"),
    (["--cluster", "--slots", "1048577", "p"],
     "dtrain: --slots 1048577: too large; --slots accepts 1 to 1048576"),
    (["--cluster", "--cluster-port", "9" * 5000, "p"], "dtrain: --cluster-port 9999"),
    (["-H", "a:1048577", "p"],
     "dtrain: -H 'a:1048577': host 'a' has 1048577 slots; a host has 1 to 1048576 (the most "
     "ranks one job can have)"),
    (["-H", "a:" + "9" * 5000, "p"], "slots; a host has 1 to 1048576"),
    (["-H", "a\x01b", "p"], "dtrain: -H 'a\\x01b': 'a\\x01b' is not a host name"),
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
        done = dtrainrun(*args, env=clean_env(**env), timeout=60, bounded=True)
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

    def test_huge_counts_are_refused_before_anything_runs(self):
        # This used to start the MPI launcher and then build a list of every rank, growing by
        # hundreds of megabytes a second; --dry-run printed a command for 10**20 ranks.
        for dry_run in ([], ["--dry-run"]):
            self.refused(dry_run + ["-np", "99999999999999999999", "--"] + self.touch(),
                         "dtrain: -np 99999999999999999999: too large; -np accepts 1 to 1048576")

    def test_more_slots_than_a_job_can_have(self):
        self.refused(["-H", "a:1048576,b:1", "--"] + self.touch(),
                     "dtrain: -H has 1048577 slots (a:1048576, b:1), more than 1048576 (the most "
                     "ranks one job can have); choose how many ranks with -np N")
        done = dtrainrun("--dry-run", "--mpi", "mpich", "-np", "2", "-H", "a:1048576,b:1", "--",
                         program("touch_file.py"), self.marker)
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertIn(" -hosts a:2 -n 2 ", done.stdout)

    def test_hostfile_that_is_not_utf8(self):
        path = os.path.join(self.dir.name, "hosts-latin1")
        with open(path, "wb") as f:
            f.write(b"# caf\xe9 cluster\nnode1 slots=2\nn\xf6de2 slots=2\n")
        self.refused(["--hostfile", path, "--"] + self.touch(),
                     f"dtrain: --hostfile {path} line 3: byte 0xf6 is not UTF-8 text; a hostfile "
                     f"is plain text")
        with open(path, "wb") as f:
            f.write(b"# caf\xe9 cluster: bytes in a comment do not matter\nnode1 slots=2\n")
        done = dtrainrun("--dry-run", "--mpi", "mpich", "--hostfile", path, "--",
                         program("touch_file.py"), self.marker)
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertIn(" -hosts node1:2 -n 2 ", done.stdout)

    def test_hostfile_that_never_ends(self):
        self.refused(["--hostfile", "/dev/zero", "--"] + self.touch(),
                     "dtrain: --hostfile /dev/zero: larger than 64 MiB")

    def test_hostfile_with_more_hosts_than_a_job_can_have(self):
        from dtrain_launcher import hosts
        with mock.patch.object(hosts, "MAX_RANKS", 2):
            with self.assertRaisesRegex(UsageError, "dtrain: --hostfile f lists 3 hosts; at most "
                                                    "2 "):
                hosts.parse_hostfile_text("a\nb\nc\n", "f")

    def test_launcher_that_is_not_mpi(self):
        self.refused(["-np", "1", "--launcher", "/bin/true", "--"] + self.touch(),
                     "dtrain: --launcher /bin/true: `/bin/true --version` names neither")


class BytesThatAreNotUtf8(unittest.TestCase):
    """Arguments, file names and variables are bytes; dtrainrun answers the ones that are not
    UTF-8 with a message, or passes them on unchanged, but never with a traceback. Python decodes
    them with surrogateescape: '\\udcff' here is the byte 0xff."""

    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)

    def test_in_the_slurm_variables(self):
        done = dtrainrun("--dry-run", "--mpi", "mpich", "--", program("touch_file.py"), "x",
                         env=clean_env(SLURM_JOB_NODELIST="node\udcff1"))
        self.assertEqual(done.returncode, 2, done.stderr)
        self.assertIn("dtrain: SLURM_JOB_NODELIST: 'node\\udcff1' is not a host name",
                      done.stderr)
        done = dtrainrun("--dry-run", "--mpi", "mpich", "--", program("touch_file.py"), "x",
                         env=clean_env(SLURM_JOB_NODELIST="n1", SLURM_TASKS_PER_NODE="\udcff"))
        self.assertEqual(done.returncode, 2, done.stderr)
        self.assertIn("dtrain: SLURM_TASKS_PER_NODE='\\udcff': '\\udcff' is not N or N(xR)",
                      done.stderr)

    def test_in_the_cluster_variables(self):
        done = dtrainrun("--cluster", "--dry-run", "--", program("touch_file.py"), "x",
                         env=clean_env(SM_HOSTS='["a"]', SM_CURRENT_HOST="a",
                                       SM_NUM_GPUS="\u00b2"))
        self.assertEqual(done.returncode, 2, done.stderr)
        self.assertIn("dtrain: SM_NUM_GPUS='\u00b2' is not a whole number", done.stderr)
        done = dtrainrun("--cluster", "--dry-run", "--", program("touch_file.py"), "x",
                         env=clean_env(DTRAIN_HOSTS="a,b\udcff", DTRAIN_CURRENT_HOST="a"))
        self.assertEqual(done.returncode, 2, done.stderr)
        self.assertIn("'b\\udcff' is not a host name", done.stderr)

    def test_program_arguments_pass_through(self):
        # A UTF-8 locale other than C.UTF-8 makes Python's stdout strict; so does this.
        env = clean_env(PYTHONIOENCODING="utf-8:strict")
        done = dtrainrun("--dry-run", "--mpi", "mpich", "-np", "1", "--",
                         program("touch_file.py"), "caf\udce9", env=env)
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertTrue(done.stdout.rstrip("\n").endswith("touch_file.py 'caf\udce9'"),
                        done.stdout)
        target = os.path.join(self.dir.name, "caf\udce9")
        done = dtrainrun("--verbose", "-np", "1", "--", program("touch_file.py"), target,
                         env=env)
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertIn(f"touch_file.py {shlex.quote(target)}\n", done.stderr)  # the command line
        self.assertTrue(os.path.exists(target))
        done = dtrainrun("--check-build", "--", os.path.join(self.dir.name, "no\udcff"),
                         env=env)
        self.assertEqual(done.returncode, 2, done.stderr)
        self.assertIn("dtrain: program '" + self.dir.name + "/no\\udcff': no such file",
                      done.stderr)


class Help(unittest.TestCase):
    def test_help_lists_every_option(self):
        done = dtrainrun("--help")
        self.assertEqual(done.returncode, 0)
        self.assertTrue(done.stdout.startswith("usage: dtrainrun [options] [--] program"))
        self.assertGreater(len(options.spellings()), 20)
        for spelling in options.spellings():
            self.assertRegex(done.stdout, f"(^|[ ,]){re.escape(spelling)}([ ,]|$)")

    def test_help_fits_the_terminal_it_was_written_for(self):
        for line in options.help_text().splitlines():
            self.assertLessEqual(len(line), 100, line)


class ArgparseBehaviour(unittest.TestCase):
    """What parsing on argparse added or changed (Note [argparse for a launcher] in options.py):
    pinned here, because argparse's handling of these cases has changed between Python
    versions."""

    def test_dashes_end_the_options_once(self):
        self.assertEqual(options.parse(["-np", "2", "--", "./t", "--", "x"]).program,
                         ["./t", "--", "x"])
        self.assertEqual(options.parse(["--", "--", "x"]).program, ["--", "x"])
        self.assertEqual(options.parse(["--", "-np", "3"]).program, ["-np", "3"])
        self.assertEqual(options.parse(["--", "-"]).program, ["-"])
        self.assertIsNone(options.parse(["--", "-np", "3"]).np)

    def test_the_programs_options_stay_the_programs(self):
        o = options.parse(["--verbose", "./t", "--verbose", "-np", "9", "-H", "x", "--frob"])
        self.assertEqual(o.program, ["./t", "--verbose", "-np", "9", "-H", "x", "--frob"])
        self.assertEqual((o.np, o.hosts, o.verbose), (None, None, True))
        self.assertEqual(options.parse(["-", "a"]).program, ["-", "a"])

    def test_np_n_and_joined_values(self):
        for argv in (["-np", "4", "p"], ["-n", "4", "p"], ["-np=4", "p"], ["-n4", "p"],
                     ["--num-proc=4", "p"], ["-n=4", "p"]):
            self.assertEqual(options.parse(argv).np, 4, argv)
        o = options.parse(["-vn", "4", "-xA=1", "-H=a:2", "p"])
        self.assertEqual((o.verbose, o.np, o.env, o.hosts), (True, 4, [("A", "1")],
                                                             [Host("a", 2)]))

    def test_values_that_start_with_a_dash_are_joined(self):
        o = options.parse(["--launcher-agent=-weird", "--hostfile=-hosts", "p"])
        self.assertEqual((o.launcher_agent, o.hostfile), ("-weird", "-hosts"))
        with self.assertRaises(UsageError) as caught:
            options.parse(["-x", "-X", "p"])
        self.assertEqual(str(caught.exception), "dtrain: -x needs a value; see dtrainrun --help")

    def test_repeated_options(self):
        o = options.parse(["-x", "A=1", "-x", "B", "-np", "2", "-np", "3", "p"])
        self.assertEqual((o.env, o.np), ([("A", "1"), ("B", None)], 3))  # the last -np counts
        self.assertEqual(options.parse(["p"]).env, [])  # the default list is not shared
        self.assertEqual(options.parse(["-x", "C=1", "p"]).env, [("C", "1")])

    def test_defaults(self):
        o = options.parse(["p"])
        self.assertEqual((o.start_timeout_s, o.cluster_port, o.cluster_timeout_s, o.prefix,
                          o.verbose, o.cluster, o.check_build, o.dry_run, o.mpi, o.launcher,
                          o.launcher_agent, o.hostfile, o.slots, o.given),
                         (120.0, 29517, 300.0, True, False, False, False, False, None, None,
                          None, None, None, []))


ARGPARSE_MISTAKES = [
    # A missing value is named as it was typed.
    (["-n"], "dtrain: -n needs a value; see dtrainrun --help"),
    (["--num-proc"], "dtrain: --num-proc needs a value; see dtrainrun --help"),
    (["-np", "--", "p"], "dtrain: -np needs a value; see dtrainrun --help"),
    (["-np", "-v", "p"], "dtrain: -np needs a value; see dtrainrun --help"),
    (["--hostfile"], "dtrain: --hostfile needs a value"),
    (["--num-proc=", "p"], "dtrain: --num-proc expects a whole number, got ''"),
    # A one-letter option takes what is joined to it: -np8 is -n with 'p8'.
    (["-np8", "p"], "dtrain: -n expects a whole number, got 'p8'"),
    (["-np 4", "p"], "dtrain: -n expects a whole number, got 'p 4'"),
    # No abbreviations, no negative numbers, no options hidden in words with spaces.
    (["--verb", "p"], "dtrain: unknown option '--verb'; see dtrainrun --help (the program and "
                      "its own options come after '--')"),
    (["--frobnicate=3", "p"], "dtrain: unknown option '--frobnicate=3'"),
    (["-5", "p"], "dtrain: unknown option '-5'"),
    (["--frob nicate", "p"], "dtrain: unknown option '--frob nicate'"),
    # argparse's own finding, in a dtrain: message.
    (["--verbose=yes", "p"], "dtrain: argument --verbose/-v: ignored explicit argument 'yes'; "
                             "see dtrainrun --help"),
]


class ArgparseMistakes(unittest.TestCase):
    def test_an_unknown_flag_grouped_with_a_known_one(self):
        # Python 3.11 says "argument --verbose/-v: ignored explicit argument 'q'", newer ones
        # report '-q' as unknown: either way a dtrain: message naming it.
        with self.assertRaises(UsageError) as caught:
            options.parse(["-vq", "p"])
        self.assertRegex(str(caught.exception), r"^dtrain: .*'-?q'")

    def test_each_message(self):
        for argv, message in ARGPARSE_MISTAKES:
            with self.subTest(argv=argv):
                with self.assertRaises(UsageError) as caught:
                    options.parse(argv)
                self.assertIn(message, str(caught.exception))

    def test_through_dtrainrun(self):
        for argv, message in ARGPARSE_MISTAKES[:3] + ARGPARSE_MISTAKES[-4:]:
            with self.subTest(argv=argv):
                done = dtrainrun(*argv)
                self.assertEqual((done.returncode, done.stdout), (2, ""), done.stderr)
                self.assertIn(message, done.stderr)
                self.assertNotIn("Traceback", done.stderr)


if __name__ == "__main__":
    unittest.main()
