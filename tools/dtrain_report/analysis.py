"""Figures shared by the rules, the charts and the tables: per-rank summaries over the steps that
count (warm-up left out), steps aligned across ranks, and the sampled metrics."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

from .profile_reader import RankProfile, Run, Step, number_ranges

STANDARD_PHASES = ("data", "forward", "backward", "communication_wait", "optimizer")
COMPUTE_PHASES = ("forward", "backward", "optimizer")
# Engine counters (ns per step) that tell how long communication was under way in a step: the
# union of this rank's ops' lifetimes when the engine records it, else the time the engine thread
# executed collectives, which leaves out negotiation and so is shorter (Note [Overlap]).
IN_FLIGHT_COUNTER = "in_flight_ns"
EXECUTION_COUNTER = "collective_ns"


def _present(values) -> list:
    """The values that are numbers: None and NaN left out (`v == v` is false for NaN only)."""
    return [v for v in values if v is not None and v == v]


def median(values) -> float:
    xs = _present(values)
    xs.sort()
    if not xs:
        return math.nan
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def percentile(values, q: float) -> float:
    xs = _present(values)
    xs.sort()
    if not xs:
        return math.nan
    k = (len(xs) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def mean(values) -> float:
    xs = _present(values)
    return sum(xs) / len(xs) if xs else math.nan


def share(part: float, whole: float) -> float:
    return part / whole if whole > 0 else 0.0


def human_bytes(x: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if x >= scale:
            return f"{x / scale:.3g} {unit}"
    return f"{x:.0f} B"


def step_range(indices) -> str:
    """'12-80' or '12, 15-17' for a sorted list of step indices."""
    indices = sorted(indices)
    if not indices:
        return "none"
    parts, start, prev = [], indices[0], indices[0]
    for i in indices[1:] + [None]:
        if i is not None and i == prev + 1:
            prev = i
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if i is not None:
            start = prev = i
    return ", ".join(parts) if len(parts) <= 4 else f"{indices[0]}-{indices[-1]} ({len(indices)} steps)"


def is_number(v) -> bool:
    if type(v) is float:  # most values: the same answer, sooner
        return math.isfinite(v)
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


# Note [Overlap]
# Holistic Trace Analysis splits a GPU's time into compute, non-compute (communication and memory
# kernels that run alone) and idle, and reports the share of communication time during which
# compute ran too. dtrain times the training thread, not kernels, so the same questions are
# asked of each step: compute is the forward, backward and optimizer phases; exposed
# communication is communication_wait, the time the thread could not go on because an exchange
# had not finished; idle is waiting for input (data) and the time no phase covered (other); user
# phases are reported on their own. Communication that ran while the thread did anything else
# is hidden: per step, hidden = in flight - exposed, where "in flight" is how long at least one
# of the rank's ops was under way (engine counter in_flight_ns). Without that counter the
# engine's execution time (collective_ns) stands in; it leaves out negotiation, so the overlap
# it gives is a lower bound: (c - w) / c <= (f - w) / f when c <= f.
@dataclass
class StepBreakdown:
    """A rank's judged steps, summed: where the time went (Note [Overlap])."""
    steps: int = 0
    step_ms: float = 0.0
    compute_ms: float = 0.0
    exposed_communication_ms: float = 0.0
    data_ms: float = 0.0
    unmarked_ms: float = 0.0  # "other": in the step, outside every phase
    user_phases_ms: float = 0.0
    compute_marked: bool = False  # forward, backward or optimizer seen in the run
    in_flight_ms: float = 0.0
    hidden_ms: float = 0.0
    overlap_source: str = ""  # IN_FLIGHT_COUNTER, EXECUTION_COUNTER, or "" (not recorded)

    def share(self, ms: float) -> float:
        return share(ms, self.step_ms)

    @property
    def idle_ms(self) -> float:
        return self.data_ms + self.unmarked_ms

    @property
    def overlap(self) -> float:
        """The share of communication time hidden behind the rest of the step; NaN when the
        profile says nothing of communication time."""
        if not self.overlap_source or self.in_flight_ms <= 0:
            return math.nan
        return self.hidden_ms / self.in_flight_ms


def breakdown_of(steps: list[Step], compute_marked: bool) -> StepBreakdown:
    b = StepBreakdown(steps=len(steps), compute_marked=compute_marked)
    # The writer leaves out counters that did not move: a step without one ran no collective.
    with_in_flight = any(st.engine and IN_FLIGHT_COUNTER in st.engine for st in steps)
    with_execution = any(st.engine and EXECUTION_COUNTER in st.engine for st in steps)
    b.overlap_source = IN_FLIGHT_COUNTER if with_in_flight else \
        EXECUTION_COUNTER if with_execution else ""
    for st in steps:
        b.step_ms += st.duration_ms
        compute = sum(st.phase(p) for p in COMPUTE_PHASES)
        wait = st.phase("communication_wait")
        b.compute_ms += compute
        b.exposed_communication_ms += wait
        b.data_ms += st.phase("data")
        b.unmarked_ms += st.other_ms
        b.user_phases_ms += sum(v for k, v in st.phases_ms.items() if k not in STANDARD_PHASES)
        if b.overlap_source:
            flight = (st.engine or {}).get(b.overlap_source, 0.0) / 1e6
            b.in_flight_ms += max(flight, wait)  # the wait is communication under way too
            b.hidden_ms += max(0.0, flight - wait)
    return b


@dataclass
class ScoreInterval:
    """Straggler scores for one interval of steps (NVIDIA's relative performance score): per
    rank, the fastest rank's median own work divided by this rank's, so 1 is the fastest."""
    steps: list[int]
    scores: dict[int, float]
    low: list[int]  # ranks under the threshold straggler_score_low


def straggler_scores(a: "Analysis") -> list[ScoreInterval]:
    """Empty when there is nothing to compare: one rank, or no communication_wait phase (every
    rank's synchronous step takes equally long; only the wait tells own work apart)."""
    if len(a.ranks) < 2 or "communication_wait" not in a.has_phase or not a.common_steps:
        return []
    length = int(a.thresholds["straggler_score_interval_steps"])
    steps = a.common_steps
    groups = [steps[i:i + length] for i in range(0, len(steps), length)]
    if len(groups) > 1 and len(groups[-1]) < length / 2:
        tail = groups.pop()  # a short tail would score on a few steps only
        groups[-1] = groups[-1] + tail
    out = []
    for g in groups:
        work = {r: median(a.step_of(r, i).busy_ms for i in g) for r in a.ranks}
        fastest = min(work.values())
        scores = {r: (fastest / w if w > 0 else 1.0) for r, w in work.items()}
        low = sorted(r for r, sc in scores.items() if sc < a.thresholds["straggler_score_low"])
        out.append(ScoreInterval(steps=g, scores=scores, low=low))
    return out


@dataclass
class RankSummary:
    profile: RankProfile
    steps: list[Step]  # the steps the rules judge: warm-up left out
    mean_phase_ms: dict[str, float] = field(default_factory=dict)  # includes "other"
    median_share: dict[str, float] = field(default_factory=dict)
    median_step_ms: float = math.nan
    mean_step_ms: float = math.nan
    samples_per_second: float = math.nan
    engine_mean: dict[str, float] = field(default_factory=dict)
    cpu: dict[str, float] = field(default_factory=dict)   # medians of sampled metrics
    gpu_utilization: list[float] = field(default_factory=list)
    gpu_memory_fraction: list[float] = field(default_factory=list)
    breakdown: StepBreakdown = field(default_factory=StepBreakdown)
    # Engine counters carried by samples (their increase over each sampling period), summed, and
    # the seconds those periods cover: the engine's activity without any step.
    sample_engine_total: dict[str, float] = field(default_factory=dict)
    sample_engine_seconds: float = 0.0

    @property
    def rank(self) -> int:
        return self.profile.rank

    @property
    def host(self) -> str:
        return self.profile.host

    def sampled(self, key: str) -> list[float]:
        return [s[key] for s in self.profile.samples if is_number(s.get(key))]

    @property
    def judged_samples(self) -> list[dict]:
        """The samples the system rules judge: from the first step they judge on (initialization
        and warm-up left out), or all of them in a profile without steps."""
        if not self.steps:
            return [] if self.profile.steps else list(self.profile.samples)
        start = self.steps[0].t
        return [x for x in self.profile.samples if x["t"] >= start]

    def gpu_series(self, key: str, samples: list[dict] | None = None) -> list[tuple[float, float]]:
        """(t, value) of a GPU metric; "memory_pct" is memory in use as a percentage of the
        device's memory."""
        out = []
        for x in self.profile.samples if samples is None else samples:
            g = x.get("gpu")
            if not isinstance(g, dict):
                continue
            if key == "memory_pct":
                used, total = g.get("memory_used_bytes"), g.get("memory_total_bytes")
                if is_number(used) and is_number(total) and total > 0:
                    out.append((x["t"], 100.0 * used / total))
            elif is_number(g.get(key)):
                out.append((x["t"], float(g[key])))
        return out


def _summarize(profile: RankProfile, warmup_steps: int, phase_names: list[str],
               compute_marked: bool) -> RankSummary:
    steps = profile.steps[warmup_steps:]
    s = RankSummary(profile=profile, steps=steps)
    s.breakdown = breakdown_of(steps, compute_marked)
    if steps:
        for name in phase_names:
            s.mean_phase_ms[name] = mean(
                st.other_ms if name == "other" else st.phase(name) for st in steps)
            s.median_share[name] = median(
                share(st.other_ms if name == "other" else st.phase(name), st.duration_ms)
                for st in steps)
        s.median_step_ms = median(st.duration_ms for st in steps)
        s.mean_step_ms = mean(st.duration_ms for st in steps)
        total_samples = sum(st.samples for st in steps)
        total_seconds = sum(st.duration_ms for st in steps) / 1e3
        if total_samples > 0 and total_seconds > 0:
            s.samples_per_second = total_samples / total_seconds
        engine_steps = [st.engine for st in steps if st.engine is not None]
        if engine_steps:
            keys = sorted({k for e in engine_steps for k in e})
            s.engine_mean = {k: mean(e.get(k, 0.0) for e in engine_steps) for k in keys}
    for key in ("process_cpu_pct", "system_cpu_pct", "procs_running", "involuntary_switches_per_s",
                "rss_bytes", "threads", "net_rx_bytes_per_s", "net_tx_bytes_per_s",
                "disk_read_bytes_per_s", "disk_write_bytes_per_s"):
        values = s.sampled(key)
        if values:
            s.cpu[key] = median(values)
    for sample in profile.samples:
        g = sample.get("gpu")
        if not isinstance(g, dict):
            continue
        if is_number(g.get("utilization_pct")):
            s.gpu_utilization.append(float(g["utilization_pct"]))
        used, total = g.get("memory_used_bytes"), g.get("memory_total_bytes")
        if is_number(used) and is_number(total) and total > 0:
            s.gpu_memory_fraction.append(float(used) / float(total))
    previous_t = None
    interval = float(profile.header.get("sample_interval_ms", 500)) / 1e3
    for sample in profile.samples:
        e = sample.get("engine")
        period = sample["t"] - previous_t if previous_t is not None else interval
        previous_t = sample["t"]
        if not isinstance(e, dict):
            continue
        s.sample_engine_seconds += max(period, 0.0)
        for k, v in e.items():
            if is_number(v):
                s.sample_engine_total[str(k)] = s.sample_engine_total.get(str(k), 0.0) + v
    return s


@dataclass
class Analysis:
    run: Run
    thresholds: dict[str, float]
    phase_names: list[str]  # standard phases that ran, then user phases, then "other"
    ranks: dict[int, RankSummary]
    common_steps: list[int]  # step indices every rank recorded (warm-up left out)

    def step_of(self, rank: int, index: int) -> Step | None:
        return self._by_index[rank].get(index)

    # Cached: the charts ask once per step, and the steps do not change after analyze().
    @functools.cached_property
    def has_phase(self) -> set[str]:
        return {p for s in self.ranks.values() for st in s.steps for p in st.phases_ms}

    @property
    def has_gpu(self) -> bool:
        return any(s.gpu_utilization for s in self.ranks.values())

    @property
    def has_engine(self) -> bool:
        return any(s.engine_mean for s in self.ranks.values())

    @property
    def has_sample_engine(self) -> bool:
        return any(s.sample_engine_total for s in self.ranks.values())

    @functools.cached_property
    def compute_marked(self) -> bool:
        return bool(self.has_phase & set(COMPUTE_PHASES))

    scores: list[ScoreInterval] = field(default_factory=list)
    _by_index: dict[int, dict[int, Step]] = field(default_factory=dict, repr=False)


def analyze(run: Run, thresholds: dict[str, float]) -> Analysis:
    warmup = int(thresholds["warmup_steps"])
    seen = {p for prof in run.ranks.values() for st in prof.steps for p in st.phases_ms}
    names = [p for p in STANDARD_PHASES if p in seen]
    names += sorted(seen - set(STANDARD_PHASES))
    names.append("other")
    compute_marked = bool(seen & set(COMPUTE_PHASES))
    ranks = {r: _summarize(p, warmup, names, compute_marked) for r, p in sorted(run.ranks.items())}
    by_index = {r: {st.index: st for st in s.steps} for r, s in ranks.items()}
    common = set.intersection(*(set(d) for d in by_index.values())) if by_index else set()
    a = Analysis(run=run, thresholds=thresholds, phase_names=names, ranks=ranks,
                 common_steps=sorted(common))
    a._by_index = by_index
    a.scores = straggler_scores(a)
    return a


def other_runs_notice(run: Run, most: int = 6) -> str:
    """Which run the report read, and the others it found (Note [Profile layout])."""
    others = list(reversed(run.other_runs))  # newest first
    shown = "; ".join(r.describe() for r in others[:most])
    more = f"; and {len(others) - most} more" if len(others) > most else ""
    return (f"the input holds {len(others) + 1} runs, which are never merged: this report is of "
            f"run {run.title}, {run.chosen}. Not read: {shown}{more}. Choose another with "
            f"--run ID (a run id, a job id or a run's folder) or --attempt N; --list-runs lists "
            f"them")


def notices(a: Analysis) -> list[str]:
    """What a reader must know before trusting the rest: which of several runs it reads, a job
    that did not end cleanly, a profile without steps, steps that mark only their communication
    wait."""
    out = []
    run = a.run
    if run.other_runs:
        out.append(other_runs_notice(run))
    if run.unclosed:
        last = [f"rank {r} at step {run.ranks[r].steps[-1].index}" if run.ranks[r].steps
                else f"rank {r} before any step" for r in run.unclosed]
        out.append(f"the job did not end cleanly: {len(run.unclosed)} of {len(run.ranks)} "
                   f"rank(s) ({number_ranges(run.unclosed)}) wrote no end record, as when a "
                   f"process is killed or crashes; the report covers what was recorded "
                   f"(last: {', '.join(last[:8])}{' ...' if len(last) > 8 else ''})")
    if not run.has_steps:
        out.append("no steps seen: no rank recorded a training step (profiler.step(), or "
                   "DistributedOptimizer::step() in a program profiled without code changes), so "
                   "step times, phases and stragglers are left out; the system samples and the "
                   "engine counters below still cover the run")
    elif a.has_phase <= {"communication_wait"}:
        marked = ("mark only their communication wait" if a.has_phase else
                  "mark no phases, not even their communication wait")
        out.append(f"the steps {marked}: the rest of each step (the rank's own work) is not "
                   f"broken into compute, data and idle time; mark those with "
                   f"profiler.phase(dtrain::Phase::forward) and the like to see them")
    return out


@dataclass
class UsageStats:
    """One metric over a run, as SageMaker Debugger's OverallSystemUsage summarizes it."""
    metric: str
    unit: str
    samples: int
    minimum: float
    p50: float
    p95: float
    p99: float
    maximum: float


def _usage(metric: str, unit: str, values: list[float]) -> UsageStats | None:
    if not values:
        return None
    return UsageStats(metric, unit, len(values), min(values), percentile(values, 0.5),
                      percentile(values, 0.95), percentile(values, 0.99), max(values))


def devices(a: Analysis) -> dict[tuple[str, int], list[int]]:
    """Each GPU that recorded samples, as (host, device index), with the ranks that use it."""
    out: dict[tuple[str, int], list[int]] = {}
    for r, s in sorted(a.ranks.items()):
        g = s.profile.gpu
        if g.get("available") and is_number(g.get("index")) and s.gpu_utilization:
            out.setdefault((s.host, int(g["index"])), []).append(r)
    return out


def system_usage(a: Analysis) -> dict[str, list[UsageStats]]:
    """Per host, over every sample: the machine's CPU, I/O wait, network and disk (read from
    the host's first rank: they are the host's), each rank's CPU and memory and each GPU's
    utilization and memory pooled."""
    out: dict[str, list[UsageStats]] = {}
    gpus = devices(a)
    for host, ranks in a.run.hosts.items():
        first = a.ranks[ranks[0]]
        stats = [
            _usage("machine CPU", "%", first.sampled("system_cpu_pct")),
            _usage("I/O wait", "%", first.sampled("system_iowait_pct")),
            _usage("ranks' CPU (each)", "% of a core",
                   [v for r in ranks for v in a.ranks[r].sampled("process_cpu_pct")]),
            _usage("ranks' resident memory (each)", "GB",
                   [v / 1e9 for r in ranks for v in a.ranks[r].sampled("rss_bytes")]),
            _usage("GPU utilization (each GPU)", "%",
                   [v for (h, _), rs in gpus.items() if h == host
                    for _, v in a.ranks[rs[0]].gpu_series("utilization_pct")]),
            _usage("GPU memory in use (each GPU)", "% of the device",
                   [v for (h, _), rs in gpus.items() if h == host
                    for _, v in a.ranks[rs[0]].gpu_series("memory_pct")]),
            _usage("network in", "MB/s", [v / 1e6 for v in first.sampled("net_rx_bytes_per_s")]),
            _usage("network out", "MB/s", [v / 1e6 for v in first.sampled("net_tx_bytes_per_s")]),
            _usage("disk read", "MB/s", [v / 1e6 for v in first.sampled("disk_read_bytes_per_s")]),
            _usage("disk write", "MB/s",
                   [v / 1e6 for v in first.sampled("disk_write_bytes_per_s")]),
        ]
        out[host] = [x for x in stats if x is not None]
    return out
