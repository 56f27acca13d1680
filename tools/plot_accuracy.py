#!/usr/bin/env python3
"""Plots test accuracy per epoch from resnet_train logs as a standalone SVG, drawn with
dtrain-report's SVG primitives (tools/dtrain_report/svg.py): Python 3 and nothing else.

    tools/plot_accuracy.py out.svg "label one=run1.log" "label two=run2.log" ...

Each log is the trainer's output; the lines "epoch  k/n ... test acc  xx.xx% ..." are plotted.
"""
import math
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dtrain_report.svg import Svg, axis_y, series_color  # noqa: E402

EPOCH_LINE = re.compile(r"^epoch\s+(\d+)/\d+\s.*test acc\s+([\d.]+)%")
WIDTH, HEIGHT = 700, 400
LEFT, RIGHT, TOP, BOTTOM = 60, 240, 20, 50  # room on the right for the legend


def read_series(path: str) -> list[tuple[int, float]]:
    try:
        with open(path, encoding="utf-8", errors="replace") as log:
            points = [(int(m.group(1)), float(m.group(2)))
                      for m in map(EPOCH_LINE.match, log) if m]
    except OSError as e:
        sys.exit(f"plot_accuracy.py: cannot read {path}: {e.strerror or e}")
    if not points:
        sys.exit(f"plot_accuracy.py: {path} has no 'epoch k/n ... test acc x%' lines")
    return points


def accuracy_range(values: list[float], step: float = 2.0) -> tuple[float, float]:
    """The values' range widened to whole steps, with room above the highest."""
    return step * math.floor(min(values) / step), step * (math.floor(max(values) / step) + 1)


def plot(series: list[tuple[str, list[tuple[int, float]]]]) -> str:
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    epochs = [e for _, pts in series for e, _ in pts]
    lo_e, hi_e = min(epochs), max(epochs)
    lo, hi = accuracy_range([a for _, pts in series for _, a in pts])
    bottom = TOP + plot_h

    def x_of(epoch):
        return LEFT + (epoch - lo_e) / max(1, hi_e - lo_e) * plot_w

    def y_of(acc):
        return bottom - (acc - lo) / (hi - lo) * plot_h

    svg = Svg(WIDTH, HEIGHT, "chart-accuracy", "test accuracy per epoch")
    svg.rect(0, 0, WIDTH, HEIGHT, "white")
    axis_y(svg, LEFT, TOP, bottom, lo, hi, "test accuracy (%)", right=LEFT + plot_w)
    svg.line(LEFT, TOP, LEFT, bottom, "black")
    svg.line(LEFT, bottom, LEFT + plot_w, bottom, "black")
    for e in range(lo_e, hi_e + 1):
        svg.text(x_of(e), bottom + 18, str(e), anchor="middle")
    svg.text(LEFT + plot_w / 2, HEIGHT - 12, "epoch", anchor="middle")
    for i, (label, pts) in enumerate(series):
        color = series_color(i)
        svg.polyline([(x_of(e), y_of(a)) for e, a in pts], color, width=2, title=label)
        for e, a in pts:
            svg.circle(x_of(e), y_of(a), 3, color, title=f"{label}, epoch {e}: {a:.2f}%")
        y = TOP + 10 + 20 * i
        svg.line(LEFT + plot_w + 12, y, LEFT + plot_w + 32, y, color, 2)
        svg.text(LEFT + plot_w + 38, y + 4, label)
    return svg.render() + "\n"


def main(argv: list[str]) -> int:
    if len(argv) < 3 or any("=" not in arg for arg in argv[2:]):
        sys.exit(__doc__)
    series = []
    for arg in argv[2:]:
        label, path = arg.split("=", 1)
        series.append((label, read_series(path)))
    try:
        Path(argv[1]).write_text(plot(series), encoding="utf-8")
    except OSError as e:
        sys.exit(f"plot_accuracy.py: cannot write {argv[1]}: {e.strerror or e}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
