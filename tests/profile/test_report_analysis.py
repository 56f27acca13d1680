"""dtrain-report's figures on synthetic profiles, checked against closed forms: the overlap and
idle breakdown of each rank's steps, and the straggler scores per interval."""

import sys
import tempfile
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import synthetic  # noqa: E402
from dtrain_report import thresholds  # noqa: E402
from dtrain_report.analysis import analyze, notices  # noqa: E402
from dtrain_report.charts import comm_compute_steps  # noqa: E402
from dtrain_report.profile_reader import load_run  # noqa: E402
from dtrain_report.rules import FIRED, evaluate  # noqa: E402

# The healthy step without jitter: 2 + 30 + 55 + 6 + 4 ms of phases and 1 ms outside them.
STEP_MS = 98.0


class AnalysisTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self._tmp.cleanup)
        self.count = 0

    def analyze(self, limits=None, **run):
        self.count += 1
        run.setdefault("jitter", 0.0)
        folder = synthetic.write_run(Path(self._tmp.name) / f"run{self.count}", **run)
        return analyze(load_run([folder]), limits or thresholds.defaults())


def engine_with(**ns):
    return lambda rank, step, phases: {"collectives": 2, "bytes_reduced": 4.6e7, **ns}


class Breakdown(AnalysisTest):
    def test_shares_of_compute_exposed_communication_and_idle(self):
        b = self.analyze(ranks=2).ranks[1].breakdown
        self.assertEqual(b.steps, 38)
        self.assertAlmostEqual(b.step_ms, 38 * STEP_MS)
        self.assertAlmostEqual(b.share(b.compute_ms), 89 / STEP_MS)
        self.assertAlmostEqual(b.share(b.exposed_communication_ms), 6 / STEP_MS)
        self.assertAlmostEqual(b.share(b.idle_ms), 3 / STEP_MS)  # data 2 + unmarked 1
        self.assertTrue(b.compute_marked)
        self.assertEqual(b.overlap_source, "")  # no communication time recorded: not known
        self.assertNotEqual(b.overlap, b.overlap)

    def test_overlap_from_the_in_flight_time(self):
        b = self.analyze(ranks=2, engine=engine_with(in_flight_ns=20e6, collective_ns=5e6)) \
            .ranks[0].breakdown
        self.assertEqual(b.overlap_source, "in_flight_ns")
        self.assertAlmostEqual(b.in_flight_ms, 38 * 20.0)
        self.assertAlmostEqual(b.overlap, (20 - 6) / 20)

    def test_steps_without_collectives_leave_the_counter_out(self):
        def engine(rank, step, phases):  # every other step ran no collective: no counters
            return {"in_flight_ns": 20e6, "collective_ns": 5e6} if step % 2 else {}
        b = self.analyze(ranks=2, engine=engine).ranks[0].breakdown
        self.assertEqual(b.overlap_source, "in_flight_ns")
        # 19 steps with 20 ms in flight, 19 whose 6 ms wait is all there is
        self.assertAlmostEqual(b.overlap, 19 * 14 / (19 * 20 + 19 * 6))

    def test_without_it_the_execution_time_gives_a_lower_bound(self):
        b = self.analyze(ranks=2, engine=engine_with(collective_ns=10e6)).ranks[0].breakdown
        self.assertEqual(b.overlap_source, "collective_ns")
        self.assertAlmostEqual(b.overlap, (10 - 6) / 10)

    def test_a_wait_longer_than_the_communication_time_hides_nothing(self):
        b = self.analyze(ranks=2, engine=engine_with(in_flight_ns=3e6)).ranks[0].breakdown
        self.assertAlmostEqual(b.overlap, 0.0)
        self.assertAlmostEqual(b.in_flight_ms, 38 * 6.0)

    def test_steps_that_mark_only_the_communication_wait(self):
        a = self.analyze(ranks=2, phases=lambda r, i: {"communication_wait": 6.0})
        b = a.ranks[0].breakdown
        self.assertFalse(b.compute_marked)
        self.assertAlmostEqual(b.share(b.exposed_communication_ms), 6 / 7)
        self.assertAlmostEqual(b.share(b.unmarked_ms), 1 / 7)
        self.assertTrue(any("mark only their communication wait" in n for n in notices(a)))
        a = self.analyze(ranks=2, phases=lambda r, i: {})
        self.assertTrue(any("mark no phases" in n for n in notices(a)))
        self.assertEqual(notices(self.analyze(ranks=2)), [])  # a fully marked, clean run

    def test_the_chart_over_the_run_shows_own_work_where_no_compute_is_marked(self):
        chart = comm_compute_steps(
            self.analyze(ranks=2, phases=lambda r, i: {"communication_wait": 6.0}))
        self.assertIn("own work (not broken into phases): median 1 ms per step", chart)
        self.assertNotIn(">compute<", chart)
        self.assertIn("compute: median 89 ms per step", comm_compute_steps(self.analyze(ranks=2)))


def slowed(rank, extra_ms, steps=None):
    """Rank `rank` computes `extra_ms` longer (in `steps`, or every step); the others wait."""
    def phases(r, i):
        p = dict(synthetic.HEALTHY_PHASES)
        if steps is None or i in steps:
            if r == rank:
                p["forward"] += extra_ms
            else:
                p["communication_wait"] += extra_ms
        return p
    return phases


class StragglerScores(AnalysisTest):
    def test_a_rank_slowed_on_purpose_scores_low_and_is_named(self):
        a = self.analyze(steps=300, phases=slowed(2, 40.0))
        # 298 steps after warm-up: five intervals of 50 and a sixth of 48 (not merged: >= 25).
        self.assertEqual([len(iv.steps) for iv in a.scores], [50] * 5 + [48])
        own, slow = STEP_MS - 6, STEP_MS - 6 + 40  # own work: the step minus the wait
        for iv in a.scores:
            self.assertAlmostEqual(iv.scores[2], own / slow)
            self.assertEqual([iv.scores[r] for r in (0, 1, 3)], [1.0, 1.0, 1.0])
            self.assertEqual(iv.low, [2])
        findings = {f.rule: f for f in evaluate(a)}
        self.assertEqual(findings["straggler_rank"].status, FIRED)
        self.assertEqual(findings["straggler_rank"].ranks, [2])
        self.assertIn(f"rank 2's straggler score (the fastest rank's median own work per step "
                      f"over its own) is under 0.75 in 6 of 6 intervals of steps, lowest "
                      f"{own / slow:.2f}", findings["straggler_rank"].evidence[-1])

    def test_only_the_intervals_it_was_slow_in(self):
        a = self.analyze(steps=300, phases=slowed(1, 40.0, steps=range(102, 152)))
        self.assertEqual([iv.low for iv in a.scores], [[], [], [1], [], [], []])
        self.assertEqual(a.scores[2].steps, list(range(102, 152)))

    def test_a_short_tail_joins_the_last_interval(self):
        a = self.analyze(steps=112)  # 110 after warm-up: 50, then 60 (a tail of 10 joins it)
        self.assertEqual([len(iv.steps) for iv in a.scores], [50, 60])

    def test_a_small_difference_names_nobody(self):
        a = self.analyze(steps=100, phases=slowed(0, 20.0))  # 92 / 112 = 0.82
        self.assertTrue(all(iv.low == [] for iv in a.scores))
        limits = thresholds.load(None, ["straggler_score_low=0.85"])
        a = self.analyze(limits, steps=100, phases=slowed(0, 20.0))
        self.assertTrue(all(iv.low == [0] for iv in a.scores))

    def test_none_without_a_communication_wait_or_with_one_rank(self):
        no_wait = {k: v for k, v in synthetic.HEALTHY_PHASES.items() if k != "communication_wait"}
        self.assertEqual(self.analyze(phases=lambda r, i: dict(no_wait)).scores, [])
        self.assertEqual(self.analyze(ranks=1).scores, [])


if __name__ == "__main__":
    unittest.main()
