"""The report page: one self-contained HTML file (inline CSS and SVG, no scripts, nothing fetched
from the network)."""

from __future__ import annotations

import datetime
import math

from .analysis import Analysis, median, notices, system_usage
from .charts import all_charts, breakdown_categories, breakdown_values
from .profile_reader import number_ranges
from .rules import FIRED, NOT_EVALUATED, QUIET, SUMMARY, Finding
from .svg import esc, fmt_num
from .thresholds import THRESHOLDS

# What each engine counter means (per step). The first group exists today; the second is what the
# report uses when the engine records it (Note [Engine counters in profiles]).
ENGINE_COUNTERS = {
    "collectives": "data collectives executed on this rank",
    "fused_collectives": "of which packed several tensors into the fusion buffer",
    "bytes_reduced": "bytes reduced by allreduce on this rank",
    "buffer_allocations": "fusion or scratch buffer (re)allocations (should be 0 after warm-up)",
    "hierarchical_collectives": "allreduces run host by host",
    "gloo_collectives": "data collectives whose host tensors went over Gloo",
    "cache_ids_sent": "requests sent as response-cache ids (cheap negotiation)",
    "requests_sent": "requests sent to the coordinator in any form",
    "responses": "responses the coordinator issued (rank 0 only)",
    "fused_tensors": "tensors the coordinator fused into shared responses (rank 0 only)",
    "cache_hits": "requests the coordinator answered from its cache (rank 0 only)",
    "stall_warnings": "stall warnings issued (rank 0 only)",
    "allreduce_bytes": "payload bytes of allreduce ops completed on this rank",
    "allgather_bytes": "payload bytes of allgather ops",
    "broadcast_bytes": "payload bytes of broadcast ops",
    "alltoall_bytes": "payload bytes of alltoall ops",
    "reducescatter_bytes": "payload bytes of reducescatter ops",
    "fused_bytes": "bytes carried by fused collectives on this rank",
    "fused_tensors_executed": "tensors carried by fused collectives on this rank",
    "negotiation_ns": "time from submitting ops to receiving their responses, summed over ops",
    "wait_for_slowest_ns": "per op, from the first rank's submission to the last one's, summed (rank 0 only)",
    "collective_ns": "time the engine spent executing collectives",
    "engine_cpu_ns": "CPU time the engine thread used: near collective_ns when it polls while "
                     "waiting for its peers, far less when it sleeps",
    "in_flight_ns": "time at least one of this rank's ops was under way (submitted, not yet "
                    "complete)",
}

CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;margin:0;color:#222;
background:#fafafa}
main{max-width:980px;margin:0 auto;padding:16px 24px 48px}
h1{font-size:24px;margin:16px 0 4px}h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid
#ddd;padding-bottom:4px}h3{font-size:14px;margin:14px 0 6px}
.meta{color:#555;font-size:13px;margin:2px 0}
.finding{border-left:5px solid #999;background:#fff;padding:8px 12px;margin:8px 0;
box-shadow:0 1px 2px rgba(0,0,0,.08)}
.finding.fired{border-color:#d62728}.finding.quiet{border-color:#2ca02c}
.finding.not-evaluated{border-color:#aaa;color:#555}.finding.summary{border-color:#4c78a8}
.notice{background:#fff4e5;border:1px solid #f0b45a;padding:8px 12px;margin:8px 0;font-size:14px}
.finding .status{font-size:11px;text-transform:uppercase;letter-spacing:.05em;font-weight:600}
.fired .status{color:#d62728}.quiet .status{color:#2ca02c}
.finding ul{margin:4px 0 4px 18px;padding:0;font-size:13px}.finding p{margin:4px 0;font-size:14px}
.suggestion{font-size:13px;background:#f3f6fa;padding:6px 8px;margin-top:6px}
.chart{display:block;margin:8px 0;background:#fff;max-width:100%;height:auto}
table{border-collapse:collapse;font-size:12px;background:#fff;margin:8px 0}
th,td{border:1px solid #ddd;padding:3px 6px;text-align:right}th{background:#f0f0f0}
td.l,th.l{text-align:left}.skipped li{font-size:13px}.caption{font-size:12px;color:#555}
"""


def _finding_html(f: Finding, a: Analysis) -> str:
    cls = {FIRED: "fired", QUIET: "quiet", NOT_EVALUATED: "not-evaluated",
           SUMMARY: "summary"}[f.status]
    out = [f'<div class="finding {cls}" id="finding-{esc(f.rule)}">',
           f'<div class="status">{esc(f.status)}</div><h3>{esc(f.title)}</h3>',
           f"<p>{esc(f.summary)}</p>"]
    if f.status == SUMMARY:
        out.append(_usage_table(a))
    elif f.evidence:
        out.append("<ul>" + "".join(f"<li>{esc(e)}</li>" for e in f.evidence) + "</ul>")
    if f.suggestion:
        out.append(f'<div class="suggestion"><b>Suggestion:</b> {esc(f.suggestion)}</div>')
    out.append("</div>")
    return "".join(out)


def _num(v, digits=3) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v:.{digits}g}"


def _rank_table(a: Analysis) -> str:
    names = a.phase_names
    head = ("<tr><th>rank</th><th class=l>host</th><th>steps</th><th>median step ms</th>"
            + "".join(f"<th>{esc(n)} ms</th>" for n in names)
            + "<th>samples/s</th><th>process CPU %</th><th>RSS GB</th><th>GPU %</th></tr>")
    rows = []
    for r, s in sorted(a.ranks.items()):
        rss = s.cpu.get("rss_bytes")
        rows.append(
            f"<tr><td>{r}</td><td class=l>{esc(s.host)}</td><td>{len(s.profile.steps)}</td>"
            f"<td>{_num(s.median_step_ms)}</td>"
            + "".join(f"<td>{_num(s.mean_phase_ms.get(n))}</td>" for n in names)
            + f"<td>{_num(s.samples_per_second)}</td>"
            f"<td>{_num(s.cpu.get('process_cpu_pct'))}</td>"
            f"<td>{_num(rss / 1e9 if rss else None)}</td>"
            f"<td>{_num(median(s.gpu_utilization)) if s.gpu_utilization else '-'}</td></tr>")
    return ("<table><thead>" + head + "</thead><tbody>" + "".join(rows) + "</tbody></table>"
            '<p class="caption">Phase columns: mean exclusive milliseconds per step after the '
            f"{int(a.thresholds['warmup_steps'])} warm-up step(s); CPU and memory: medians of "
            "the samples.</p>")


def _usage_table(a: Analysis) -> str:
    rows = []
    for host, stats in system_usage(a).items():
        for u in stats:
            rows.append(f"<tr><td class=l>{esc(host)}</td><td class=l>{esc(u.metric)}</td>"
                        f"<td class=l>{esc(u.unit)}</td>"
                        + "".join(f"<td>{_num(v)}</td>"
                                  for v in (u.p50, u.p95, u.p99, u.maximum, u.minimum))
                        + f"<td>{u.samples}</td></tr>")
    return ("<table><thead><tr><th class=l>host</th><th class=l>metric</th><th class=l>unit</th>"
            "<th>p50</th><th>p95</th><th>p99</th><th>max</th><th>min</th><th>samples</th></tr>"
            "</thead><tbody>" + "".join(rows) + "</tbody></table>")


def _breakdown_table(a: Analysis) -> str:
    ranks = [r for r in sorted(a.ranks) if a.ranks[r].steps]
    if not ranks:
        return ""
    names = breakdown_categories(a)
    head = ("<tr><th>rank</th><th>steps</th><th>mean step ms</th>"
            + "".join(f"<th>{esc(n)} %</th>" for n in names)
            + "<th>communication ms</th><th>hidden %</th></tr>")
    rows = []
    lower_bound = False
    for r in ranks:
        b = a.ranks[r].breakdown
        values = breakdown_values(a, r)
        hidden = "-" if math.isnan(b.overlap) else f"{100 * b.overlap:.0f}"
        if b.overlap_source == "collective_ns" and hidden != "-":
            hidden, lower_bound = "&ge; " + hidden, True
        flight = f"{b.in_flight_ms / b.steps:.3g}" if b.overlap_source else "-"
        rows.append(f"<tr><td>{r}</td><td>{b.steps}</td><td>{_num(b.step_ms / b.steps)}</td>"
                    + "".join(f"<td>{100 * b.share(v):.1f}</td>" for v in values)
                    + f"<td>{flight}</td><td>{hidden}</td></tr>")
    source = {"in_flight_ns": "the engine's in-flight time (in_flight_ns)",
              "collective_ns": "the engine's execution time (collective_ns), which leaves out "
                               "negotiation: the hidden share is a lower bound"}
    used = sorted({a.ranks[r].breakdown.overlap_source for r in ranks} - {""})
    note = ("Communication time per step: from " + "; ".join(source[u] for u in used) + "."
            if used else "The engine recorded no communication time, so the hidden share is "
            "not known.")
    idle = ("Idle = waiting for input (data) + time no phase covered (unmarked). "
            if a.compute_marked else
            "The program marks no compute phase, so its own work and its idle time are one. ")
    return ("<table><thead>" + head + "</thead><tbody>" + "".join(rows) + "</tbody></table>"
            '<p class="caption">Shares of the steps after warm-up (their total time). Exposed '
            "communication = communication_wait, the time the training thread could not go on; "
            f"hidden = communication that ran while the step did something else. {idle}{note}"
            + (" (&ge;: at least.)" if lower_bound else "") + "</p>")


def _scores_text(a: Analysis) -> str:
    if not a.scores:
        return ""
    low = a.thresholds["straggler_score_low"]
    named = {}
    for k, iv in enumerate(a.scores):
        for r in iv.low:
            named.setdefault(r, []).append(k)
    if not named:
        return (f"<p>No rank scored under {low:g} in any of the {len(a.scores)} intervals of "
                f"{int(a.thresholds['straggler_score_interval_steps'])} steps.</p>")
    items = "".join(
        f"<li>rank {r}: under {low:g} in {len(ks)} of {len(a.scores)} intervals (steps "
        f"{esc(number_ranges(i for k in ks for i in a.scores[k].steps))}), lowest "
        f"{min(a.scores[k].scores[r] for k in ks):.2f}</li>" for r, ks in sorted(named.items()))
    return f"<p>Ranks under {low:g} (threshold straggler_score_low):</p><ul>{items}</ul>"


def _engine_table(a: Analysis) -> str:
    if not a.has_engine and a.has_sample_engine:
        return _sample_engine_table(a)
    if not a.has_engine:
        return ("<p>No engine counters recorded: dtrain was not initialized, or "
                + ("the profile has no steps and its samples carry no engine counters."
                   if not a.run.has_steps else "its steps ran no collective.") + "</p>")
    keys = sorted({k for s in a.ranks.values() for k in s.engine_mean},
                  key=lambda k: (list(ENGINE_COUNTERS).index(k) if k in ENGINE_COUNTERS else 99, k))
    ranks = sorted(a.ranks)
    head = "<tr><th class=l>counter</th>" + "".join(f"<th>rank {r}</th>" for r in ranks) + \
        "<th class=l>meaning</th></tr>"
    rows = []
    for k in keys:
        rows.append(f"<tr><td class=l>{esc(k)}</td>"
                    + "".join(f"<td>{fmt_num(a.ranks[r].engine_mean.get(k, 0.0))}</td>"
                              for r in ranks)
                    + f"<td class=l>{esc(ENGINE_COUNTERS.get(k, ''))}</td></tr>")
    return ("<table><thead>" + head + "</thead><tbody>" + "".join(rows) + "</tbody></table>"
            '<p class="caption">Mean increase per step, from dtrain::engine_stats().</p>')


def _sample_engine_table(a: Analysis) -> str:
    keys = sorted({k for s in a.ranks.values() for k in s.sample_engine_total},
                  key=lambda k: (list(ENGINE_COUNTERS).index(k) if k in ENGINE_COUNTERS else 99, k))
    ranks = sorted(a.ranks)
    head = ("<tr><th class=l>counter</th>"
            + "".join(f"<th>rank {r} total</th><th>per s</th>" for r in ranks)
            + "<th class=l>meaning</th></tr>")
    rows = []
    for k in keys:
        cells = ""
        for r in ranks:
            s = a.ranks[r]
            total = s.sample_engine_total.get(k, 0.0)
            rate = total / s.sample_engine_seconds if s.sample_engine_seconds > 0 else math.nan
            cells += f"<td>{fmt_num(total)}</td><td>{_num(rate)}</td>"
        rows.append(f"<tr><td class=l>{esc(k)}</td>{cells}"
                    f"<td class=l>{esc(ENGINE_COUNTERS.get(k, ''))}</td></tr>")
    return ("<table><thead>" + head + "</thead><tbody>" + "".join(rows) + "</tbody></table>"
            '<p class="caption">From the system samples (no steps): each counter\'s increase '
            "over the sampled time, and per second.</p>")


def _threshold_table(a: Analysis) -> str:
    rows = "".join(
        f"<tr><td class=l>{esc(n)}</td><td>{a.thresholds[n]:g}</td>"
        f"<td>{'' if a.thresholds[n] == t.default else f'(default {t.default:g})'}</td>"
        f"<td class=l>{esc(t.meaning)}</td><td class=l>{esc(t.source)}</td></tr>"
        for n, t in THRESHOLDS.items())
    return ("<table><thead><tr><th class=l>threshold</th><th>value</th><th></th>"
            "<th class=l>meaning</th><th class=l>default from</th></tr></thead><tbody>" + rows
            + "</tbody></table>"
            '<p class="caption">Change them with dtrain-report --threshold NAME=VALUE or '
            "--thresholds FILE.json.</p>")


def summary_line(a: Analysis) -> str:
    run = a.run
    steps = sorted({st.index for s in run.ranks.values() for st in s.steps})
    span = f"steps {steps[0]}-{steps[-1]} ({len(steps)} recorded)" if steps else "no steps"
    hosts = len(run.hosts)
    return (f"{len(run.ranks)} of {run.size} rank(s) on {hosts} host(s), {span}, "
            f"run {run.title}")


def render(a: Analysis, findings: list[Finding]) -> str:
    run = a.run
    first = run.ranks[min(run.ranks)]
    started = first.header.get("start_unix_ms")
    try:
        when = datetime.datetime.fromtimestamp(started / 1e3, datetime.timezone.utc) \
            .strftime("%Y-%m-%d %H:%M:%S UTC")
    except (TypeError, ValueError, OverflowError, OSError):  # absent or out of the calendar
        when = "?"
    gpu = first.gpu
    gpu_text = (f"GPU: {gpu.get('name', '?')}" if gpu.get("available")
                else f"no GPU metrics ({gpu.get('reason', '?')})")
    charts = all_charts(a)
    order = {FIRED: 0, NOT_EVALUATED: 1, QUIET: 2, SUMMARY: 3}
    fired = [f for f in findings if f.status == FIRED]
    parts = [
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">",
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">",
        f"<title>dtrain profile report: {esc(run.source)}</title><style>{CSS}</style></head>",
        "<body><main>",
        f"<h1>dtrain profile report</h1><p class=\"meta\">{esc(run.source)}</p>",
        f"<p class=\"meta\">{esc(summary_line(a))}; started {when}; dtrain "
        f"{esc(first.header.get('dtrain_version', '?'))}; {esc(gpu_text)}</p>",
        "".join(f'<div class="notice">{esc(n)}</div>' for n in notices(a)),
        f"<h2 id=\"findings\">Findings ({len(fired)} of {len(findings)} rules fired)</h2>",
        "".join(_finding_html(f, a) for f in sorted(findings, key=lambda f: order[f.status])),
        "<h2 id=\"step-time\">Step time by phase</h2>",
        '<p class="caption">Each phase is charged its exclusive time (a phase nested in another '
        "counts for itself only); other = time in the step outside every phase.</p>",
        charts["step-breakdown"], charts["step-timeline"],
        "<h2 id=\"communication\">Communication and compute: overlap and idle time</h2>",
        '<p class="caption">Compute = forward + backward + optimizer. Exposed communication is '
        "the time the training thread blocked on gradient exchange (communication_wait); "
        "communication that overlaps the rest of the step costs nothing here.</p>",
        charts["comm-compute"], _breakdown_table(a), charts["comm-compute-steps"],
        "<h2 id=\"stragglers\">Stragglers</h2>",
        '<p class="caption">Each cell: a rank\'s own work in a step (the step minus its '
        "communication wait) divided by the median over ranks for that step. A row that stays "
        "red is a rank the others wait for.</p>",
        charts["straggler-heatmap"],
        "<h3 id=\"straggler-scores\">Straggler scores</h3>",
        '<p class="caption">Per interval of '
        f"{int(a.thresholds['straggler_score_interval_steps'])} steps, each rank's score is the "
        "fastest rank's median own work per step divided by its own (NVIDIA's relative "
        "performance score): 1 for the fastest rank, 0.5 for one twice as slow.</p>",
        charts["straggler-scores"], _scores_text(a),
        "<h2 id=\"utilization\">Utilization over time</h2>",
        '<p class="caption">Process CPU is shown as a share of the whole machine; the dashed '
        "line is the machine's CPU use by every program.</p>",
        charts["utilization"],
        "<h2 id=\"ranks\">Ranks</h2>", _rank_table(a),
        f"<h2 id=\"engine\">Engine counters{' per step' if a.has_engine else ''}</h2>",
        _engine_table(a),
        "<h2 id=\"input\">Input</h2>",
        "<p>Read: " + esc(", ".join(run.ranks[r].name for r in sorted(run.ranks))) + "</p>",
    ]
    if run.skipped:
        parts.append("<p>Skipped or incomplete:</p><ul class=\"skipped\">"
                     + "".join(f"<li>{esc(s)}</li>" for s in run.skipped) + "</ul>")
    else:
        parts.append("<p>Nothing was skipped: every file and line was a valid profile record, "
                     "and every rank closed its profile.</p>")
    outside = {r: p.phases_outside_steps for r, p in run.ranks.items() if p.phases_outside_steps}
    if outside:
        parts.append("<p>Phase scopes outside any step (not charged): "
                     + esc(", ".join(f"rank {r}: {n}" for r, n in sorted(outside.items())))
                     + "</p>")
    parts += ["<h2 id=\"thresholds\">Thresholds</h2>", _threshold_table(a), "</main></body></html>"]
    return "\n".join(parts)
