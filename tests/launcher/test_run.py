"""Jobs run through dtrainrun on this machine: what the ranks print and how it is labelled, which
variables reach them, and the exit status of the job."""
import json
import os
import socket
import subprocess
import sys
import unittest
from unittest import mock

from launcher_test_support import (PROGRAMS, built_mpi_flavor, clean_env, dtrainrun, package_path,
                                   program)

PROBE = os.environ.get("DTRAIN_TEST_PROBE")
sys.path.insert(0, PROGRAMS)
import long_lines  # noqa: E402  (the test program's content(), to check its lines)
HOST = socket.gethostname()


# Open MPI hands a rank's output to mpirun through a pseudo-terminal in reads of up to 4 KiB, and
# mpirun interleaves the reads of different ranks, so the pieces of a long line (Note [Line pieces]
# in records.py) can be cut between them: docs/running.md, Known problems.
skip_long_lines_under_openmpi = unittest.skipIf(
    built_mpi_flavor() == "openmpi",
    "known problem: Open MPI may cut the long lines that several ranks print at once")


class Output(unittest.TestCase):
    @skip_long_lines_under_openmpi
    def test_every_line_is_labelled_with_its_rank_and_stream(self):
        done = dtrainrun("-np", "2", "--", program("output_lines.py"))
        self.assertEqual(done.returncode, 0, done.stderr)
        for rank in (0, 1):
            mine = [line for line in done.stdout.splitlines() if line.startswith(f"[{rank}]")]
            tag = f"[{rank}]<stdout>:"
            # In order, whole: the long line unbroken, the split line joined, the last line
            # ended, and bytes that are not UTF-8 passed through as they are.
            self.assertEqual(mine, [tag + f"hello from {rank}", tag, tag + "x" * 100000,
                                    tag + "bytes \udcff\udcfe end",
                                    tag + f"two parts of one line from {rank}",
                                    tag + f"no newline from {rank}"])
            self.assertIn(f"[{rank}]<stderr>:warning from {rank}\n", done.stderr)
        self.assertEqual(len(done.stdout.splitlines()), 12)

    @skip_long_lines_under_openmpi
    def test_without_prefix(self):
        done = dtrainrun("--no-prefix", "-np", "2", "--", program("output_lines.py"))
        self.assertEqual(done.returncode, 0, done.stderr)
        lines = done.stdout.splitlines()
        self.assertEqual(sorted(line for line in lines if "from" in line),
                         sorted([f"{what} from {r}" for r in (0, 1)
                                 for what in ("hello", "two parts of one line", "no newline")]))
        self.assertNotIn("<stdout>", done.stdout)
        self.assertIn("warning from 1\n", done.stderr)
        self.assertNotIn("<stderr>", done.stderr)

    @skip_long_lines_under_openmpi
    def test_lines_of_several_mib_arrive_whole(self):
        # 5 MiB and 3 MiB lines, and a last one of 1.5 MiB without a newline: each arrives as one
        # line with one tag, in order, and larger than what dtrainrun keeps in memory
        # (records.SPILL_BYTES), so the temporary-file path is part of the test.
        sizes = {"stdout": 5 << 20, "stderr": 3 << 20, "last": 3 << 19}
        done = dtrainrun("-np", "2", "--", program("long_lines.py"), str(sizes["stdout"]),
                         str(sizes["stderr"]), str(sizes["last"]), timeout=180)
        self.assertEqual(done.returncode, 0, done.stderr[-2000:])
        out, err = done.stdout.splitlines(), done.stderr.splitlines()
        self.assertEqual(len(out), 6, [line[:80] for line in out])
        self.assertEqual(len(err), 2, [line[:80] for line in err])
        for rank in (0, 1):
            tag = f"[{rank}]<stdout>:"
            mine = [line for line in out if line.startswith(f"[{rank}]")]
            expected = [tag + long_lines.content(rank, "stdout", sizes["stdout"]).decode(),
                        tag + f"after the long line from {rank}",
                        tag + long_lines.content(rank, "last", sizes["last"]).decode()]
            self.assertEqual(len(mine), 3)
            for got, want in zip(mine, expected):
                self.assertTrue(got == want, f"rank {rank}: a line of {len(got)} characters "
                                             f"instead of {len(want)}: {got[:100]}")
            want = (f"[{rank}]<stderr>:" +
                    long_lines.content(rank, "stderr", sizes["stderr"]).decode())
            self.assertIn(want, err)

    def test_long_lines_without_prefix(self):
        done = dtrainrun("--no-prefix", "-np", "1", "--", program("long_lines.py"),
                         str(1 << 20), "10", "3", timeout=60)
        self.assertEqual(done.returncode, 0, done.stderr[-2000:])
        self.assertEqual(done.stdout.splitlines(),
                         [long_lines.content(0, "stdout", 1 << 20).decode(),
                          "after the long line from 0", long_lines.content(0, "last", 3).decode()])


class Variables(unittest.TestCase):
    def test_settings_and_x_variables_reach_every_rank(self):
        names = ["DTRAIN_FUSION_THRESHOLD", "HOROVOD_CYCLE_TIME", "GIVEN", "FROM_HERE",
                 "DTRAIN_HOSTS", "DTRAINRUN_RESTART_COUNT"]
        env = clean_env(DTRAIN_FUSION_THRESHOLD="1048576", HOROVOD_CYCLE_TIME="3",
                        FROM_HERE="here value", DTRAIN_HOSTS="not,for,ranks")
        done = dtrainrun("-np", "2", "-x", "GIVEN=a=b c", "-x", "FROM_HERE", "--no-prefix",
                         "--", program("env_report.py"), *names, env=env)
        self.assertEqual(done.returncode, 0, done.stderr)
        reports = sorted((json.loads(line) for line in done.stdout.splitlines()),
                         key=lambda r: r["rank"])
        self.assertEqual([r["rank"] for r in reports], [0, 1])
        for report in reports:
            self.assertEqual(report["env"], {
                "DTRAIN_FUSION_THRESHOLD": "1048576", "HOROVOD_CYCLE_TIME": "3",
                "GIVEN": "a=b c", "FROM_HERE": "here value",
                "DTRAIN_HOSTS": None,  # dtrainrun's own input, not a dtrain setting
                "DTRAINRUN_RESTART_COUNT": "0"})


class ExitStatus(unittest.TestCase):
    def run_job(self, *plan, np=3):
        return dtrainrun("-np", str(np), "--", program("exit_codes.py"), *plan)

    def test_success(self):
        done = self.run_job()
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertEqual(done.stderr, "")

    def test_a_rank_exiting_3_makes_dtrainrun_exit_3(self):
        done = self.run_job("1=3")
        self.assertEqual(done.returncode, 3, done.stderr)
        self.assertIn(f"dtrainrun: job failed: rank 1 on {HOST} exited with code 3; exiting "
                      f"with 3", done.stderr)

    def test_the_first_failure_wins(self):
        done = self.run_job("1=3", "2=5@1.5")
        self.assertEqual(done.returncode, 3, done.stderr)
        done = self.run_job("1=3@1.5", "2=5")
        self.assertEqual(done.returncode, 5, done.stderr)
        self.assertIn(f"rank 2 on {HOST} exited with code 5", done.stderr)

    def test_a_killed_rank(self):
        done = self.run_job("2=SIGKILL")
        self.assertEqual(done.returncode, 128 + 9, done.stderr)
        self.assertIn(f"rank 2 on {HOST} was killed by signal 9 (SIGKILL)", done.stderr)

    def test_the_others_are_stopped_when_they_would_wait_forever(self):
        # Rank 1 fails; ranks 0 and 2 never end by themselves (as ranks waiting in MPI_Init for
        # a rank that failed before it would). dtrainrun stops them and reports rank 1.
        done = self.run_job("1=4", "0=hang", "2=hang")
        self.assertEqual(done.returncode, 4, done.stderr)
        self.assertIn(f"rank 1 on {HOST} exited with code 4", done.stderr)

    @unittest.skipUnless(PROBE, "DTRAIN_TEST_PROBE (the dtrain test program) is not set")
    def test_a_failing_mpi_rank(self):
        # Hydra answers this by killing ranks 0 and 2 and exiting with their 9.
        done = dtrainrun("-np", "3", "--", PROBE, "--exit-rank", "1", "--exit-code", "3")
        self.assertEqual(done.returncode, 3, done.stderr)
        self.assertIn(f"rank 1 on {HOST} exited with code 3", done.stderr)
        self.assertNotIn("BAD TERMINATION", done.stdout + done.stderr)

    def test_ranks_that_never_start(self):
        # The agent that should start processes on the second host fails. Hydra waits for ever,
        # and dtrainrun gives up after --start-timeout; Open MPI's mpirun gives up by itself.
        done = dtrainrun("-H", "localhost:1,127.0.0.2:1", "--launcher-agent", "/bin/false",
                         "--start-timeout", "3", "--", program("exit_codes.py"))
        self.assertEqual(done.returncode, 121, done.stderr)
        if built_mpi_flavor() == "openmpi":
            self.assertRegex(done.stderr, r"dtrainrun: job failed: \S*mpi\S* exited with code "
                                          r"\d+ before rank\(s\) 0-1 started; exiting with 121")
        else:
            self.assertIn("dtrainrun: job failed: rank(s) 1 did not start within 3 s",
                          done.stderr)


class RankWrapper(unittest.TestCase):
    """The wrapper each rank runs in, on its own (Note [Rank records])."""

    def wrap(self, *argv):
        package_path()
        from dtrain_launcher import records
        done = subprocess.run([os.environ.get("DTRAINRUN", "dtrainrun"), "--rank-shim",
                               "0123abcd", "--", *argv], env=clean_env(PMI_RANK="4"),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, check=False)
        rest, found = records.split_records(done.stderr, "0123abcd")
        return done, rest, found

    def test_records_and_exit(self):
        done, rest, found = self.wrap(program("exit_codes.py"), "4=6")
        self.assertEqual(done.returncode, 6)
        self.assertEqual(done.stdout, b"[4]<stdout>:rank 4 started\n")
        self.assertEqual([(r["event"], r["rank"]) for r in found], [("start", 4), ("exit", 4)])
        self.assertEqual(found[1]["code"], 6)

    def test_program_that_cannot_start(self):
        done, rest, found = self.wrap("/nonexistent/program")
        self.assertEqual(done.returncode, 127)
        self.assertIn(b"[4]<stderr>:dtrain: rank 4 on ", rest)
        self.assertIn(b"cannot start /nonexistent/program: No such file or directory", rest)
        self.assertEqual(found[-1]["code"], 127)

    def test_program_name_that_is_not_utf8(self):
        done, rest, found = self.wrap("/nonexistent/caf\udce9")
        self.assertEqual(done.returncode, 127, done.stderr)
        self.assertIn(b"cannot start /nonexistent/caf\xe9: No such file or directory", rest)
        self.assertEqual(found[-1]["code"], 127)

    def test_rank_that_is_not_a_number(self):
        for odd in ("\u00b2", "9" * 5000):
            with self.subTest(rank=odd[:8]):
                done = subprocess.run([os.environ.get("DTRAINRUN", "dtrainrun"), "--rank-shim",
                                       "0123abcd", "--", "echo", "hello"],
                                      env=clean_env(PMI_RANK=odd), stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, check=False)
                self.assertEqual(done.returncode, 0, done.stderr)
                self.assertEqual(done.stdout, b"[?]<stdout>:hello\n")


class LinePieces(unittest.TestCase):
    """Note [Line pieces]: the wrapper splits lines into pieces without holding them, dtrainrun
    joins them without cutting, in memory or in a temporary file."""

    @classmethod
    def setUpClass(cls):
        package_path()
        from dtrain_launcher import records
        cls.records = records

    def join(self, pieces, spill_bytes=1000):
        """What dtrainrun prints for these pieces, as (tag, text) per line."""
        lines, open_line = [], None
        for piece in pieces:
            self.assertTrue(piece.endswith(b"\n"))
            self.assertLessEqual(len(piece), self.records.PIECE_BYTES)
            rank, stream, continued, text = self.records.parse_tag(piece)
            open_line = open_line or self.records.Line(spill_bytes)
            open_line.append(text[:-1] if continued else text)
            if not continued:
                lines.append((rank, stream, b"".join(open_line.chunks())))
                open_line.close()
                open_line = None
        self.assertIsNone(open_line, "a line was left without its last piece")
        return lines

    def test_the_wrapper_holds_less_than_a_piece(self):
        splitter = self.records.Splitter("3", "stdout")
        data = long_lines.content(3, "stdout", 3 << 20) + b"\nshort\n" + b"z" * 10000
        pieces = []
        for start in range(0, len(data), 65536):
            pieces += splitter.feed(data[start:start + 65536])
            self.assertLess(len(splitter.pending), self.records.PIECE_BYTES)
        pieces += splitter.feed(b"", final=True)
        self.assertEqual(self.join(pieces), [(3, "stdout", data[:(3 << 20) + 1]),
                                             (3, "stdout", b"short\n"),
                                             (3, "stdout", b"z" * 10000 + b"\n")])

    def test_a_line_ending_on_a_piece_boundary(self):
        splitter = self.records.Splitter("0", "stderr")
        size = splitter.size
        pieces = list(splitter.feed(b"a" * size))
        self.assertEqual(len(pieces), 1)  # passed on already, with "more follows"
        pieces += splitter.feed(b"", final=True)
        self.assertEqual(pieces[-1], b"[0]<stderr>:\n")
        self.assertEqual(self.join(pieces), [(0, "stderr", b"a" * size + b"\n")])

    def test_a_long_line_is_spilled_to_a_file_and_comes_back_whole(self):
        line = self.records.Line(spill_bytes=1000)
        data = long_lines.content(0, "stdout", 100000)
        for start in range(0, len(data), 777):
            line.append(data[start:start + 777])
        self.assertIsNotNone(line.file)
        self.assertLessEqual(len(line.memory), 1000)
        self.assertEqual(b"".join(line.chunks(chunk_bytes=4096)), data)
        self.assertEqual(b"".join(line.chunks()), data)  # again, from the start
        line.close()

    def test_without_a_temporary_file_the_line_stays_in_memory(self):
        with mock.patch.object(self.records.tempfile, "TemporaryFile",
                               side_effect=OSError(28, "No space left on device")):
            line = self.records.Line(spill_bytes=1000)
            line.append(b"x" * 5000)
            line.append(b"y" * 5000)
        self.assertIsNone(line.file)
        self.assertEqual(b"".join(line.chunks()), b"x" * 5000 + b"y" * 5000)

    def test_a_temporary_file_that_fills_up(self):
        import io

        class FillsUp(io.BytesIO):
            """Takes 3000 bytes, then part of a write, then fails like a full disk."""
            def write(self, data):
                room = 3500 - self.tell()
                if room <= 0:
                    raise OSError(28, "No space left on device")
                return super().write(bytes(data)[:room])

        with mock.patch.object(self.records.tempfile, "TemporaryFile",
                               side_effect=lambda **_: FillsUp()):
            line = self.records.Line(spill_bytes=1000)
            data = long_lines.content(0, "stdout", 20000)
            for start in range(0, len(data), 1500):
                line.append(data[start:start + 1500])
        self.assertEqual(line.file_bytes, 3000)
        self.assertEqual(b"".join(line.chunks(chunk_bytes=512)), data)

    def test_a_line_whose_last_piece_never_came(self):
        # The wrapper was killed while passing a long line on: what came is printed, ended.
        from dtrain_launcher import job

        class Captured(job.Output):
            lines = []

            def rank_line(self, rank, stream, line):
                self.lines.append((rank, stream, b"".join(line.chunks())))

        launcher = [sys.executable, "-c", "print('[0]<stdout>+:abc'); print('[0]<stdout>+:def')"]
        output = Captured(True, False)
        job.run_attempt(launcher, clean_env(), 1, "0123abcd", output, 30, job.Interrupts(),
                        "python")
        self.assertEqual(output.lines, [(0, "stdout", b"abcdef\n")])


if __name__ == "__main__":
    unittest.main()
