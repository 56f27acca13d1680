"""dtrain-report on bad or partial input: each problem is a clear error or a note in the report,
never a traceback; and the command line's outputs and exit codes."""

import io
import json
import sys
import tempfile
import unittest
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import synthetic  # noqa: E402
from dtrain_report import cli  # noqa: E402
from dtrain_report.profile_reader import ProfileError, load_run  # noqa: E402

CHART_IDS = ("chart-step-breakdown", "chart-utilization", "chart-straggler-heatmap",
             "chart-comm-compute")


def run_cli(*args) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = cli.main([str(a) for a in args])
        except SystemExit as e:  # argparse usage errors
            code = e.code
    return code, out.getvalue(), err.getvalue()


class InTempDir(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self._tmp.cleanup)
        self.tmp = Path(self._tmp.name)

    def run_folder(self, **kw) -> Path:
        return synthetic.write_run(self.tmp / "prof", **kw)


class Input(InTempDir):
    def test_a_truncated_last_line_is_left_out_and_reported(self):
        folder = self.run_folder(ranks=2, closed=False)
        f = folder / "rank-1.jsonl"
        text = f.read_text()
        f.write_text(text[:-40])  # cut in the middle of the last record, as a crash would
        run = load_run([folder])
        self.assertEqual(sorted(run.ranks), [0, 1])
        self.assertTrue(any("rank-1.jsonl: its last line" in s and "cut short" in s
                            for s in run.skipped), run.skipped)
        self.assertTrue(any("rank 1's profile has no end record" in s for s in run.skipped))
        self.assertEqual(len(run.ranks[0].steps), 40)

    def test_padding_lines_are_skipped_silently(self):
        folder = self.run_folder(ranks=1)
        f = folder / "rank-0.jsonl"
        lines = f.read_text().splitlines(keepends=True)
        lines.insert(4, " " * 300 + "\n")
        lines.insert(9, "\n")
        f.write_text("".join(lines))
        run = load_run([folder])
        self.assertEqual(run.skipped, [])
        self.assertEqual(len(run.ranks[0].steps), 40)

    def test_a_foreign_file_is_skipped_with_the_reason(self):
        folder = self.run_folder(ranks=2)
        (folder / "notes.jsonl").write_text('{"hello": "world"}\n')
        (folder / "binary.jsonl").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
        run = load_run([folder])
        self.assertEqual(sorted(run.ranks), [0, 1])
        self.assertIn("notes.jsonl: not a dtrain profile (its first line is not a dtrain-profile "
                      "header)", run.skipped)
        self.assertIn("binary.jsonl: not a dtrain profile (its first line is not JSON)",
                      run.skipped)

    def test_nothing_usable_is_an_error_that_says_why(self):
        foreign = self.tmp / "trace.json"
        foreign.write_text('[{"name": "x", "ph": "X"}]\n')
        with self.assertRaisesRegex(ProfileError, "trace.json: not a dtrain profile"):
            load_run([foreign])
        empty = self.tmp / "empty"
        empty.mkdir()
        with self.assertRaisesRegex(ProfileError, "no profile files .* DTRAIN_PROFILE="):
            load_run([empty])
        with self.assertRaisesRegex(ProfileError, "does not exist"):
            load_run([self.tmp / "missing"])

    def test_a_newer_format_and_bad_lines_in_the_middle(self):
        folder = self.run_folder(ranks=3)
        f = folder / "rank-2.jsonl"
        header = json.loads(f.read_text().splitlines()[0])
        header["version"] = 7
        f.write_text(json.dumps(header) + "\n")
        g = folder / "rank-1.jsonl"
        lines = g.read_text().splitlines(keepends=True)
        lines[5] = "this is not json\n"
        lines[6] = '{"type": "step", "step": "six"}\n'
        g.write_text("".join(lines))
        run = load_run([folder])
        self.assertEqual(sorted(run.ranks), [0, 1])
        self.assertTrue(any("rank-2.jsonl: written by a newer dtrain (format version 7" in s
                            for s in run.skipped), run.skipped)
        self.assertIn("rank-1.jsonl: 2 line(s) that are not valid profile records were left out "
                      "(line 6: not JSON (Expecting value); line 7: a step record whose 'step' is "
                      "\"six\", not a number)", run.skipped)
        self.assertIn("no profile for rank(s) 2 of 3: the report covers the other ranks only",
                      run.skipped)
        self.assertEqual(len(run.ranks[1].steps), 38)

    def test_files_of_an_older_run_are_not_merged(self):
        folder = self.run_folder(ranks=2, run_id="new")
        old = synthetic.write_run(self.tmp / "old", ranks=3, run_id="old")
        for f in old.glob("*.jsonl"):
            text = f.read_text().replace('"start_unix_ms": 1700000000000.0',
                                         '"start_unix_ms": 1600000000000.0')
            (folder / ("old-" + f.name)).write_text(text)
        run = load_run([folder])
        self.assertEqual(run.run_id, "new")
        self.assertEqual(sorted(run.ranks), [0, 1])
        self.assertEqual(sum("from another run (run id old)" in s for s in run.skipped), 3)


class CommandLine(InTempDir):
    def test_writes_a_report_with_the_charts_findings_and_what_was_skipped(self):
        def phases(rank, step):
            p = dict(synthetic.HEALTHY_PHASES)
            if rank == 1:
                p["data"] = 50.0
            return p
        folder = self.run_folder(ranks=2, phases=phases)
        (folder / "stray.jsonl").write_text("not a profile\n")
        out = self.tmp / "report.html"
        code, stdout, stderr = run_cli(folder, "-o", out)
        self.assertEqual(code, 0, stderr)
        self.assertIn("FINDING Data-loader bound", stdout)
        self.assertIn("skipped: stray.jsonl: not a dtrain profile", stdout)
        html = out.read_text()
        for chart in CHART_IDS:
            self.assertIn(f'id="{chart}"', html)
        self.assertIn('id="finding-data_loader_bound"', html)
        self.assertIn("stray.jsonl: not a dtrain profile", html)
        self.assertNotIn("<script", html)
        self.assertNotIn("http://", html.replace('xmlns="http://www.w3.org/2000/svg"', ""))
        self.assertNotIn("https://", html)

    def test_thresholds_from_the_command_line_change_the_verdict(self):
        def phases(rank, step):
            p = dict(synthetic.HEALTHY_PHASES)
            p["data"] = 40.0
            return p
        folder = self.run_folder(ranks=2, phases=phases)
        code, stdout, _ = run_cli(folder, "-o", self.tmp / "a.html")
        self.assertIn("FINDING Data-loader bound", stdout)
        code, stdout, _ = run_cli(folder, "-o", self.tmp / "b.html", "--threshold",
                                  "data_share_high=0.5")
        self.assertEqual(code, 0)
        self.assertIn("quiet: Data-loader bound", stdout)
        self.assertIn("(default 0.2)", (self.tmp / "b.html").read_text())

    def test_errors_exit_non_zero_with_a_message(self):
        code, _, err = run_cli(self.tmp / "nowhere", "-o", self.tmp / "r.html")
        self.assertEqual(code, 1)
        self.assertIn("dtrain-report: '", err)
        self.assertIn("does not exist", err)
        folder = self.run_folder(ranks=1)
        code, _, err = run_cli(folder, "-o", self.tmp / "no-such-dir" / "r.html")
        self.assertEqual(code, 1)
        self.assertIn("cannot write the report", err)
        code, _, err = run_cli(folder, "--threshold", "nope=1")
        self.assertEqual(code, 2)
        self.assertIn("unknown threshold 'nope'", err)
        code, _, _ = run_cli()
        self.assertEqual(code, 2)

    def test_list_thresholds(self):
        code, out, _ = run_cli("--list-thresholds")
        self.assertEqual(code, 0)
        self.assertIn("straggler_slowdown", out)


if __name__ == "__main__":
    unittest.main()
