"""tools/plot_accuracy.py: the accuracy plot drawn with dtrain-report's SVG primitives, its points
where the axes say, and clear errors for logs it cannot use."""

import subprocess
import sys
import tempfile
import unittest
import xml.etree.ElementTree as ET
from pathlib import Path

TOOL = Path(__file__).resolve().parents[2] / "tools" / "plot_accuracy.py"
NS = {"s": "http://www.w3.org/2000/svg"}
LOG_A = "training...\nepoch  1/3 loss 0.9 test acc  80.00% lr 0.1\nepoch  2/3 test acc  85.00%\n" \
        "epoch  3/3 test acc  90.00%\n"
LOG_B = "epoch  1/3 test acc  81.00%\nepoch  2/3 test acc  87.50%\n"


def run(*args):
    return subprocess.run([sys.executable, str(TOOL), *map(str, args)], capture_output=True,
                          text=True)


class PlotAccuracy(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self._tmp.cleanup)
        self.tmp = Path(self._tmp.name)
        (self.tmp / "a.log").write_text(LOG_A)
        (self.tmp / "b.log").write_text(LOG_B)

    def test_each_run_is_a_line_through_its_epochs(self):
        out = self.tmp / "acc.svg"
        done = run(out, f"one={self.tmp / 'a.log'}", f"two={self.tmp / 'b.log'}")
        self.assertEqual(done.returncode, 0, done.stderr)
        root = ET.fromstring(out.read_text())
        self.assertEqual(root.get("id"), "chart-accuracy")  # made by dtrain_report.svg.Svg
        lines = root.findall("s:polyline", NS)
        self.assertEqual([x.find("s:title", NS).text for x in lines], ["one", "two"])
        # Accuracy 80-90 widens to 80-92; epochs 1-3 span the 400-pixel plot from x = 60, and
        # accuracy the 330 pixels above y = 350.
        points = [tuple(map(float, p.split(","))) for p in lines[0].get("points").split()]
        expected = [(60 + (e - 1) / 2 * 400, 350 - (a - 80) / 12 * 330)
                    for e, a in ((1, 80.0), (2, 85.0), (3, 90.0))]
        for (x, y), (ex, ey) in zip(points, expected):
            self.assertAlmostEqual(x, ex, places=1)
            self.assertAlmostEqual(y, ey, places=1)
        self.assertEqual(len(root.findall("s:circle", NS)), 5)
        labels = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text")]
        self.assertIn("test accuracy (%)", labels)
        self.assertEqual(labels[:3], ["80", "85", "90"])  # the report's tick choice

    def test_unusable_logs_are_named(self):
        (self.tmp / "empty.log").write_text("no epochs here\n")
        done = run(self.tmp / "x.svg", f"e={self.tmp / 'empty.log'}")
        self.assertNotEqual(done.returncode, 0)
        self.assertIn("empty.log has no 'epoch k/n ... test acc x%' lines", done.stderr)
        done = run(self.tmp / "x.svg", f"m={self.tmp / 'missing.log'}")
        self.assertIn("cannot read", done.stderr)
        self.assertIn("missing.log", done.stderr)
        self.assertNotIn("Traceback", done.stderr)
        self.assertIn("plot_accuracy.py out.svg \"label one=run1.log\"",
                      run(self.tmp / "x.svg", "no-label").stderr)


if __name__ == "__main__":
    unittest.main()
