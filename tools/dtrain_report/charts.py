"""The report's charts, each an inline <svg class="chart" id="chart-..."> string:
  chart-step-breakdown      mean time per step by phase, one bar per rank
  chart-step-timeline       the same phases over the run's steps (mean over ranks)
  chart-comm-compute        compute, communication wait, data and the rest, per rank
  chart-comm-compute-steps  compute and communication wait over the steps
  chart-straggler-heatmap   rank x step: each rank's own work relative to the step's median
  chart-straggler-scores    rank x interval: each rank's straggler score (1 = the fastest)
  chart-utilization         CPU, GPU, memory and I/O over time
"""

from __future__ import annotations

import math

from .analysis import COMPUTE_PHASES, Analysis, mean, median
from .svg import Svg, axis_y, fmt_num, nice_ticks, phase_color, ratio_color, series_color

WIDTH = 920


def _phase_colors(a: Analysis) -> dict[str, str]:
    colors, user = {}, 0
    for name in a.phase_names:
        colors[name] = phase_color(name, user)
        if name not in ("data", "forward", "backward", "communication_wait", "optimizer", "other"):
            user += 1
    return colors


def _bins(items: list, max_bins: int) -> list[list]:
    if len(items) <= max_bins:
        return [[x] for x in items]
    size = math.ceil(len(items) / max_bins)
    return [items[i:i + size] for i in range(0, len(items), size)]


def _empty(chart_id: str, label: str, message: str) -> str:
    svg = Svg(WIDTH, 60, chart_id, label)
    svg.text(WIDTH / 2, 34, message, size=12, anchor="middle", fill="#777")
    return svg.render()


def _rank_label(a: Analysis, r: int) -> str:
    return f"rank {r}" + (f" ({a.ranks[r].host})" if len(a.run.hosts) > 1 else "")


def step_breakdown(a: Analysis) -> str:
    label = "Mean time per step by phase, per rank"
    ranks = [r for r in sorted(a.ranks) if a.ranks[r].steps]
    if not ranks:
        return _empty("chart-step-breakdown", label, "no steps recorded")
    colors = _phase_colors(a)
    left, right, row = 150, 90, 24
    plot_w = WIDTH - left - right
    svg = Svg(WIDTH, 0, "chart-step-breakdown", label)
    legend_h = svg.legend(left, 16, [(n, colors[n]) for n in a.phase_names], plot_w + right)
    top = 16 + legend_h + 4
    totals = {r: sum(a.ranks[r].mean_phase_ms.get(n, 0.0) for n in a.phase_names) for r in ranks}
    hi = max(totals.values()) or 1.0
    ticks = nice_ticks(0, hi, 5)
    hi = max(hi, ticks[-1])
    bottom = top + row * len(ranks)
    for v in ticks:
        x = left + v / hi * plot_w
        svg.line(x, top - 2, x, bottom, "#e6e6e6")
        svg.text(x, bottom + 14, fmt_num(v), size=10, anchor="middle", fill="#666")
    svg.text(left + plot_w / 2, bottom + 30, "milliseconds per step (mean)", size=10,
             anchor="middle", fill="#666")
    for i, r in enumerate(ranks):
        y = top + i * row
        s = a.ranks[r]
        svg.text(left - 8, y + row / 2 + 4, _rank_label(a, r), anchor="end")
        x = left
        for n in a.phase_names:
            v = s.mean_phase_ms.get(n, 0.0)
            w = v / hi * plot_w
            svg.rect(x, y + 3, w, row - 6, colors[n],
                     title=f"rank {r}, {n}: {v:.3g} ms per step "
                           f"({100 * v / totals[r] if totals[r] else 0:.0f}% of the step)")
            x += w
        svg.text(x + 6, y + row / 2 + 4, f"{totals[r]:.3g} ms", size=10, fill="#444")
    svg.height = int(bottom + 40)
    return svg.render()


def step_timeline(a: Analysis) -> str:
    label = "Time per step by phase over the run (mean over ranks)"
    indices = sorted({st.index for s in a.ranks.values() for st in s.profile.steps})
    if len(indices) < 2:
        return _empty("chart-step-timeline", label, "fewer than two steps recorded")
    colors = _phase_colors(a)
    left, right, top, height = 70, 20, 16, 220
    plot_w = WIDTH - left - right
    svg = Svg(WIDTH, 0, "chart-step-timeline", label)
    legend_h = svg.legend(left, top, [(n, colors[n]) for n in a.phase_names], plot_w)
    top += legend_h + 4
    bottom = top + height
    by_index = {}
    for s in a.ranks.values():
        for st in s.profile.steps:
            by_index.setdefault(st.index, []).append(st)
    groups = _bins(indices, 300)
    stacks = []  # per bin: cumulative tops per phase
    for g in groups:
        steps = [st for i in g for st in by_index[i]]
        values = [mean(st.other_ms if n == "other" else st.phase(n) for st in steps)
                  for n in a.phase_names]
        stacks.append(values)
    hi = max(sum(v) for v in stacks) or 1.0
    ticks = nice_ticks(0, hi, 4)
    hi = max(hi, ticks[-1])
    axis_y(svg, left, top, bottom, 0, hi, "ms per step", right=left + plot_w)
    lo_i, hi_i = indices[0], indices[-1]

    def x_of(k: int) -> float:
        center = mean(groups[k])
        return left + (center - lo_i) / max(hi_i - lo_i, 1) * plot_w

    def y_of(v: float) -> float:
        return bottom - v / hi * height

    base = [0.0] * len(groups)
    for p, n in enumerate(a.phase_names):
        tops = [base[k] + stacks[k][p] for k in range(len(groups))]
        pts = [(x_of(k), y_of(tops[k])) for k in range(len(groups))]
        pts += [(x_of(k), y_of(base[k])) for k in reversed(range(len(groups)))]
        svg.polygon(pts, colors[n], title=f"{n}: mean {mean(v[p] for v in stacks):.3g} ms per step")
        base = tops
    for v in nice_ticks(lo_i, hi_i, 8):
        x = left + (v - lo_i) / max(hi_i - lo_i, 1) * plot_w
        svg.text(x, bottom + 14, f"{v:g}", size=10, anchor="middle", fill="#666")
    svg.text(left + plot_w / 2, bottom + 30, "step", size=10, anchor="middle", fill="#666")
    svg.height = int(bottom + 40)
    return svg.render()


COMPUTE_COLOR, EXPOSED_COLOR, USER_COLOR, DATA_COLOR, UNMARKED_COLOR = \
    "#4c78a8", "#e45756", "#b279a2", "#e0a21b", "#bab0ac"


def breakdown_categories(a: Analysis) -> list[str]:
    """The categories of the temporal breakdown (Note [Overlap]) in this run's words."""
    if a.compute_marked:
        return ["compute", "exposed communication", "user phases", "idle: data", "idle: unmarked"]
    return ["own work (not broken into phases)", "exposed communication", "user phases",
            "data"]


def breakdown_values(a: Analysis, r: int) -> list[float]:
    b = a.ranks[r].breakdown
    if a.compute_marked:
        return [b.compute_ms, b.exposed_communication_ms, b.user_phases_ms, b.data_ms,
                b.unmarked_ms]
    return [b.unmarked_ms + b.compute_ms, b.exposed_communication_ms, b.user_phases_ms,
            b.data_ms]


def _category_colors(a: Analysis) -> list[str]:
    if a.compute_marked:
        return [COMPUTE_COLOR, EXPOSED_COLOR, USER_COLOR, DATA_COLOR, UNMARKED_COLOR]
    return [UNMARKED_COLOR, EXPOSED_COLOR, USER_COLOR, DATA_COLOR]


def comm_compute(a: Analysis) -> str:
    label = ("Where each rank's steps go: compute, exposed communication and idle time (share of "
             "the steps after warm-up), with the communication hidden behind the step")
    ranks = [r for r in sorted(a.ranks) if a.ranks[r].steps]
    if not ranks:
        return _empty("chart-comm-compute", label, "no steps recorded")
    left, right, row = 150, 250, 24
    plot_w = WIDTH - left - right
    svg = Svg(WIDTH, 0, "chart-comm-compute", label)
    names, colors = breakdown_categories(a), _category_colors(a)
    legend_h = svg.legend(left, 16, list(zip(names, colors)), plot_w + right)
    top = 16 + legend_h + 4
    bottom = top + row * len(ranks)
    for v in (0, 0.25, 0.5, 0.75, 1.0):
        x = left + v * plot_w
        svg.line(x, top - 2, x, bottom, "#e6e6e6")
        svg.text(x, bottom + 14, f"{v:.0%}", size=10, anchor="middle", fill="#666")
    for i, r in enumerate(ranks):
        y = top + i * row
        values = breakdown_values(a, r)
        b = a.ranks[r].breakdown
        total = sum(values) or 1.0
        svg.text(left - 8, y + row / 2 + 4, _rank_label(a, r), anchor="end")
        x = left
        for name, color, v in zip(names, colors, values):
            w = v / total * plot_w
            svg.rect(x, y + 3, w, row - 6, color,
                     title=f"rank {r}, {name}: {v / max(b.steps, 1):.3g} ms per step "
                           f"({v / total:.0%})")
            x += w
        note = (f"{values[0] / total:.0%} {'compute' if a.compute_marked else 'own work'}, "
                f"{values[1] / total:.0%} exposed")
        lower_bound = b.overlap_source == "collective_ns"
        if not math.isnan(b.overlap) and not (lower_bound and b.overlap < 0.005):
            note += f", {'>=' if lower_bound else ''}{b.overlap:.0%} hidden"
        svg.text(left + plot_w + 8, y + row / 2 + 4, note, size=10, fill="#444")
    svg.height = int(bottom + 26)
    return svg.render()


def comm_compute_steps(a: Analysis) -> str:
    # Without compute phases (a program profiled without marks) the rest of the step is the
    # rank's own work, not compute: a compute line would lie flat at zero.
    work_name, work_color = (("compute", COMPUTE_COLOR) if a.compute_marked else
                             ("own work (not broken into phases)", UNMARKED_COLOR))
    label = (f"{'Compute' if a.compute_marked else 'Own work'} and communication wait per step "
             f"over the run (mean over ranks)")
    by_index = {}
    for s in a.ranks.values():
        for st in s.profile.steps:
            by_index.setdefault(st.index, []).append(st)
    indices = sorted(by_index)
    if len(indices) < 2:
        return _empty("chart-comm-compute-steps", label, "fewer than two steps recorded")
    left, right, top, height = 70, 20, 16, 160
    plot_w = WIDTH - left - right
    svg = Svg(WIDTH, 0, "chart-comm-compute-steps", label)
    svg.legend(left, top, [(work_name, work_color), ("communication wait", EXPOSED_COLOR)],
               plot_w)
    top += 22
    bottom = top + height
    groups = _bins(indices, 300)

    def work(st) -> float:
        return sum(st.phase(p) for p in COMPUTE_PHASES) if a.compute_marked else st.busy_ms
    compute = [mean(work(st) for i in g for st in by_index[i]) for g in groups]
    comm = [mean(st.phase("communication_wait") for i in g for st in by_index[i]) for g in groups]
    hi = max(max(compute), max(comm)) or 1.0
    hi = max(hi, nice_ticks(0, hi, 4)[-1])
    axis_y(svg, left, top, bottom, 0, hi, "ms per step", right=left + plot_w)
    lo_i, hi_i = indices[0], indices[-1]
    xs = [left + (mean(g) - lo_i) / max(hi_i - lo_i, 1) * plot_w for g in groups]
    svg.polyline([(x, bottom - v / hi * height) for x, v in zip(xs, compute)], work_color,
                 title=f"{work_name}: median {median(compute):.3g} ms per step")
    svg.polyline([(x, bottom - v / hi * height) for x, v in zip(xs, comm)], EXPOSED_COLOR,
                 title=f"communication wait: median {median(comm):.3g} ms per step")
    for v in nice_ticks(lo_i, hi_i, 8):
        x = left + (v - lo_i) / max(hi_i - lo_i, 1) * plot_w
        svg.text(x, bottom + 14, f"{v:g}", size=10, anchor="middle", fill="#666")
    svg.text(left + plot_w / 2, bottom + 30, "step", size=10, anchor="middle", fill="#666")
    svg.height = int(bottom + 40)
    return svg.render()


def straggler_heatmap(a: Analysis) -> str:
    label = "Straggler heatmap: each rank's own work per step relative to the step's median"
    ranks = sorted(a.ranks)
    steps = a.common_steps
    if not steps:
        return _empty("chart-straggler-heatmap", label, "no step recorded by every rank")
    use_busy = "communication_wait" in a.has_phase
    left, right, top, row = 150, 20, 34, max(8, min(24, 360 // max(len(ranks), 1)))
    plot_w = WIDTH - left - right
    groups = _bins(steps, 300)
    cell_w = plot_w / len(groups)
    svg = Svg(WIDTH, 0, "chart-straggler-heatmap", label)
    # Legend: the color scale from 0.5x to 2x.
    for k in range(41):
        ratio = 2 ** ((k - 20) / 20)
        svg.rect(left + k * 8, 8, 8, 12, ratio_color(ratio))
    svg.text(left - 6, 18, "faster 0.5x", size=10, anchor="end", fill="#666")
    svg.text(left + 41 * 8 + 6, 18, "2x slower than the step's median", size=10, fill="#666")
    ratios = {r: [] for r in ranks}
    for g in groups:
        per_rank = {r: [] for r in ranks}
        for i in g:
            work = {r: (a.step_of(r, i).busy_ms if use_busy else a.step_of(r, i).duration_ms)
                    for r in ranks}
            mid = median(work.values())
            for r in ranks:
                per_rank[r].append(work[r] / mid if mid > 0 else math.nan)
        for r in ranks:
            ratios[r].append((mean(per_rank[r]), g))
    for j, r in enumerate(ranks):
        y = top + j * row
        if row >= 12 or j % max(1, len(ranks) // 24) == 0:
            svg.text(left - 8, y + row / 2 + 4, _rank_label(a, r), anchor="end",
                     size=11 if row >= 12 else 9)
        for k, (ratio, g) in enumerate(ratios[r]):
            span = f"step {g[0]}" if len(g) == 1 else f"steps {g[0]}-{g[-1]}"
            svg.rect(left + k * cell_w, y, cell_w + 0.3, row - 1, ratio_color(ratio),
                     title=f"rank {r}, {span}: {ratio:.2f}x the median")
    bottom = top + row * len(ranks)
    for v in nice_ticks(steps[0], steps[-1], 8):
        k = min(range(len(groups)), key=lambda k: abs(groups[k][0] - v))
        svg.text(left + (k + 0.5) * cell_w, bottom + 14, f"{v:g}", size=10, anchor="middle",
                 fill="#666")
    what = "step minus communication wait" if use_busy else \
        "whole step (no communication_wait phase recorded)"
    svg.text(left + plot_w / 2, bottom + 30, f"step (cells: {what})", size=10, anchor="middle",
             fill="#666")
    svg.height = int(bottom + 40)
    return svg.render()


def straggler_scores(a: Analysis) -> str:
    label = ("Straggler scores: per interval of steps, the fastest rank's median own work over "
             "each rank's")
    if not a.scores:
        why = ("one rank only" if len(a.ranks) < 2 else
               "no communication_wait phase: it separates a rank's own work from waiting"
               if "communication_wait" not in a.has_phase else "no step recorded by every rank")
        return _empty("chart-straggler-scores", label, f"no straggler scores: {why}")
    ranks = sorted(a.ranks)
    low = a.thresholds["straggler_score_low"]
    left, right, top, row = 150, 20, 34, max(8, min(24, 360 // max(len(ranks), 1)))
    plot_w = WIDTH - left - right
    groups = _bins(a.scores, 300)
    cell_w = plot_w / len(groups)
    svg = Svg(WIDTH, 0, "chart-straggler-scores", label)
    for k in range(21):
        score = 1 - k / 40
        svg.rect(left + k * 8, 8, 8, 12, ratio_color(1 / score))
    svg.text(left - 6, 18, "1 (fastest)", size=10, anchor="end", fill="#666")
    svg.text(left + 21 * 8 + 6, 18, f"0.5; outlined: under {low:g} (threshold "
             "straggler_score_low)", size=10, fill="#666")
    for j, r in enumerate(ranks):
        y = top + j * row
        if row >= 12 or j % max(1, len(ranks) // 24) == 0:
            svg.text(left - 8, y + row / 2 + 4, _rank_label(a, r), anchor="end",
                     size=11 if row >= 12 else 9)
        for k, g in enumerate(groups):
            score = min(iv.scores[r] for iv in g)
            steps = [i for iv in g for i in iv.steps]
            svg.rect(left + k * cell_w, y, cell_w + 0.3, row - 1, ratio_color(1 / max(score, 1e-9)),
                     title=f"rank {r}, steps {steps[0]}-{steps[-1]}: score {score:.2f}"
                           + (f" (under {low:g})" if score < low else ""),
                     stroke="#222" if score < low else None)
    bottom = top + row * len(ranks)
    for k, g in enumerate(groups):
        if len(groups) <= 12 or k % math.ceil(len(groups) / 12) == 0:
            svg.text(left + (k + 0.5) * cell_w, bottom + 14, f"{g[0].steps[0]}", size=10,
                     anchor="middle", fill="#666")
    svg.text(left + plot_w / 2, bottom + 30, "first step of each interval", size=10,
             anchor="middle", fill="#666")
    svg.height = int(bottom + 40)
    return svg.render()


def _series(samples: list[dict], key: str, scale: float = 1.0, sub: str | None = None):
    out = []
    for s in samples:
        v = s.get(sub, {}).get(key) if sub else s.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out.append((float(s["t"]), float(v) * scale))
    if len(out) > 600:
        out = [(mean(x for x, _ in g), mean(y for _, y in g)) for g in _bins(out, 600)]
    return out


def utilization(a: Analysis) -> str:
    label = "CPU, GPU, memory and I/O over time"
    ranks = sorted(a.ranks)
    if not any(a.ranks[r].profile.samples for r in ranks):
        return _empty("chart-utilization", label, "no system samples recorded")
    first_of_host = [rs[0] for rs in a.run.hosts.values()]
    panels = []  # (title, unit, [(name, color, points, dash)])
    cpu_lines = []
    for i, r in enumerate(ranks):
        cores = a.ranks[r].profile.cpu_count or 1
        cpu_lines.append((f"rank {r} process", series_color(i),
                          _series(a.ranks[r].profile.samples, "process_cpu_pct", 1 / cores), None))
    for h, r in enumerate(first_of_host):
        cpu_lines.append((f"host {a.ranks[r].host} (all programs)", "#333",
                          _series(a.ranks[r].profile.samples, "system_cpu_pct"), "4 3"))
    panels.append(("CPU", "% of the machine", cpu_lines, 100.0))
    if a.has_gpu:
        panels.append(("GPU", "% busy", [
            (f"rank {r}", series_color(i),
             _series(a.ranks[r].profile.samples, "utilization_pct", 1.0, "gpu"), None)
            for i, r in enumerate(ranks)], 100.0))
    mem_lines = [(f"rank {r} RSS", series_color(i),
                  _series(a.ranks[r].profile.samples, "rss_bytes", 1e-9), None)
                 for i, r in enumerate(ranks)]
    if a.has_gpu:
        mem_lines += [(f"rank {r} GPU", series_color(i),
                       _series(a.ranks[r].profile.samples, "memory_used_bytes", 1e-9, "gpu"),
                       "4 3") for i, r in enumerate(ranks)]
    panels.append(("Memory", "GB", mem_lines, None))
    io_lines = []
    for h, r in enumerate(first_of_host):
        smp, host = a.ranks[r].profile.samples, a.ranks[r].host
        for key, name, dash in (("net_rx_bytes_per_s", "net in", None),
                                ("net_tx_bytes_per_s", "net out", "4 3"),
                                ("disk_read_bytes_per_s", "disk read", "1 3"),
                                ("disk_write_bytes_per_s", "disk write", "6 2 1 2")):
            pts = _series(smp, key, 1e-6)
            if pts:
                io_lines.append((f"{host} {name}", series_color(len(ranks) + h), pts, dash))
    if io_lines:
        panels.append(("I/O", "MB/s", io_lines, None))

    t_hi = max((p[0] for _, _, lines, _ in panels for _, _, pts, _ in lines for p in pts),
               default=1.0) or 1.0
    left, right, height, gap = 70, 250, 110, 36
    plot_w = WIDTH - left - right
    svg = Svg(WIDTH, 0, "chart-utilization", label)
    y = 10
    for title, unit, lines, fixed_hi in panels:
        top, bottom = y + 16, y + 16 + height
        svg.text(left, y + 10, title, size=12, weight="600")
        hi = fixed_hi or max((v for _, _, pts, _ in lines for _, v in pts), default=1.0) or 1.0
        hi = max(hi, nice_ticks(0, hi, 3)[-1])
        axis_y(svg, left, top, bottom, 0, hi, unit, right=left + plot_w)
        for k, (name, color, pts, dash) in enumerate(lines):
            svg.polyline([(left + t / t_hi * plot_w, bottom - min(v, hi) / hi * height)
                          for t, v in pts], color, dash=dash,
                         title=f"{name}: median {median(v for _, v in pts):.3g} {unit}"
                         if pts else name)
            ly = top + 4 + k * 14
            if ly < bottom + gap - 10:
                svg.line(left + plot_w + 10, ly, left + plot_w + 26, ly, color, 2, dash)
                svg.text(left + plot_w + 30, ly + 4, name, size=10)
        y = bottom + gap
    for v in nice_ticks(0, t_hi, 8):
        svg.text(left + v / t_hi * plot_w, y - gap + 14, f"{v:g}", size=10, anchor="middle",
                 fill="#666")
    svg.text(left + plot_w / 2, y - gap + 28, "seconds since the start of the run", size=10,
             anchor="middle", fill="#666")
    svg.height = int(y - gap + 36)
    return svg.render()


def all_charts(a: Analysis) -> dict[str, str]:
    return {
        "step-breakdown": step_breakdown(a),
        "step-timeline": step_timeline(a),
        "comm-compute": comm_compute(a),
        "comm-compute-steps": comm_compute_steps(a),
        "straggler-heatmap": straggler_heatmap(a),
        "straggler-scores": straggler_scores(a),
        "utilization": utilization(a),
    }
