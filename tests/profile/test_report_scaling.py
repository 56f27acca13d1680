"""dtrain-report's work grows linearly with the steps of a profile: counted, not timed, so the test
says the same on a busy machine. (benchmarks/report_speed.py times a 100k-step profile.)

The count is of Python function calls (sys.setprofile) and of passes over a step's phases (each
step's phases_ms replaced by a dict that counts its iterations) while the report is analyzed,
judged and rendered. Measured at n, 2n and 4n steps, the growth from 2n to 4n is twice the growth
from n to 2n for linear work and four times for quadratic work."""

import random
import sys
import tempfile
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import synthetic  # noqa: E402
from dtrain_report import thresholds  # noqa: E402
from dtrain_report.analysis import analyze  # noqa: E402
from dtrain_report.html_report import render  # noqa: E402
from dtrain_report.profile_reader import load_run  # noqa: E402
from dtrain_report.rules import _median_without, evaluate  # noqa: E402
from dtrain_report.analysis import median  # noqa: E402


class CountingPhases(dict):
    passes = 0

    def __iter__(self):
        CountingPhases.passes += 1
        return super().__iter__()

    def keys(self):
        CountingPhases.passes += 1
        return super().keys()

    def items(self):
        CountingPhases.passes += 1
        return super().items()


def phases(rank: int, step: int) -> dict[str, float]:
    """Every rule at work: rank 2 a straggler, data spikes that make step outliers, waits."""
    p = dict(synthetic.HEALTHY_PHASES)
    p["forward"] = 30.0 + 20.0 * (rank == 2)
    p["data"] = 2.0 + 300.0 * (step % 50 == 0)
    p["communication_wait"] = 6.0 + 100.0 * (step % 40 == 0) * (rank != 2)
    return p


def work(folder: Path) -> tuple[int, int]:
    """(function calls, passes over a step's phases) to analyze, judge and render the run."""
    run = load_run([folder])
    for profile in run.ranks.values():
        for st in profile.steps:
            st.phases_ms = CountingPhases(st.phases_ms)
    limits = thresholds.load(None, [])
    calls = 0

    def count(frame, event, arg):
        nonlocal calls
        if event in ("call", "c_call"):
            calls += 1
    CountingPhases.passes = 0
    sys.setprofile(count)
    try:
        a = analyze(run, limits)
        render(a, evaluate(a))
    finally:
        sys.setprofile(None)
    return calls, CountingPhases.passes


class Scaling(unittest.TestCase):
    def test_work_grows_linearly_with_the_steps(self):
        with tempfile.TemporaryDirectory() as tmp:
            # From 400 steps per rank on: past the charts' 300 columns, so each chart bins its
            # steps at every size measured and no size changes how they are drawn.
            sizes = (400, 800, 1600)
            counts = [work(synthetic.write_run(Path(tmp) / str(n), ranks=3, steps=n,
                                               phases=phases, gpu=None)) for n in sizes]
        for what, k in (("function calls", 0), ("passes over a step's phases", 1)):
            first = counts[1][k] - counts[0][k]
            second = counts[2][k] - counts[1][k]
            with self.subTest(what):
                self.assertGreater(first, 0)
                # Linear: 2. Quadratic: 4. n log n (sorting) sits just above 2.
                self.assertLess(second / first, 2.5,
                                f"{what} at {sizes} steps: {[c[k] for c in counts]}")

    def test_the_median_of_the_other_ranks(self):
        rng = random.Random(5)
        for n in (2, 3, 4, 7, 8):
            for _ in range(200):
                values = [rng.choice((1.0, 2.0, 2.5, rng.uniform(0, 10))) for _ in range(n)]
                ordered = sorted(values)
                for i, v in enumerate(values):
                    self.assertEqual(_median_without(ordered, v),
                                     median(values[:i] + values[i + 1:]), (values, i))


if __name__ == "__main__":
    unittest.main()
