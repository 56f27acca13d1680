"""Figures shared by the rules, the charts and the tables: per-rank summaries over the steps that
count (warm-up left out), steps aligned across ranks, and the sampled metrics."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .profile_reader import RankProfile, Run, Step

STANDARD_PHASES = ("data", "forward", "backward", "communication_wait", "optimizer")
COMPUTE_PHASES = ("forward", "backward", "optimizer")


def median(values) -> float:
    xs = sorted(v for v in values if v is not None and not math.isnan(v))
    if not xs:
        return math.nan
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def percentile(values, q: float) -> float:
    xs = sorted(v for v in values if v is not None and not math.isnan(v))
    if not xs:
        return math.nan
    k = (len(xs) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def mean(values) -> float:
    xs = [v for v in values if v is not None and not math.isnan(v)]
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

    @property
    def rank(self) -> int:
        return self.profile.rank

    @property
    def host(self) -> str:
        return self.profile.host

    def sampled(self, key: str) -> list[float]:
        return [s[key] for s in self.profile.samples
                if isinstance(s.get(key), (int, float)) and not isinstance(s.get(key), bool)]


def _summarize(profile: RankProfile, warmup_steps: int, phase_names: list[str]) -> RankSummary:
    steps = profile.steps[warmup_steps:]
    s = RankSummary(profile=profile, steps=steps)
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
        if isinstance(g.get("utilization_pct"), (int, float)):
            s.gpu_utilization.append(float(g["utilization_pct"]))
        used, total = g.get("memory_used_bytes"), g.get("memory_total_bytes")
        if isinstance(used, (int, float)) and isinstance(total, (int, float)) and total > 0:
            s.gpu_memory_fraction.append(float(used) / float(total))
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

    @property
    def has_phase(self) -> set[str]:
        return {p for s in self.ranks.values() for st in s.steps for p in st.phases_ms}

    @property
    def has_gpu(self) -> bool:
        return any(s.gpu_utilization for s in self.ranks.values())

    @property
    def has_engine(self) -> bool:
        return any(s.engine_mean for s in self.ranks.values())

    _by_index: dict[int, dict[int, Step]] = field(default_factory=dict, repr=False)


def analyze(run: Run, thresholds: dict[str, float]) -> Analysis:
    warmup = int(thresholds["warmup_steps"])
    seen = {p for prof in run.ranks.values() for st in prof.steps for p in st.phases_ms}
    names = [p for p in STANDARD_PHASES if p in seen]
    names += sorted(seen - set(STANDARD_PHASES))
    names.append("other")
    ranks = {r: _summarize(p, warmup, names) for r, p in sorted(run.ranks.items())}
    by_index = {r: {st.index: st for st in s.steps} for r, s in ranks.items()}
    common = set.intersection(*(set(d) for d in by_index.values())) if by_index else set()
    a = Analysis(run=run, thresholds=thresholds, phase_names=names, ranks=ranks,
                 common_steps=sorted(common))
    a._by_index = by_index
    return a
