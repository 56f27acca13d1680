"""Inline SVG primitives for the report's charts: no scripts, no external resources; tooltips
are SVG <title> elements, which browsers show on hover."""

from __future__ import annotations

import html
import math

PHASE_COLORS = {
    "data": "#e0a21b",
    "forward": "#4c78a8",
    "backward": "#72b7b2",
    "communication_wait": "#e45756",
    "optimizer": "#54a24b",
    "other": "#bab0ac",
}
EXTRA_COLORS = ("#b279a2", "#9d755d", "#ff9da6", "#f58518", "#8cd17d", "#d4a6c8", "#86bcb6",
                "#79706e")
SERIES_COLORS = ("#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#b279a2", "#9d755d",
                 "#eeca3b", "#ff9da6", "#79706e")
FONT = "font-family:system-ui,-apple-system,'Segoe UI',Roboto,sans-serif"


def esc(s) -> str:
    return html.escape(str(s), quote=True)


def phase_color(name: str, user_index: int = 0) -> str:
    return PHASE_COLORS.get(name) or EXTRA_COLORS[user_index % len(EXTRA_COLORS)]


def series_color(i: int) -> str:
    return SERIES_COLORS[i % len(SERIES_COLORS)]


def ratio_color(ratio: float) -> str:
    """A diverging scale for 'this rank / the step's median': blue faster, white even, red
    slower; saturated at 0.5x and 2x."""
    if ratio is None or math.isnan(ratio):
        return "#eeeeee"
    x = max(-1.0, min(1.0, math.log2(max(ratio, 1e-9))))
    if x >= 0:
        lo, hi = (247, 247, 247), (178, 24, 43)
    else:
        lo, hi, x = (247, 247, 247), (33, 102, 172), -x
    r, g, b = (round(l + (h - l) * x) for l, h in zip(lo, hi))
    return f"#{r:02x}{g:02x}{b:02x}"


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    if not math.isfinite(lo) or not math.isfinite(hi):
        return [0.0]
    if hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / max(count, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.floor(lo / step) * step
    ticks, v = [], start
    while v <= hi + step * 1e-9:
        if v >= lo - step * 1e-9:
            ticks.append(round(v, 12))
        v += step
    return ticks


def fmt_num(v: float) -> str:
    if v == 0:
        return "0"
    a = abs(v)
    if a >= 1e9:
        return f"{v / 1e9:g}G"
    if a >= 1e6:
        return f"{v / 1e6:g}M"
    if a >= 1e4:
        return f"{v / 1e3:g}k"
    return f"{v:.3g}"


class Svg:
    def __init__(self, width: int, height: int, chart_id: str, label: str):
        self.width, self.height, self.id, self.label = width, height, chart_id, label
        self.parts: list[str] = []

    def rect(self, x, y, w, h, fill, title: str | None = None, stroke: str | None = None):
        s = f'<rect x="{x:.1f}" y="{y:.1f}" width="{max(w, 0):.2f}" height="{max(h, 0):.2f}" ' \
            f'fill="{fill}"' + (f' stroke="{stroke}" stroke-width="0.5"' if stroke else "")
        self.parts.append(s + (f"><title>{esc(title)}</title></rect>" if title else "/>"))

    def line(self, x1, y1, x2, y2, stroke="#999", width=1.0, dash: str | None = None):
        self.parts.append(f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" '
                          f'stroke="{stroke}" stroke-width="{width}"'
                          + (f' stroke-dasharray="{dash}"' if dash else "") + "/>")

    def polyline(self, points, stroke, width=1.5, dash: str | None = None,
                 title: str | None = None):
        if not points:
            return
        pts = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
        s = (f'<polyline points="{pts}" fill="none" stroke="{stroke}" stroke-width="{width}" '
             f'stroke-linejoin="round"' + (f' stroke-dasharray="{dash}"' if dash else ""))
        self.parts.append(s + (f"><title>{esc(title)}</title></polyline>" if title else "/>"))

    def circle(self, cx, cy, r, fill, title: str | None = None):
        s = f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="{r:g}" fill="{fill}"'
        self.parts.append(s + (f"><title>{esc(title)}</title></circle>" if title else "/>"))

    def polygon(self, points, fill, title: str | None = None):
        pts = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
        s = f'<polygon points="{pts}" fill="{fill}"'
        self.parts.append(s + (f"><title>{esc(title)}</title></polygon>" if title else "/>"))

    def text(self, x, y, s, size=11, anchor="start", fill="#333", weight: str | None = None,
             rotate: float | None = None):
        extra = f' font-weight="{weight}"' if weight else ""
        if rotate is not None:
            extra += f' transform="rotate({rotate} {x:.1f} {y:.1f})"'
        self.parts.append(f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" '
                          f'text-anchor="{anchor}" fill="{fill}"{extra}>{esc(s)}</text>')

    def legend(self, x, y, items: list[tuple[str, str]], max_width: float):
        """Colored squares with labels, wrapping onto new rows; returns the height used."""
        cx, cy = x, y
        for label, color in items:
            w = 16 + 6.5 * len(label) + 14
            if cx + w > x + max_width and cx > x:
                cx, cy = x, cy + 18
            self.rect(cx, cy - 9, 10, 10, color)
            self.text(cx + 14, cy, label)
            cx += w
        return cy - y + 18

    def render(self) -> str:
        return (f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" id="{esc(self.id)}" '
                f'viewBox="0 0 {self.width} {self.height}" width="{self.width}" '
                f'height="{self.height}" role="img" aria-label="{esc(self.label)}" '
                f'style="{FONT}">' + "".join(self.parts) + "</svg>")


def axis_y(svg: Svg, x: float, top: float, bottom: float, lo: float, hi: float, label: str,
           right: float | None = None):
    """A left value axis from lo (at bottom) to hi (at top), with grid lines to `right`."""
    for v in nice_ticks(lo, hi, 4):
        y = bottom - (v - lo) / (hi - lo) * (bottom - top) if hi > lo else bottom
        if right is not None:
            svg.line(x, y, right, y, "#e6e6e6")
        svg.text(x - 4, y + 4, fmt_num(v), size=10, anchor="end", fill="#666")
    svg.text(x - 38, (top + bottom) / 2, label, size=10, anchor="middle", fill="#666", rotate=-90)
