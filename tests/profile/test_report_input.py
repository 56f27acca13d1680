"""dtrain-report on bad or partial input: each problem is a clear error or a note in the report,
never a traceback; and the command line's outputs and exit codes."""

import io
import json
import random
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
        self.assertEqual([(r.run_id, len(r.files)) for r in run.other_runs], [("old", 3)])
        self.assertEqual(run.skipped, [])  # another run is no damage: a note says it was not read
        code, out, err = run_cli(folder, "-o", self.tmp / "r.html")
        self.assertIn("note: the input holds 2 runs, which are never merged: this report is of "
                      "run new, the newest. Not read: old: 3 of 3 rank(s), in the folder given,",
                      " ".join(out.split()))

    def test_non_finite_numbers_and_junk_header_fields_are_left_out(self):
        folder = self.run_folder(ranks=2)
        f = folder / "rank-0.jsonl"
        lines = f.read_text().splitlines()
        header = json.loads(lines[0])
        header.update(start_unix_ms="yesterday", cpu_count=[16], host=7,
                      gpu={"available": True, "index": "zero", "memory_total_bytes": "lots"})
        lines[0] = json.dumps(header)
        lines[3] = lines[3].replace('"duration_ms": ', '"duration_ms": -')
        sample = next(i for i, x in enumerate(lines) if '"type": "sample"' in x)
        lines[sample] = lines[sample].replace('"system_cpu_pct": 45.0', '"system_cpu_pct": NaN')
        lines.insert(5, '{"type": "step", "step": 99, "t": Infinity, "duration_ms": 1}')
        f.write_text("\n".join(lines) + "\n")
        run = load_run([folder])
        notes = "\n".join(run.skipped)
        for field in ("start_unix_ms", "cpu_count", "gpu.index", "gpu.memory_total_bytes"):
            self.assertIn(f"header field {field} is not valid and was ignored", notes)
        self.assertIn("line 4: a step record with a negative duration_ms", notes)
        self.assertIn("line 6: a step record whose 't' is Infinity, not a number", notes)
        self.assertNotIn("system_cpu_pct", run.ranks[0].samples[0])
        self.assertEqual(run.ranks[0].host, "7")
        code, out, err = run_cli(folder, "-o", self.tmp / "r.html")
        self.assertEqual(code, 0, err)

    def test_a_header_claiming_a_huge_run_is_summarized(self):
        folder = self.run_folder(ranks=1)
        f = folder / "rank-0.jsonl"
        f.write_text(f.read_text().replace('"size": 1,', '"size": 1000000000,', 1))
        run = load_run([folder])
        self.assertIn("no profile for rank(s) 999999999 ranks of 1000000000: the report covers "
                      "the other ranks only", run.skipped)
        folder2 = self.run_folder(ranks=1)
        (folder2 / "rank-0.jsonl").write_text((folder2 / "rank-0.jsonl").read_text().replace(
            '"size": 1,', '"size": 40,', 1))
        self.assertIn("no profile for rank(s) 1-39 of 40: the report covers the other ranks "
                      "only", load_run([folder2]).skipped)

    def test_damaged_files_never_raise(self):
        """Every kind of damage a disk, a kill or a stray tool could do, at random: the report is
        written (exit 0) or refused with a message (exit 1), never a traceback."""
        rng = random.Random(3)
        folder = self.run_folder(ranks=2, steps=12)
        originals = {f: f.read_bytes() for f in folder.glob("*.jsonl")}
        junk = [b"null", b"[]", b"{}", b'"x"', b"1e999", b"-1", b"true", b'{"t": {}}']
        for trial in range(80):
            for f, data in originals.items():
                data = bytearray(data)
                kind = trial % 4
                if kind == 0:  # bytes flipped
                    for _ in range(rng.randint(1, 40)):
                        data[rng.randrange(len(data))] = rng.randrange(256)
                elif kind == 1:  # cut anywhere
                    data = data[:rng.randrange(len(data))]
                elif kind == 2:  # lines swapped and values replaced by other JSON
                    lines = data.split(b"\n")
                    rng.shuffle(lines)
                    data = b"\n".join(line.replace(b"0", rng.choice(junk), 1) for line in lines)
                else:  # a record type's fields given the wrong types
                    text = data.decode()
                    for key in ("phases_ms", "gpu", "engine", "samples", "t", "rank", "size",
                                "start_unix_ms", "cpu_count", "sample_interval_ms", "index",
                                "memory_total_bytes", "utilization_pct", "system_cpu_pct"):
                        if rng.random() < 0.5:
                            text = text.replace(f'"{key}": ',
                                                f'"{key}": {rng.choice(junk).decode()}, "_": ', 1)
                    data = text.encode()
                f.write_bytes(bytes(data))
            code, out, err = run_cli(folder, "-o", self.tmp / "r.html")
            self.assertIn(code, (0, 1), f"trial {trial}: exit {code}\n{err}")
            if code == 1:
                self.assertTrue(err.startswith("dtrain-report: "), err)


class KilledAndEmptyRuns(InTempDir):
    def test_a_killed_job_is_reported_with_what_it_recorded(self):
        folder = self.run_folder(ranks=2, closed=False)
        f = folder / "rank-1.jsonl"
        lines = f.read_text().splitlines(keepends=True)
        steps = [i for i, x in enumerate(lines) if '"type": "step"' in x]
        f.write_text("".join(lines[:steps[30]]) + lines[steps[30]][:50])  # died mid-step 30
        code, out, err = run_cli(folder, "-o", self.tmp / "r.html")
        self.assertEqual(code, 0, err)
        out = " ".join(out.split())  # unwrapped
        self.assertIn("note: the job did not end cleanly: 2 of 2 rank(s) (0-1) wrote no end "
                      "record, as when a process is killed or crashes; the report covers what "
                      "was recorded (last: rank 0 at step 39, rank 1 at step 29)", out)
        self.assertIn("rank-1.jsonl: its last line (line", out)
        html = (self.tmp / "r.html").read_text()
        self.assertIn('<div class="notice">the job did not end cleanly', html)

    def test_a_program_without_steps_gets_the_system_and_engine_sections(self):
        engine = lambda r, t: {"collectives": 4, "bytes_reduced": 1000 * (r + 1)}  # noqa: E731
        folder = self.run_folder(ranks=2, steps=0, sample_engine=engine)
        code, out, err = run_cli(folder, "-o", self.tmp / "r.html")
        self.assertEqual(code, 0, err)
        out = " ".join(out.split())  # unwrapped
        self.assertIn("no steps, run run-1", out)
        self.assertIn("note: no steps seen: no rank recorded a training step", out)
        self.assertIn("summary: Overall system usage", out)
        self.assertIn("not evaluated: Step outliers: no steps seen", out)
        html = (self.tmp / "r.html").read_text()
        self.assertIn("no steps seen", html)
        self.assertIn('id="chart-utilization"', html)
        # 3 samples, 0.5 s apart, of 1000 bytes each on rank 0 and 2000 on rank 1.
        self.assertIn("<h2 id=\"engine\">Engine counters</h2>", html)
        self.assertIn("<th>rank 1 total</th><th>per s</th>", html)
        self.assertIn("<td class=l>bytes_reduced</td><td>3e+03</td><td>2e+03</td>"
                      "<td>6e+03</td><td>4e+03</td>", html)

    def test_without_sample_counters_the_engine_section_says_why(self):
        folder = self.run_folder(ranks=1, steps=0)
        code, out, err = run_cli(folder, "-o", self.tmp / "r.html")
        self.assertEqual(code, 0, err)
        self.assertIn("the profile has no steps and its samples carry no engine counters",
                      (self.tmp / "r.html").read_text())


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

    def test_an_engine_that_polls_across_hosts_in_the_printout_the_page_and_its_tables(self):
        def engine(rank, step, phases):
            return {**synthetic.healthy_engine(rank, step, phases), "collective_ns": 30e6,
                    "engine_cpu_ns": 29e6}
        folder = self.run_folder(ranks=2, host=lambda r: f"node{r}", engine=engine,
                                 engine_counters=synthetic.HEALTHY_ENGINE_COUNTERS
                                 + ("collective_ns", "engine_cpu_ns"))
        out = self.tmp / "a.html"
        code, stdout, stderr = run_cli(folder, "-o", out)
        self.assertEqual(code, 0, stderr)
        self.assertIn("FINDING Engine busy-waiting: the engine thread of ranks 0, 1 polls", stdout)
        html = out.read_text()
        self.assertIn('id="finding-engine_busy_wait"', html)
        self.assertIn("<td class=l>engine_cpu_ns</td>", html)  # the engine table, with its meaning
        self.assertIn("CPU time the engine thread used", html)
        code, stdout, _ = run_cli(folder, "-o", self.tmp / "b.html", "--threshold",
                                  "engine_wait_cores=1.5")
        self.assertEqual(code, 0)
        self.assertIn("quiet: Engine busy-waiting", stdout)
        self.assertIn("(default 0.5)", (self.tmp / "b.html").read_text())

    def test_list_thresholds(self):
        code, out, _ = run_cli("--list-thresholds")
        self.assertEqual(code, 0)
        self.assertIn("straggler_slowdown", out)
        self.assertIn("engine_wait_cores", out)
        self.assertIn("engine_wait_share", out)


if __name__ == "__main__":
    unittest.main()
