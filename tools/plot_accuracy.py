#!/usr/bin/env python3
"""Plots test accuracy per epoch from resnet_train logs as a standalone SVG (no dependencies).

    tools/plot_accuracy.py out.svg "label one=run1.log" "label two=run2.log" ...

Each log is the trainer's output; the lines "epoch  k/n ... test acc  xx.xx% ..." are plotted.
"""
import re
import sys
from xml.sax.saxutils import escape

EPOCH_LINE = re.compile(r"^epoch\s+(\d+)/\d+\s.*test acc\s+([\d.]+)%")
COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]


def read_series(path):
    points = []
    with open(path, encoding="utf-8") as log:
        for line in log:
            match = EPOCH_LINE.match(line)
            if match:
                points.append((int(match.group(1)), float(match.group(2))))
    if not points:
        sys.exit(f"plot_accuracy.py: {path} has no 'epoch k/n ... test acc x%' lines")
    return points


def nice_range(values, step):
    low = min(values)
    high = max(values)
    low = step * int(low // step)
    high = step * (int(high // step) + 1)
    return low, high


def main(argv):
    if len(argv) < 3 or any("=" not in arg for arg in argv[2:]):
        sys.exit(__doc__)
    out = argv[1]
    series = []
    for arg in argv[2:]:
        label, path = arg.split("=", 1)
        series.append((label, read_series(path)))

    width, height = 640, 400
    left, right, top, bottom = 60, 180, 20, 50
    plot_w, plot_h = width - left - right, height - top - bottom
    epochs = [e for _, pts in series for e, _ in pts]
    accs = [a for _, pts in series for _, a in pts]
    x_min, x_max = min(epochs), max(epochs)
    y_min, y_max = nice_range(accs, 2.0)

    def x_of(epoch):
        return left + (epoch - x_min) / max(1, x_max - x_min) * plot_w

    def y_of(acc):
        return top + (y_max - acc) / (y_max - y_min) * plot_h

    svg = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'font-family="sans-serif" font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
    ]
    y = y_min
    while y <= y_max + 1e-9:
        svg.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{y_of(y):.1f}" y2="{y_of(y):.1f}" '
                   f'stroke="#ddd"/>')
        svg.append(f'<text x="{left - 6}" y="{y_of(y) + 4:.1f}" text-anchor="end">{y:g}</text>')
        y += 2.0
    for e in range(x_min, x_max + 1):
        svg.append(f'<text x="{x_of(e):.1f}" y="{top + plot_h + 18}" text-anchor="middle">{e}</text>')
    svg.append(f'<line x1="{left}" x2="{left}" y1="{top}" y2="{top + plot_h}" stroke="black"/>')
    svg.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{top + plot_h}" y2="{top + plot_h}" '
               f'stroke="black"/>')
    svg.append(f'<text x="{left + plot_w / 2}" y="{height - 12}" text-anchor="middle">epoch</text>')
    svg.append(f'<text transform="translate(16 {top + plot_h / 2}) rotate(-90)" '
               f'text-anchor="middle">test accuracy (%)</text>')
    for i, (label, pts) in enumerate(series):
        colour = COLOURS[i % len(COLOURS)]
        path = " ".join(f"{x_of(e):.1f},{y_of(a):.1f}" for e, a in pts)
        svg.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"/>')
        for e, a in pts:
            svg.append(f'<circle cx="{x_of(e):.1f}" cy="{y_of(a):.1f}" r="3" fill="{colour}"/>')
        ly = top + 10 + 20 * i
        svg.append(f'<line x1="{left + plot_w + 12}" x2="{left + plot_w + 32}" y1="{ly}" y2="{ly}" '
                   f'stroke="{colour}" stroke-width="2"/>')
        svg.append(f'<text x="{left + plot_w + 38}" y="{ly + 4}">{escape(label)}</text>')
    svg.append("</svg>")
    with open(out, "w", encoding="utf-8") as f:
        f.write("\n".join(svg) + "\n")


if __name__ == "__main__":
    main(sys.argv)
